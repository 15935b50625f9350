package drivers

import (
	"context"
	"fmt"
	corev1 "k8s.io/api/core/v1"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// This file holds the package's hand-written recording fakes (STYLE rule
// 16): a Runtime, a NodeAPI and a HostOps that share one ordered call log,
// so a test can assert what a driver did, in which order.

// recorder is the ordered call log shared by the fakes.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) add(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf(format, a...))
}

// list returns the calls with consecutive repeats (polls) collapsed.
func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Compact(slices.Clone(r.calls))
}

func (r *recorder) count(call string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if c == call {
			n++
		}
	}
	return n
}

// fakeCmd is one recorded Run or RunTransient.
type fakeCmd struct {
	unit    string
	argv    []string
	env     []string
	timeout time.Duration
}

// exitErr is what a real HostOps.Run returns for a command that exited
// non-zero: it carries the status and the output.
type exitErr struct {
	status int
	stderr string
}

func (e *exitErr) Error() string {
	return fmt.Sprintf("exit code %d; stderr: %s", e.status, e.stderr)
}
func (e *exitErr) ExitStatus() int { return e.status }

// fakeHost is a recording HostOps.
type fakeHost struct {
	rec *recorder

	// activeFor: UnitActive answers true this many times; unitErr: it fails.
	activeFor int
	unitErr   error

	mu     sync.Mutex
	bootID string
	boots  int
	// rebootChangesBoot: an accepted Reboot makes a new boot ID at once,
	// as in simulate mode (a real agent is stopped by the shutdown).
	rebootChangesBoot bool
	// rebootErrs are returned by successive Reboot calls; past the end,
	// Reboot is accepted.
	rebootErrs []error
	// bootChangeAfter, when > 0, makes the boot ID change on that BootID
	// call: somebody else (a provisioning pipeline) rebooted the node.
	bootChangeAfter int
	bootIDCalls     int
	// version and kernel are what OSRelease reports; on a new boot they
	// become nextVersion and nextKernel when those are set.
	version, kernel         string
	nextVersion, nextKernel string
	osErr                   error
	rebootRequired          bool
	simulated               bool
	// bootTime answers BootTime; the zero time (unknown) by default.
	bootTime time.Time
	// run answers Run; nil means success with no output.
	run          func(argv, env []string) (string, error)
	transientErr error
	inhibitErr   error
	held         int // block locks held now
	runs         []fakeCmd
	transients   []fakeCmd
}

var _ HostOps = (*fakeHost)(nil)

func (h *fakeHost) newBootLocked() {
	h.boots++
	h.bootID = fmt.Sprintf("boot-%d", h.boots+1)
	if h.nextVersion != "" {
		h.version = h.nextVersion
	}
	if h.nextKernel != "" {
		h.kernel = h.nextKernel
	}
}

func (h *fakeHost) BootID() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bootIDCalls++
	if h.bootChangeAfter > 0 && h.bootIDCalls == h.bootChangeAfter {
		h.newBootLocked()
	}
	return h.bootID
}

func (h *fakeHost) BootTime() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bootTime
}

func (h *fakeHost) Reboot(ctx context.Context) error {
	h.rec.add("host.Reboot")
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.rebootErrs) > 0 {
		err := h.rebootErrs[0]
		h.rebootErrs = h.rebootErrs[1:]
		if err != nil {
			return err
		}
	}
	if h.rebootChangesBoot {
		h.newBootLocked()
	}
	return nil
}

func (h *fakeHost) OSRelease() (string, string, error) {
	h.rec.add("host.OSRelease")
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.version, h.kernel, h.osErr
}

func (h *fakeHost) RebootRequired() bool {
	h.rec.add("host.RebootRequired")
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rebootRequired
}

func (h *fakeHost) RunTransient(ctx context.Context, unit string, argv, env []string, timeout time.Duration) error {
	h.rec.add("host.RunTransient %s %s", unit, strings.Join(argv, " "))
	h.mu.Lock()
	defer h.mu.Unlock()
	h.transients = append(h.transients, fakeCmd{unit: unit, argv: argv, env: env, timeout: timeout})
	return h.transientErr
}

