package drivers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/readiness"
)

// StepWaitWorkloads is the readiness step: after wait-ready, before the
// uncordon that ends a reboot, an os-upgrade or a gpu-reset with drain.
const StepWaitWorkloads = "wait-workloads-ready"

// ResolvedReadiness is the plan key of the claim-time snapshot
// (readiness.Snapshot), fixed by Resolve and journaled with the claim.
const ResolvedReadiness = "resolved.readiness"

// Readiness is the checks before the uncordon (readiness.*; see package
// readiness). The zero value runs the default checks against no snapshot.
type Readiness struct {
	Config readiness.Config
	// API reads the Node and its pods for the claim-time snapshot (Resolve)
	// and the checks; nil: no snapshot is taken.
	API readiness.API
	// PollInterval paces the wait; 0 means DefaultPollInterval.
	PollInterval time.Duration
	// Clock times the wait; nil means the real clock.
	Clock clock.Clock
}

// NodeWatcher is an API client that signals changes to this Node and its
// pods (apiclient.Client.NodeChanges); the readiness wait looks again when
// one comes instead of polling every interval.
type NodeWatcher interface {
	NodeChanges(ctx context.Context) <-chan struct{}
}

// ReadinessRecheck is how often a readiness wait woken by a NodeWatcher
// looks anyway: for a change its watch missed while it was down.
const ReadinessRecheck = 30 * time.Second

// ChangeCordonKept is the owned-change kind, key cordon-kept/<node>, that
// a readiness timeout journals with readiness.onTimeout keepCordoned: the
// abort (the engine's, for reboot and os-upgrade) then leaves the node
// cordoned — its annotation still names the event — and drops both
// records, instead of lifting the cordon.
const ChangeCordonKept = "cordon-kept"

// CordonKept is that change for node.
func CordonKept(node string) Change {
	return Change{Kind: ChangeCordonKept, Key: ChangeCordonKept + "/" + node}
}

// KeptSuffix ends the message of a readiness failure that keeps the node
// cordoned (the engine's shutdown close-out says it the same way).
const KeptSuffix = "; the node stays cordoned (readiness.onTimeout: keepCordoned): uncordon it once it is ready"

// params are the keys the readiness adds to a driver's parameters.
func (Readiness) params() []string { return []string{readiness.Param, ResolvedReadiness} }

// resolve adds the claim-time snapshot to params. A snapshot that cannot
// be read (the API refusing the pod list) is not a reason to refuse the
// event: the step then says it compares against nothing.
func (r Readiness) resolve(ctx context.Context, params map[string]string, log func(msg string, args ...any)) (map[string]string, error) {
	if _, ok := params[ResolvedReadiness]; ok {
		return nil, fmt.Errorf("%w: parameters.%s: the %q prefix is reserved for the plan fixed at claim", ErrBadParameter, ResolvedReadiness, ResolvedPrefix)
	}
	if _, err := r.Config.Selected(params[readiness.Param]); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadParameter, err)
	}
	out := maps.Clone(params)
	if out == nil {
		out = map[string]string{}
	}
	if r.API == nil {
		return out, nil
	}
	snap, err := r.Config.Take(ctx, r.API)
	if err != nil {
		if log != nil {
			log("readiness: no claim-time snapshot; the daemonsets and resources checks will compare against nothing", "err", err)
		}
		return out, nil
	}
	out[ResolvedReadiness] = snap.Encode()
	return out, nil
}

// validate checks the readiness parameter of a plan.
func (r Readiness) validate(m map[string]string) error {
	if _, err := r.Config.Selected(m[readiness.Param]); err != nil {
		return fmt.Errorf("%w: %v", ErrBadParameter, err)
	}
	return nil
}

// ReadinessWaiting begins the progress message of StepWaitWorkloads that
// names what is not back yet. While the step runs, the engine makes such a
// message the Node's MaintenanceInProgress message too, so the Node says
// why it is still cordoned; both change only when that message does.
const ReadinessWaiting = "waiting for the node's workloads before the uncordon: "

