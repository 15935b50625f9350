package drivers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// Prefix is the DNS subdomain of the built-in drivers' names.
const Prefix = "lifecycle-agent.x-k8s.io/"

// ErrBadParameter marks a parameter the driver refuses; the event fails with it.
var ErrBadParameter = errors.New("drivers: bad parameter")

// ErrUndecidable, from a Step's Done, says that a replay cannot tell
// whether the step took effect and must not run it again blindly: the
// engine fails the step with the error's message (any other error from
// Done runs the step again).
var ErrUndecidable = errors.New("cannot tell whether the step took effect")

// Driver is one transition the agent can perform.
type Driver interface {
	// Name is the full driver name, e.g. lifecycle-agent.x-k8s.io/drain.
	Name() string
	// Short is the name's last part, e.g. drain; it names the published
	// transition <node>-<short>.
	Short() string
	// Start and End are the transition's states; SLA its default deadline.
	Start() string
	End() string
	SLA() time.Duration
	// Plan validates params and returns the steps.
	Plan(params map[string]string) ([]Step, error)
}

// Step is one journaled step of a transition.
type Step struct {
	Name       string
	NeedsAPI   bool
	Disruptive bool
	Run        func(ctx context.Context, rt Runtime) error
	// Done, when set, tells a replay whether a step whose intent was
	// committed already took effect (intentBootID is the boot ID recorded
	// with the intent).
	Done func(ctx context.Context, rt Runtime, intentBootID string) (bool, error)
	// Cordons marks the drain's cordon step (cordonStep): when it ends
	// without owning the node's cordon (the node was cordoned already) the
	// engine records CordonNotOurs as its message.
	Cordons bool
	// UncordonsOwn marks the step that lifts this event's own cordon and
	// only that one (not the uncordon driver's, which lifts any of the
	// agent's): an event with one gives the node back only if its cordon
	// step made the cordon (see CordonNotOurs), and the Node's conditions
	// say back in service only then.
	UncordonsOwn bool
}

// CordonLeft is what an UncordonsOwn step reports when its event owns no
// cordon: the node's schedulability is left as it was.
const CordonLeft = "no cordon of this event to lift; the node's schedulability is left as it is"

// CordonNotOurs is the message the engine records on a cordon step that
// found the node cordoned already (an earlier drain event's cordon, an
// admin's): the event does not own it and its uncordon leaves it.
const CordonNotOurs = "the node was cordoned already: not this event's cordon, left in place at its end"

// Change is something the agent did and must undo if the event is aborted.
type Change struct {
	Kind string // "cordon"
	Key  string // e.g. the node name
}

// Runtime is what a step may use.
type Runtime interface {
	EventName() string
	Node() string
	BootID() string
	// Progress sets the event's status message.
	Progress(msg string)
	// Own records a change to undo before making it; Disown after undoing.
	Own(c Change) error
	Disown(c Change) error
	Owns(c Change) bool
	// API verbs for this node.
	API() NodeAPI
	// Host verbs: real, or simulated (logged and journaled, not performed)
	// under host.mode=simulate.
	Host() HostOps
	// Params are the event's parameters (already validated by Plan), as
	// the driver's Resolve fixed them at claim for a Resolver.
	Params() map[string]string
	// StepStarted is when the running step first began: the time of its
	// first intent record in the journal (committed before its first Run),
	// the same on every later attempt, after a restart of the agent or a
	// reboot of the host. A step bounds its own wait from it, so a crash
	// does not restart the bound (Readiness). The zero time when unknown.
	StepStarted() time.Time
}