func (h *fakeHost) Run(ctx context.Context, argv, env []string, timeout time.Duration) (string, error) {
	h.rec.add("host.Run %s", strings.Join(argv, " "))
	h.mu.Lock()
	h.runs = append(h.runs, fakeCmd{argv: argv, env: env, timeout: timeout})
	run := h.run
	h.mu.Unlock()
	if run == nil {
		return "", nil
	}
	return run(argv, env)
}

func (h *fakeHost) Inhibit(ctx context.Context, what, why string) (func(), error) {
	h.rec.add("host.Inhibit %s", what)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inhibitErr != nil {
		return nil, h.inhibitErr
	}
	h.held++
	var once sync.Once
	return func() {
		once.Do(func() {
			h.rec.add("host.Release %s", what)
			h.mu.Lock()
			h.held--
			h.mu.Unlock()
		})
	}, nil
}

func (h *fakeHost) StopUnits(ctx context.Context, units ...string) error {
	h.rec.add("host.StopUnits %s", strings.Join(units, " "))
	return nil
}

func (h *fakeHost) StartUnits(ctx context.Context, units ...string) error {
	h.rec.add("host.StartUnits %s", strings.Join(units, " "))
	return nil
}

func (h *fakeHost) Simulated() bool { return h.simulated }

// UnitActive answers true for the first activeFor calls about a unit (a
// transient unit still running after a cancel), then false.
func (h *fakeHost) UnitActive(ctx context.Context, unit string) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rec.add("host.UnitActive %s", unit)
	if h.unitErr != nil {
		return false, h.unitErr
	}
	if h.activeFor > 0 {
		h.activeFor--
		return true, nil
	}
	return false, nil
}

// fakeAPI is a recording NodeAPI with apiclient's cordon semantics: the
// cordon's owner is an annotation; a cordon without one is someone else's.
type fakeAPI struct {
	rec *recorder

	mu          sync.Mutex
	cordoned    bool
	cordonOwner string // the ownership annotation; "" with cordoned: someone else's
	// readyAfter: NodeReady answers true from that call on; 0: never.
	readyAfter int
	readyCalls int
	readyErr   error
	drainErr   error
	podsLeft   []string
}

var _ NodeAPI = (*fakeAPI)(nil)

func (a *fakeAPI) Cordon(ctx context.Context, owner string) (bool, error) {
	a.rec.add("api.Cordon %s", owner)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cordoned {
		// As apiclient.Cordon: ours only when the annotation names this
		// owner; a cordon for another event of ours is not this one's.
		return a.cordonOwner == owner, nil
	}
	a.cordoned, a.cordonOwner = true, owner
	return true, nil
}

func (a *fakeAPI) Uncordon(ctx context.Context, owner string, force bool) (bool, error) {
	a.rec.add("api.Uncordon %s force=%t", owner, force)
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.cordoned {
		return false, nil
	}
	if !force && (a.cordonOwner == "" || owner != "" && a.cordonOwner != owner) {
		return false, apiclient.ErrCordonNotOurs
	}
	a.cordoned, a.cordonOwner = false, ""
	return true, nil
}

func (a *fakeAPI) CordonOwner(ctx context.Context) (string, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cordonOwner, a.cordoned, nil
}

func (a *fakeAPI) Drain(ctx context.Context, o apiclient.DrainOptions) (apiclient.DrainResult, error) {
	a.rec.add("api.Drain")
	a.mu.Lock()
	defer a.mu.Unlock()
	return apiclient.DrainResult{Evicted: []string{"default/web-0"}}, a.drainErr
}

func (a *fakeAPI) PodsLeft(ctx context.Context, o apiclient.DrainOptions) ([]string, error) {
	a.rec.add("api.PodsLeft")
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.podsLeft, nil
}