// StaleReadyGrace is how long from the wait's start a DaemonSet pod whose
// Ready predates the current boot is not counted (readiness.Config.NotReady
// with the boot time): the new boot's kubelet posts every pod's status
// within seconds of reporting the Node Ready (1.4 s in the VM), which the
// wait follows. Past it the pod's status is taken as it reads, so that a
// clock stepped after the kubelet wrote the condition (an RTC that lagged,
// set right by NTP later: the boot time moves with the step, the
// condition's time does not) costs at most this much, not the whole
// readiness.timeout.
const StaleReadyGrace = 30 * time.Second

// lastLook bounds the one check a wait resumed past its deadline makes.
const lastLook = 10 * time.Second

// waitDeadline is when a readiness wait that first began at started
// (Runtime.StepStarted, journaled; zero: unknown, the wait begins now)
// times out: started + timeout, so a restart or a reboot during the wait
// does not give it a fresh readiness.timeout. It is a wall-clock time: a
// clock stepped forward between the start and a restart shortens what is
// left (down to one last look), one stepped back cannot make it more than
// a full timeout from now. The deadline returned is now plus what is
// left, so that within one run the wait is timed on now's monotonic
// clock. resumed says so for the progress message when the wait began
// before this run ("" for a wait that begins now).
func waitDeadline(now, started time.Time, timeout time.Duration) (deadline time.Time, resumed string) {
	if started.IsZero() {
		return now.Add(timeout), ""
	}
	left := min(started.Add(timeout).Sub(now), timeout)
	elapsed := now.Round(0).Sub(started).Round(time.Second)
	switch {
	case left <= 0:
		return now, fmt.Sprintf("; resumed after a restart: the wait began %s ago, past readiness.timeout, one last look", elapsed)
	case left.Round(time.Second) < timeout:
		return now.Add(left), fmt.Sprintf("; resumed after a restart: %s left, the wait began %s ago", left.Round(time.Second), elapsed)
	}
	return now.Add(left), ""
}

