package drivers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// Defaults applied to zero RebootConfig fields.
const (
	// DefaultReadyTimeout is reboot.readyTimeout's default.
	DefaultReadyTimeout = 10 * time.Minute
	// DefaultRebootWait is how long a reboot step waits for a new boot ID
	// after logind accepted a reboot request, before it asks again. The
	// real agent is stopped by the shutdown long before; in simulate mode
	// the boot ID changes at once.
	DefaultRebootWait = 5 * time.Minute
	// DefaultRebootRetryDelay is the pause after logind refused a reboot
	// request, before the next one.
	DefaultRebootRetryDelay = 10 * time.Second
	// DefaultPollInterval is how often a wait looks at the boot ID or the
	// Node's Ready condition.
	DefaultPollInterval = time.Second
	// DefaultRebootAttempts is parameters.rebootAttempts' default.
	DefaultRebootAttempts = 3
	// MaxRebootAttempts bounds parameters.rebootAttempts.
	MaxRebootAttempts = 10
)

// RebootConfig times the reboot, Ready and boot-ID waits shared by the
// reboot and os-upgrade drivers. The zero value uses the defaults above and
// the real clock.
type RebootConfig struct {
	// ReadyTimeout bounds the wait for the kubelet's Ready condition after
	// the reboot (config reboot.readyTimeout). Zero: DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// RebootWait is how long to wait for the boot ID to change after one
	// accepted reboot request. Zero: DefaultRebootWait.
	RebootWait time.Duration
	// RetryDelay is the pause after a refused reboot request. Zero:
	// DefaultRebootRetryDelay.
	RetryDelay time.Duration
	// PollInterval paces the waits. Zero: DefaultPollInterval.
	PollInterval time.Duration
	// DrainRetryDelay is the drain's wait between PDB-refused evictions
	// (config drain.evictRetryDelay).
	DrainRetryDelay time.Duration
	// DrainTimeout bounds the drain's evictions (config drain.timeout).
	DrainTimeout time.Duration
	// Clock times every wait; nil means the real clock. Nothing here sleeps.
	Clock clock.Clock
	// Readiness is the checks between wait-ready and the uncordon
	// (readiness.*), with the snapshot Resolve takes at claim.
	Readiness Readiness
}