// HostOps are the host actions drivers may take. The agent provides a real
// implementation (logind over D-Bus, systemd-run, /proc) and a simulated one.
type HostOps interface {
	// BootID is the current boot ID (/proc/sys/kernel/random/boot_id).
	BootID() string
	// BootTime is when the current boot began, on this host's clock (the
	// kubelet's): /proc/stat btime. The zero time when unknown. Simulated:
	// the real host's, since a simulated reboot restarts nothing.
	BootTime() time.Time
	// Reboot asks logind to reboot, after releasing the agent's own
	// inhibitor locks. In simulate mode the boot ID changes instead.
	Reboot(ctx context.Context) error
	// OSRelease returns /etc/os-release VERSION_ID and the kernel release.
	OSRelease() (versionID, kernel string, err error)
	// RebootRequired reports whether /run/reboot-required exists.
	RebootRequired() bool
	// RunTransient runs argv in a transient systemd unit named unit (so a
	// package upgrade that restarts the agent cannot kill it) and waits.
	RunTransient(ctx context.Context, unit string, argv []string, env []string, timeout time.Duration) error
	// Run runs argv as the agent's child with a timeout; its error carries the output.
	Run(ctx context.Context, argv []string, env []string, timeout time.Duration) (stdout string, err error)
	// Inhibit takes a logind block inhibitor on what ("shutdown:sleep") for
	// the duration of a critical step; release it with the returned func.
	Inhibit(ctx context.Context, what, why string) (release func(), err error)
	// UnitActive reports whether a systemd unit (a transient one of
	// RunTransient, after a cancel or a restart) is still active.
	UnitActive(ctx context.Context, unit string) (bool, error)
	// StopUnits and StartUnits stop and start systemd units (GPU services).
	StopUnits(ctx context.Context, units ...string) error
	StartUnits(ctx context.Context, units ...string) error
	// Simulated reports whether host actions are only simulated.
	Simulated() bool
}

// NodeAPI is the subset of the API client the built-in drivers use.
type NodeAPI interface {
	Cordon(ctx context.Context, owner string) (bool, error)
	Uncordon(ctx context.Context, owner string, force bool) (bool, error)
	CordonOwner(ctx context.Context) (owner string, cordoned bool, err error)
	Drain(ctx context.Context, o apiclient.DrainOptions) (apiclient.DrainResult, error)
	PodsLeft(ctx context.Context, o apiclient.DrainOptions) ([]string, error)
	// NodeReady: the kubelet reports the Node Ready in the boot bootID
	// (apiclient.Client.NodeReady).
	NodeReady(ctx context.Context, bootID string) (bool, error)
}

// ResolvedPrefix begins every plan key a Resolver fixes at claim
// (ResolvedReadiness, gpu-reset's GPUs): reserved, refused in an event's
// parameters, and what the engine copies onto the event beside the
// finalizer.
const ResolvedPrefix = "resolved."

// Resolver drivers turn an event's parameters into a fixed plan once, at
// claim, against the live host (gpu-reset: gpus=all becomes the UUIDs seen
// then). The engine journals the returned map with the event and, on every
// replay, passes it — not the original parameters — to Plan and to
// Runtime.Params, so a replay never re-resolves against a host that changed
// in between (a GPU that fell off the bus, a profile edited in the config).
// An error fails the event before any step runs, with the error as message.
type Resolver interface {
	Resolve(ctx context.Context, params map[string]string) (map[string]string, error)
}

// Abortable drivers undo their owned changes themselves on abort; others
// get the default: the engine uncordons a cordon it owns.
type Abortable interface {
	Abort(ctx context.Context, rt Runtime) error
}

// params is a small checked reader over an event's parameters.
type params struct {
	m     map[string]string
	known map[string]bool
	errs  []error
}

func newParams(m map[string]string, known ...string) *params {
	p := &params{m: m, known: map[string]bool{}}
	for _, k := range known {
		p.known[k] = true
	}
	for k := range m {
		if !p.known[k] {
			p.errs = append(p.errs, fmt.Errorf("%w: unknown parameter %q (known: %v)", ErrBadParameter, k, known))
		}
	}
	return p
}

func (p *params) bool(k string, def bool) bool {
	v, ok := p.m[k]
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%w: parameters.%s: %q is not true or false", ErrBadParameter, k, v))
	}
	return b
}

func (p *params) int(k string, def, min, max int) int {
	v, ok := p.m[k]
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min || n > max {
		p.errs = append(p.errs, fmt.Errorf("%w: parameters.%s: %q is not an integer from %d to %d", ErrBadParameter, k, v, min, max))
	}
	return n
}

func (p *params) str(k, def string) string {
	if v, ok := p.m[k]; ok {
		return v
	}
	return def
}

func (p *params) err() error { return errors.Join(p.errs...) }