// step waits until readiness.Config.NotReady lists nothing, bounded by
// readiness.timeout counted from the wait's first start (journaled by the
// engine: Runtime.StepStarted), across restarts and reboots. The event's status (and, through the engine, the
// Node's MaintenanceInProgress condition) names what is not back yet: a
// write only when that changes, or when the API server stops or starts
// answering, never one per poll.
//
// An API error is not the end of the wait: the step retries it at every
// poll until readiness.timeout, as it waits for anything else. It is not a
// NeedsAPI step for that reason: the engine would retry a step whose error
// reads as an outage from the start, with a fresh readiness.timeout, and
// the final error names the API error (wrapped), which reads so. Each poll
// is bounded by the deadline too, so an API server that does not answer
// (a blackhole) cannot stretch the wait past readiness.timeout by the
// client's own request timeout.
//
// A timeout fails the step naming what never became ready, as last read,
// and the API error of the last poll when that poll failed; unless
// readiness.onTimeout is uncordon, the cordon is first marked kept, so the
// abort leaves the node cordoned (its annotation still names the event)
// for an admin to give back.
func (r Readiness) step() Step {
	return Step{Name: StepWaitWorkloads, Run: func(ctx context.Context, rt Runtime) error {
		if kept := CordonKept(rt.Node()); rt.Owns(kept) {
			// The wait timed out before a restart and kept the cordon: the
			// same end again, nothing checked twice.
			return errors.New("the node's workloads were not ready within readiness.timeout (decided before the agent restarted)" + KeptSuffix)
		}
		checks, err := r.Config.Selected(rt.Params()[readiness.Param])
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadParameter, err)
		}
		if len(checks) == 0 {
			rt.Progress("readiness checks skipped (none configured or parameters.readinessChecks: none)")
			return nil
		}
		cfg := r.Config
		note := ""
		if _, ok := cfg.Conditions[devices.ConditionType]; ok && rt.Host().Simulated() {
			// Simulate mode performs no reset and no reboot: GPUHealthy
			// cannot come back from what the agent only logged.
			cfg.Conditions = maps.Clone(cfg.Conditions)
			delete(cfg.Conditions, devices.ConditionType)
			note = " (simulate: " + devices.ConditionType + " not required, the GPUs were not really reset)"
		}
		var snap readiness.Snapshot
		if v, ok := rt.Params()[ResolvedReadiness]; ok {
			if snap, err = readiness.Decode(v); err != nil {
				return err
			}
		} else {
			note += " (no claim-time snapshot: DaemonSets and extended resources compared against nothing)"
		}
		api := r.API
		if api == nil {
			a, ok := rt.API().(readiness.API)
			if !ok {
				return errors.New("readiness: the API client cannot read the Node and its pods")
			}
			api = a
		}
		run := func(ctx context.Context, argv []string, timeout time.Duration) error {
			_, err := rt.Host().Run(ctx, argv, nil, timeout)
			return err
		}
		timeout := r.Config.Timeout
		if timeout <= 0 {
			timeout = readiness.DefaultTimeout
		}
		clk := r.Clock
		if clk == nil {
			clk = clock.RealClock{}
		}
		interval := orDefault(r.PollInterval, DefaultPollInterval)
		// Woken by the watch of the Node and its pods where the API client
		// has one: a check when something changed (at most one per
		// interval), and one every ReadinessRecheck for what a watch cannot
		// see (a watch that is down). The command check has no watch: with
		// it the wait polls every interval, as without a watch.
		var wake <-chan struct{}
		recheck := interval
		if w, ok := api.(NodeWatcher); ok && !slices.Contains(checks, readiness.CheckCommand) {
			wctx, wcancel := context.WithCancel(ctx)
			defer wcancel()
			wake, recheck = w.NodeChanges(wctx), max(interval, ReadinessRecheck)
		}
		deadline, resumed := waitDeadline(clk.Now(), rt.StepStarted(), timeout)
		// A wait resumed past its deadline still looks once: a node ready
		// by now is given back; the look is bounded on its own.
		pollBound := deadline
		if !clk.Now().Before(deadline) {
			pollBound = clk.Now().Add(min(timeout, lastLook))
		}
		rt.Progress(fmt.Sprintf("checking the node's workloads before the uncordon (%s, up to %s%s)%s", strings.Join(checks, ", "), timeout, resumed, note))
		shown := ""      // the progress message last written
		missing := ""    // what was not ready at the last poll that read the API
		var apiErr error // the last poll's error; nil when it read the API
		down := false    // the last poll failed
		began := rt.StepStarted()
		// A wait begun before this boot: the node rebooted during it (a
		// power cycle, a watchdog), and the agent, started before the
		// kubelet, resumes it. Until this boot's kubelet reports, the API
		// server still holds the old boot's Node and pods — Ready, their
		// allocatable, their pods Ready — so the wait also requires the
		// Node Ready in this boot (its nodeInfo.bootID), and counts the
		// stale-pod grace from now. Not in simulate mode, whose boots
		// restart no kubelet.
		bootTime := rt.Host().BootTime()
		rebooted := !rt.Host().Simulated() && !began.IsZero() && !bootTime.IsZero() && began.Before(bootTime)
		if began.IsZero() || rebooted {
			began = clk.Now()
		}
		for {
			polled := clk.Now()
			pctx, cancel := context.WithDeadline(ctx, pollBound)
			pollBound = deadline
			var boot time.Time // zero: every Ready counts
			if polled.Sub(began) < StaleReadyGrace {
				boot = bootTime
			}
			notReady, err := cfg.NotReady(pctx, api, snap, checks, run, boot)
			if err == nil && rebooted {
				ok, rerr := rt.API().NodeReady(pctx, rt.Host().BootID())
				switch {
				case rerr != nil:
					err = rerr
				case !ok:
					notReady = append([]string{"the Node is not Ready in this boot (the node rebooted during the wait; its kubelet has not reported yet)"}, notReady...)
				}
			}
			cancel()
			if ctx.Err() != nil {
				return waitEnded(ctx, rt, cfg.Uncordon)
			}
			apiErr = err
			if err == nil {
				if len(notReady) == 0 {
					rt.Progress("the node's workloads are ready: " + strings.Join(checks, ", "))
					return nil
				}
				missing = strings.Join(notReady, "; ")
			}
			// The message changes with what is missing and when the API
			// server stops answering (with its first error), not with every
			// failed poll's error.
			msg := ReadinessWaiting + missing
			switch {
			case err != nil && down:
				msg = shown
			case err != nil && missing == "":
				msg = fmt.Sprintf("waiting for the node's workloads before the uncordon: the API server does not answer (retrying until readiness.timeout): %v", err)
			case err != nil:
				msg += fmt.Sprintf(" (as last read; the API server does not answer, retrying until readiness.timeout: %v)", err)
			}
			down = err != nil
			if msg != shown {
				shown = msg
				rt.Progress(msg)
			}
			if !clk.Now().Before(deadline) {
				break
			}
			// The next look: at the next change or recheck, never past the
			// deadline, and with a watch the last one an interval before it
			// (a look at the deadline would have no time left to read).
			left := deadline.Sub(clk.Now())
			d := min(recheck, left)
			if wake != nil && left > interval {
				d = min(recheck, left-interval)
			}
			select {
			case <-ctx.Done():
				return waitEnded(ctx, rt, cfg.Uncordon)
			case <-wake:
				if gap := interval - clk.Since(polled); gap > 0 {
					select {
					case <-ctx.Done():
						return waitEnded(ctx, rt, cfg.Uncordon)
					case <-clk.After(min(gap, max(left, 0))):
					}
				}
			case <-clk.After(d):
			}
			if !clk.Now().Before(deadline) {
				break // what the last look read stands
			}
		}
		var failure error
		switch {
		case apiErr != nil && missing == "":
			failure = fmt.Errorf("the node's workloads could not be checked within %s (readiness.timeout): %w", timeout, apiErr)
		case apiErr != nil:
			failure = fmt.Errorf("the node's workloads were not ready within %s (readiness.timeout): %s, as last read before the API server stopped answering: %w", timeout, missing, apiErr)
		default:
			failure = fmt.Errorf("the node's workloads were not ready within %s (readiness.timeout): %s", timeout, missing)
		}
		return keepCordonOnTimeout(rt, cfg.Uncordon, failure)
	}}
}