func (c RebootConfig) clock() clock.Clock {
	if c.Clock == nil {
		return clock.RealClock{}
	}
	return c.Clock
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Reboot is lifecycle-agent.x-k8s.io/reboot: RebootStarted → RebootComplete.
//
// Steps:
//   - cordon, evict, wait-empty: the drain (DrainSteps), unless drain=false.
//     The cordon is owned (journaled) before it is made; a node someone
//     else had cordoned is left to them.
//   - reboot: asks logind to reboot (HostOps.Reboot, which first releases
//     the agent's own inhibitor locks) and waits until the boot ID differs
//     from the one at the step's start. The engine records the boot ID with
//     the step's intent; after the boot, a replay finds a new boot ID and
//     counts the step done (Step.Done). The same boot ID means the reboot
//     did not happen: the step asks again, up to rebootAttempts times, each
//     request followed by a bounded wait, then fails.
//   - wait-ready: waits, bounded by reboot.readyTimeout, for the kubelet to
//     report the Node Ready (unless waitForReady=false).
//   - wait-workloads-ready: the readiness checks (package readiness)
//     against the snapshot taken at claim, bounded by readiness.timeout
//     (unless waitForReady=false).
//   - uncordon: lifts the cordon this event made, and only that one.
//
// Parameters:
//
//	drain               bool, default true: drain before the reboot
//	gracePeriodSeconds  drain: -1..86400, default -1 (the pods' own)
//	deleteEmptyDirData  drain: bool, default false
//	podSelector         drain: label selector of the pods to evict
//	waitForReady        bool, default true: wait for the Node to be Ready
//	                    and for its workloads (the readiness checks)
//	readinessChecks     none, or a list of daemonsets, resources,
//	                    conditions, command: the readiness checks to run
//	rebootAttempts      1..10, default 3: reboot requests before failing
//
// Undone on abort (the engine's default): the cordon, if this event made it.
//
// Failure modes: a drain that cannot finish (PDBs) runs into the event's
// sla; logind refusing every request fails with its last D-Bus error; a
// boot ID unchanged after every request fails with "the node did not
// reboot"; a Node not Ready within reboot.readyTimeout fails and names the
// timeout (while the API server is unreachable the engine retries the step
// until the sla instead).
type Reboot struct {
	RebootConfig
}

func (Reboot) Name() string       { return Prefix + "reboot" }
func (Reboot) Short() string      { return "reboot" }
func (Reboot) Start() string      { return "RebootStarted" }
func (Reboot) End() string        { return "RebootComplete" }
func (Reboot) SLA() time.Duration { return 2 * time.Hour }

// rebootParams are the reboot driver's own parameters (besides the drain's).
var rebootParams = []string{"drain", "waitForReady", "rebootAttempts"}

// Resolve implements Resolver: the readiness snapshot at claim.
func (d Reboot) Resolve(ctx context.Context, params map[string]string) (map[string]string, error) {
	return d.Readiness.resolve(ctx, params, nil)
}

func (d Reboot) Plan(m map[string]string) ([]Step, error) {
	o, err := DrainOptionsFrom(m, DrainTiming{d.DrainRetryDelay, d.DrainTimeout}, append(rebootParams, d.Readiness.params()...)...)
	if err != nil {
		return nil, err
	}
	if err := d.Readiness.validate(m); err != nil {
		return nil, err
	}
	p := newParams(pick(m, rebootParams...), rebootParams...)
	drain := p.bool("drain", true)
	waitReady := p.bool("waitForReady", true)
	attempts := p.int("rebootAttempts", DefaultRebootAttempts, 1, MaxRebootAttempts)
	if !drain {
		for _, k := range []string{"gracePeriodSeconds", "deleteEmptyDirData", "podSelector"} {
			if _, ok := m[k]; ok {
				p.errs = append(p.errs, fmt.Errorf("%w: parameters.%s applies only to a drain, and parameters.drain is false", ErrBadParameter, k))
			}
		}
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	var steps []Step
	if drain {
		steps = append(steps, DrainSteps(o)...)
	}
	steps = append(steps, d.rebootStep("reboot", attempts, nil))
	if waitReady {
		steps = append(steps, d.readyStep(), d.Readiness.step())
	}
	return append(steps, uncordonOursStep()), nil
}

// pick returns the entries of m named by keys.
func pick(m map[string]string, keys ...string) map[string]string {
	out := map[string]string{}
	for _, k := range keys {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	return out
}

// BootChanged is the Done check of every step that ends with a reboot: the
// step took effect when the current boot ID differs from the one the
// engine journaled with the step's intent. An intent without a boot ID
// proves nothing, so the step runs again.
func BootChanged(_ context.Context, rt Runtime, intentBootID string) (bool, error) {
	if intentBootID == "" {
		return false, nil
	}
	return rt.Host().BootID() != intentBootID, nil
}

// rebootStep asks logind to reboot and waits for a new boot ID. need, when
// set, decides at run time whether a reboot is wanted at all (os-upgrade's
// rebootPolicy if-required); when it says no, the step ends with its reason.
func (c RebootConfig) rebootStep(name string, attempts int, need func(Runtime) (bool, string)) Step {
	return Step{
		Name:       name,
		Disruptive: true,
		Run: func(ctx context.Context, rt Runtime) error {
			if need != nil {
				if ok, why := need(rt); !ok {
					rt.Progress(why)
					return nil
				}
			}
			return c.reboot(ctx, rt, attempts)
		},
		Done: BootChanged,
	}
}

// reboot requests a reboot up to attempts times. After an accepted request
// it waits RebootWait for the boot ID to change (the real agent is stopped
// by the shutdown during that wait and resumes, after the boot, through
// BootChanged); after a refused one it waits RetryDelay.
func (c RebootConfig) reboot(ctx context.Context, rt Runtime, attempts int) error {
	h := rt.Host()
	before := h.BootID()
	wait := orDefault(c.RebootWait, DefaultRebootWait)
	var refused []error
	for i := 1; i <= attempts; i++ {
		rt.Progress(fmt.Sprintf("asking logind to reboot (request %d of %d; boot ID before: %s)", i, attempts, before))
		if err := h.Reboot(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			refused = append(refused, err)
			rt.Progress(fmt.Sprintf("reboot request %d of %d refused: %v", i, attempts, err))
			if i < attempts {
				if _, err := c.waitFor(ctx, orDefault(c.RetryDelay, DefaultRebootRetryDelay), nil); err != nil {
					return err
				}
			}
			continue
		}
		changed, err := c.waitFor(ctx, wait, func() bool { return h.BootID() != before })
		if err != nil {
			return err
		}
		if changed {
			rt.Progress(fmt.Sprintf("rebooted: boot ID %s → %s", before, h.BootID()))
			return nil
		}
		rt.Progress(fmt.Sprintf("boot ID still %s, %s after reboot request %d of %d", before, wait, i, attempts))
	}
	if len(refused) == attempts {
		return fmt.Errorf("logind refused all %d reboot requests; last error: %w", attempts, refused[len(refused)-1])
	}
	msg := fmt.Sprintf("the node did not reboot: boot ID is still %s after %d reboot requests (each followed by a %s wait)", before, attempts, wait)
	if len(refused) > 0 {
		msg += fmt.Sprintf("; %d of them refused by logind, last: %v", len(refused), refused[len(refused)-1])
	}
	return errors.New(msg + "; look at journalctl -u systemd-logind for what held it up")
}

// waitFor polls cond every PollInterval until it holds (true), d passes
// (cond's last answer) or ctx ends (ctx's error). A nil cond just waits d.
func (c RebootConfig) waitFor(ctx context.Context, d time.Duration, cond func() bool) (bool, error) {
	clk := c.clock()
	timer := clk.NewTimer(d)
	defer timer.Stop()
	interval := orDefault(c.PollInterval, DefaultPollInterval)
	poll := clk.NewTimer(interval)
	defer poll.Stop()
	for {
		if cond != nil && cond() {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-timer.C():
			return cond != nil && cond(), nil
		case <-poll.C():
			poll.Reset(interval)
		}
	}
}

// readyStep waits, bounded by ReadyTimeout, for the kubelet's Ready
// condition. A timeout fails the step with the last API error, if any (an
// unreachable API server makes it transient: the engine retries the step
// until the event's deadline).
//
// In host.mode simulate the kubelet's boot ID is not compared: a simulated
// reboot restarts no kubelet, so on a real node the kubelet goes on
// reporting the machine's boot ID, never the simulated one, and every
// simulated reboot would end in this step's timeout.
func (c RebootConfig) readyStep() Step {
	return Step{Name: "wait-ready", NeedsAPI: true, Run: func(ctx context.Context, rt Runtime) error {
		timeout := orDefault(c.ReadyTimeout, DefaultReadyTimeout)
		boot, inBoot := rt.Host().BootID(), " in this boot"
		if rt.Host().Simulated() {
			boot, inBoot = "", " (simulate: its boot ID is not compared, no kubelet restarted)"
		}
		// A fresh timeout for each run of the step, unlike readiness.timeout
		// (anchored to the wait's first start): the step is retried while
		// the API server does not answer (its error transient), and a wait
		// anchored to its first start would give the kubelet one short
		// look after an outage longer than the timeout — a whole cluster
		// powered down and up, every node then cordoned NotReady. The
		// event's sla bounds the retries (and its end keeps the cordon).
		rt.Progress(fmt.Sprintf("waiting up to %s for the kubelet to report the node Ready%s", timeout, inBoot))
		var last error
		ready, err := c.waitFor(ctx, timeout, func() bool {
			ok, err := rt.API().NodeReady(ctx, boot)
			last = err
			return err == nil && ok
		})
		if err != nil {
			return waitEnded(ctx, rt, c.Readiness.Config.Uncordon)
		}
		if !ready {
			if last != nil {
				// Transient: the engine retries the step.
				return fmt.Errorf("the node did not become Ready within %s (reboot.readyTimeout); last error reading the Node: %w", timeout, last)
			}
			// Not ready is a readiness timeout: with readiness.onTimeout
			// keepCordoned the abort leaves the cordon (DESIGN: "Ready
			// means ready" counts this boot's Ready among the checks).
			return keepCordonOnTimeout(rt, c.Readiness.Config.Uncordon,
				fmt.Errorf("the node did not become Ready within %s (reboot.readyTimeout): the kubelet's Ready condition is not True, or its status.nodeInfo.bootID is not this boot's %s", timeout, rt.Host().BootID()))
		}
		rt.Progress("node is Ready")
		return nil
	}}
}

// uncordonOursStep lifts the cordon this event made (rt.Owns), and only
// that one: a cordon someone else made, before or during the event, stays.
func uncordonOursStep() Step {
	return Step{Name: "uncordon", NeedsAPI: true, UncordonsOwn: true, Run: func(ctx context.Context, rt Runtime) error {
		ch := Change{Kind: "cordon", Key: rt.Node()}
		if !rt.Owns(ch) {
			rt.Progress(CordonLeft)
			return nil
		}
		changed, err := rt.API().Uncordon(ctx, rt.EventName(), false)
		switch {
		case errors.Is(err, apiclient.ErrCordonNotOurs):
			rt.Progress(fmt.Sprintf("the node's cordon is no longer this event's (%v); left in place", err))
		case err != nil:
			return err
		case changed:
			rt.Progress("node uncordoned")
		default:
			rt.Progress("node was no longer cordoned")
		}
		return rt.Disown(ch)
	}}
}

// NodeReturn is what a node that went down without an event of its own (a
// shutdown logind announced, DESIGN §3 "Ready means ready") waits for at
// its next boot before the uncordon that gives it back: the same waits as
// a reboot's, wait-ready then wait-workloads-ready, against a snapshot
// taken when the shutdown began. The engine runs it (engine.closeOutShutdowns).
type NodeReturn struct {
	// Snapshot reads what the node has now, for the Steps to require
	// again: the parameters to journal with the shutdown (ResolvedReadiness;
	// none when the Node or its pods cannot be read).
	Snapshot func(ctx context.Context, log func(msg string, args ...any)) map[string]string
	// Steps run in order: wait-ready (reboot.readyTimeout), then
	// wait-workloads-ready (readiness.*).
	Steps []Step
	// KeepCordoned: a step that fails leaves the node cordoned
	// (readiness.onTimeout: keepCordoned), as a reboot's readiness timeout does.
	KeepCordoned bool
}

// NodeReturn is the reboot driver's waits for a node back from a shutdown.
func (c RebootConfig) NodeReturn() NodeReturn {
	return NodeReturn{
		Snapshot: func(ctx context.Context, log func(msg string, args ...any)) map[string]string {
			p, _ := c.Readiness.resolve(ctx, nil, log) // no parameters: nothing to refuse
			return p
		},
		Steps:        []Step{c.readyStep(), c.Readiness.step()},
		KeepCordoned: !c.Readiness.Config.Uncordon,
	}
}