func (a *fakeAPI) NodeReady(ctx context.Context, bootID string) (bool, error) {
	a.rec.add("api.NodeReady")
	a.mu.Lock()
	defer a.mu.Unlock()
	a.readyCalls++
	if a.readyErr != nil {
		return false, a.readyErr
	}
	return a.readyAfter > 0 && a.readyCalls >= a.readyAfter, nil
}

// fakeRuntime is a recording Runtime; Own/Disown keep the owned changes as
// the engine's journal would.
type fakeRuntime struct {
	rec    *recorder
	event  string
	node   string
	params map[string]string
	host   *fakeHost
	api    *fakeAPI

	mu       sync.Mutex
	owned    map[Change]bool
	progress []string
	// started is what StepStarted answers: as the engine's journal, it is
	// kept across runs of a step (a restart); zero by default.
	started time.Time
}

var _ Runtime = (*fakeRuntime)(nil)

// newFake returns a runtime for event ev-1 on node-a, boot ID boot-1, a
// Ready node that is not cordoned, and an OS at version 12, kernel 6.1.0.
func newFake() *fakeRuntime {
	rec := &recorder{}
	return &fakeRuntime{
		rec:   rec,
		event: "ev-1",
		node:  "node-a",
		host:  &fakeHost{rec: rec, bootID: "boot-1", version: "12", kernel: "6.1.0"},
		api:   &fakeAPI{rec: rec, readyAfter: 1},
		owned: map[Change]bool{},
	}
}

func (r *fakeRuntime) EventName() string         { return r.event }
func (r *fakeRuntime) Node() string              { return r.node }
func (r *fakeRuntime) BootID() string            { return r.host.BootID() }
func (r *fakeRuntime) API() NodeAPI              { return r.api }
func (r *fakeRuntime) Host() HostOps             { return r.host }
func (r *fakeRuntime) Params() map[string]string { return r.params }

func (r *fakeRuntime) StepStarted() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started
}

func (r *fakeRuntime) Progress(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progress = append(r.progress, msg)
}

func (r *fakeRuntime) Own(c Change) error {
	r.rec.add("rt.Own %s/%s", c.Kind, c.Key)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.owned[c] = true
	return nil
}

func (r *fakeRuntime) Disown(c Change) error {
	r.rec.add("rt.Disown %s/%s", c.Kind, c.Key)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.owned, c)
	return nil
}

func (r *fakeRuntime) Owns(c Change) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owned[c]
}

// progressed reports whether some progress message contains sub.
func (r *fakeRuntime) progressed(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.progress {
		if strings.Contains(p, sub) {
			return true
		}
	}
	return false
}

func (r *fakeRuntime) allProgress() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.progress, "\n")
}

// runSteps plays the engine for a test: the steps in order, stopping at
// the first error, which is returned with the failing step's name.
func runSteps(t *testing.T, steps []Step, rt Runtime) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range steps {
		if err := s.Run(ctx, rt); err != nil {
			return s.Name, err
		}
	}
	return "", nil
}

func stepNames(steps []Step) []string {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.Name
	}
	return names
}

// fastReboot is a RebootConfig that polls every millisecond; its bounds
// are generous, so that a condition that holds after a few polls holds on
// a loaded machine too.
func fastReboot() RebootConfig {
	return RebootConfig{
		ReadyTimeout: 10 * time.Second,
		RebootWait:   10 * time.Second,
		RetryDelay:   time.Millisecond,
		PollInterval: time.Millisecond,
	}
}

// shortWaits is fastReboot with bounds of milliseconds, for the tests that
// run into them.
func shortWaits() RebootConfig {
	c := fastReboot()
	c.ReadyTimeout, c.RebootWait = 50*time.Millisecond, 20*time.Millisecond
	return c
}

// GetNode and NodePods: a Node with nothing allocatable and no pods, so
// the readiness checks find nothing missing (their own tests are in
// readiness_test.go against the real API server).
func (a *fakeAPI) GetNode(context.Context) (*corev1.Node, error) {
	return &corev1.Node{}, nil
}

func (a *fakeAPI) NodePods(context.Context) ([]corev1.Pod, error) { return nil, nil }