// keepCordonOnTimeout is a readiness wait's end without the node ready
// (wait-ready's and wait-workloads-ready's timeout, or the event's sla
// reached during either): with readiness.onTimeout keepCordoned (uncordon
// false) and the cordon this event's, CordonKept is journaled before the
// step fails, so the abort leaves the cordon and a replay of the step
// fails again; failure then says so (KeptSuffix).
func keepCordonOnTimeout(rt Runtime, uncordon bool, failure error) error {
	if uncordon || !rt.Owns(Change{Kind: "cordon", Key: rt.Node()}) {
		return failure
	}
	if err := rt.Own(CordonKept(rt.Node())); err != nil {
		return err
	}
	return fmt.Errorf("%w%s", failure, KeptSuffix)
}

// waitEnded is a readiness wait's error when its context ended: past its
// deadline, the event's sla (the engine's only deadline on a step) ended
// it with the node not ready, which leaves the cordon as a timeout does
// (keepCordonOnTimeout; the abort that follows would otherwise give back a
// node that never became ready); a cancel or the agent's stop is not a
// timeout.
func waitEnded(ctx context.Context, rt Runtime, uncordon bool) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return keepCordonOnTimeout(rt, uncordon, fmt.Errorf("the event's sla ended the wait, the node not ready: %w", err))
	}
	return err
}
