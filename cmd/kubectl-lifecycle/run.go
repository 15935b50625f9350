package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// Labels the plugin puts on the events it creates.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "kubectl-lifecycle"
)

// pendingHint is how long an event may stay unclaimed before the plugin
// says that no agent seems to be taking it.
const pendingHint = 30 * time.Second

type runOptions struct {
	params  []string
	wait    bool
	timeout time.Duration
	out     *resultOutput
}

func (r *runOptions) addFlags(cmd *cobra.Command, waitDefault bool) {
	cmd.Flags().StringArrayVar(&r.params, "param", nil, "Driver parameter NAME=VALUE (repeatable), e.g. --param gracePeriodSeconds=30")
	cmd.Flags().BoolVar(&r.wait, "wait", waitDefault, "Follow the event until it ends and exit with its outcome")
	cmd.Flags().DurationVar(&r.timeout, "timeout", 0, "With --wait: give up waiting after this long (exit 4; the event keeps running). 0: no limit (the event's SLA still ends it)")
	r.out.addFlag(cmd)
}

func newRunCmd(o *options) *cobra.Command {
	r := &runOptions{out: resultFormats()}
	cmd := &cobra.Command{
		Use:   "run DRIVER NODE",
		Short: "Run a driver's transition on a node (creates a LifecycleEvent)",
		Long: `Create a LifecycleEvent for the transition <NODE>-<DRIVER> that the node's
lifecycle-agent published (see 'kubectl lifecycle transitions NODE').

Without --wait it prints the event's name and returns. With --wait it
follows the event live, one line per step with its timing, and exits 0 when
it Succeeded, 1 when it Failed, 3 when its SLA expired, 4 when --timeout
passed first (the event keeps running), 5 when it was deleted first.

-o name prints the event's bare name as soon as it is created; -o json one
object when the command ends: {"event", "node", "driver", "transition",
"claimStatus", "step", "message", "result", "exitCode", "error"}. With
either, the progress lines go to stderr.`,
		Example: `  kubectl lifecycle run drain node-a --wait
  kubectl lifecycle run drain node-a --param gracePeriodSeconds=30 --param podSelector=app=web
  ev=$(kubectl lifecycle run uncordon node-a) && kubectl lifecycle status "$ev"
  kubectl lifecycle run reboot node-a --wait --timeout 30m -o json`,
		Args: argsBetween(2, 2),
		RunE: o.resultE(r.out, func(ctx context.Context, args []string) error {
			return o.run(ctx, args[0], args[1], r)
		}),
	}
	r.addFlags(cmd, false)
	return cmd
}

func newShorthandCmd(o *options, driver, short string) *cobra.Command {
	r := &runOptions{out: resultFormats()}
	cmd := &cobra.Command{
		Use:     driver + " NODE",
		Short:   short,
		Long:    short + ".\n\nThe same as 'kubectl lifecycle run " + driver + " NODE --wait', -o json|name included.",
		Example: fmt.Sprintf("  kubectl lifecycle %s node-a", driver),
		Args:    argsBetween(1, 1),
		RunE: o.resultE(r.out, func(ctx context.Context, args []string) error {
			return o.run(ctx, driver, args[0], r)
		}),
	}
	r.addFlags(cmd, true)
	return cmd
}

// run creates the event for <node>-<driver> and, with --wait, follows it.
func (o *options) run(ctx context.Context, driver, node string, r *runOptions) error {
	params, err := parseParams(r.params)
	if err != nil {
		return err
	}
	cl, err := o.clients()
	if err != nil {
		return err
	}
	lt, err := resolveTransition(ctx, cl, driver, node)
	if err != nil {
		return err
	}
	ev := &v1alpha1.LifecycleEvent{
		ObjectMeta: metav1.ObjectMeta{GenerateName: lt.Name + "-", Labels: map[string]string{labelManagedBy: managedBy}},
		Spec:       v1alpha1.LifecycleEventSpec{TransitionName: lt.Name, BindingNode: node, Parameters: params},
	}
	ev, err = cl.lc.Events.Create(ctx, ev, metav1.CreateOptions{FieldManager: managedBy})
	if err != nil {
		return fmt.Errorf("create LifecycleEvent for %s: %w", lt.Name, err)
	}
	last := ev
	r.out.value = func(code int, msg string) any { return newRunResult(last, driver, code, msg) }
	r.out.name(ev.Name)
	if !r.wait {
		if r.out.format == "" {
			fmt.Fprintln(o.out, ev.Name)
		}
		return nil
	}
	fmt.Fprintf(o.out, "lifecycleevent %s created (transition %s: %s -> %s on node %s)\n", ev.Name, lt.Name, lt.Spec.Start, lt.Spec.End, node)
	if ahead := o.unfinishedAhead(ctx, cl, ev); len(ahead) > 0 {
		fmt.Fprintf(o.out, "note: node %s runs one event at a time; waiting behind %s\n", node, strings.Join(ahead, ", "))
	}
	return o.follow(ctx, cl, ev, r.timeout, func(cur *v1alpha1.LifecycleEvent) { last = cur })
}

// unfinishedAhead names the node's other unfinished events created before ev.
func (o *options) unfinishedAhead(ctx context.Context, cl *clients, ev *v1alpha1.LifecycleEvent) []string {
	l, err := cl.lc.Events.List(ctx, apiclient.BindingNodeSelector(ev.Spec.BindingNode))
	if err != nil {
		return nil
	}
	sortEvents(l.Items)
	var names []string
	for _, other := range l.Items {
		if other.Name == ev.Name || other.Status.ClaimStatus.Finished() || other.DeletionTimestamp != nil {
			continue
		}
		if other.CreationTimestamp.After(ev.CreationTimestamp.Time) {
			continue
		}
		names = append(names, other.Name)
	}
	return names
}

// follow prints the event's progress until it ends and maps the outcome to
// an exit code; seen gets every version of the event it sees.
func (o *options) follow(ctx context.Context, cl *clients, ev *v1alpha1.LifecycleEvent, timeout time.Duration, seen func(*v1alpha1.LifecycleEvent)) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := startEventCache(wctx, cl.lc, metav1.ListOptions{FieldSelector: "metadata.name=" + ev.Name})
	p := newProgress(o, ev.Name, o.clock.Now())
	deadline := o.timeoutC(timeout)
	hint := o.clock.After(pendingHint)
	keepsRunning := fmt.Sprintf("it keeps running: follow it with 'kubectl lifecycle status %s', stop it with 'kubectl lifecycle cancel %s'", ev.Name, ev.Name)
	var finishedAt time.Time
	for {
		synced := c.ctrl.HasSynced() // before get: a list that came between would not count
		if cur, ok := c.get(ev.Name); ok {
			seen(cur)
			if p.update(cur) {
				if finishedAt.IsZero() {
					finishedAt = o.clock.Now()
				}
				if settled(cur, o.clock.Since(finishedAt)) {
					return outcome(cur)
				}
			}
		} else if synced {
			// It was created before the cache's first list: absent
			// from a synced cache, it was deleted (perhaps before that
			// list saw it).
			if !finishedAt.IsZero() {
				return outcome(p.last)
			}
			return fail(exitCancelled, "lifecycleevent %s was deleted before it ended (cancelled)", ev.Name)
		}
		select {
		case <-ctx.Done():
			return fail(exitInterrupted, "interrupted; lifecycleevent %s %s", ev.Name, keepsRunning)
		case <-deadline:
			return fail(exitTimeout, "timed out after %s waiting for lifecycleevent %s; %s", timeout, ev.Name, keepsRunning)
		case <-hint:
			if !p.claimed {
				fmt.Fprintf(o.out, "%s still Pending: no agent has claimed it; is lifecycle-agent running on node %s? ('kubectl lifecycle transitions %s')\n",
					p.stamp(), ev.Spec.BindingNode, ev.Spec.BindingNode)
			}
		case <-c.changed:
		case <-o.clock.After(time.Second):
		}
	}
}

// settleWait bounds how long a finished event may keep the agent's
// finalizer before the plugin reports it anyway.
const settleWait = 15 * time.Second

// settled reports whether a finished event is also settled: the agent
// removes its finalizer only after the end state and the Node conditions
// were written, so once it is off, the Node shows the outcome too.
func settled(ev *v1alpha1.LifecycleEvent, sinceFinished time.Duration) bool {
	if !ev.Status.ClaimStatus.Finished() {
		return false
	}
	for _, f := range ev.Finalizers {
		if f == v1alpha1.Finalizer {
			return sinceFinished >= settleWait
		}
	}
	return true
}

// outcome maps a finished event to the command's result.
func outcome(ev *v1alpha1.LifecycleEvent) error {
	switch ev.Status.ClaimStatus {
	case v1alpha1.LifecycleEventSucceeded:
		return nil
	case v1alpha1.LifecycleEventSlaExpired:
		return fail(exitSlaExpired, "lifecycleevent %s: SLA expired: %s", ev.Name, ev.Status.Message)
	}
	return fail(exitFailed, "lifecycleevent %s failed: %s", ev.Name, ev.Status.Message)
}

// progress turns successive versions of one event into lines: the claim,
// one line per finished step with its time, progress messages, waits for
// the disruption budget, and the end.
type progress struct {
	o       *options
	name    string
	start   time.Time
	claimed bool
	// mark is when the last step ended (or the claim was seen): the start
	// of the next step when its Running state was never observed.
	mark     time.Time
	running  map[string]time.Time
	reported map[string]bool
	lastMsg  string
	waiting  bool
	ended    bool
	last     *v1alpha1.LifecycleEvent
}

func newProgress(o *options, name string, start time.Time) *progress {
	return &progress{o: o, name: name, start: start, mark: start, running: map[string]time.Time{}, reported: map[string]bool{}}
}

func (p *progress) stamp() string {
	return fmt.Sprintf("[%6s]", took(p.o.clock.Since(p.start)))
}

func (p *progress) line(format string, args ...any) {
	fmt.Fprintf(p.o.out, "%s %s\n", p.stamp(), fmt.Sprintf(format, args...))
}

// update prints what changed and reports whether the event has ended.
func (p *progress) update(ev *v1alpha1.LifecycleEvent) bool {
	p.last = ev
	if p.ended {
		return true
	}
	now := p.o.clock.Now()
	st := ev.Status
	if !p.claimed && st.ClaimStatus != "" && st.ClaimStatus != v1alpha1.LifecycleEventPending {
		p.claimed, p.mark = true, now
		if st.ClaimStatus == v1alpha1.LifecycleEventClaimed && st.Holder != nil {
			msg := "claimed by " + st.Holder.Identity
			if st.Sla != nil {
				msg += ", SLA deadline " + timestamp(st.Sla)
			}
			p.line("%s", msg)
		}
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionWaitingForDisruptionBudget); c != nil {
		w := c.Status == metav1.ConditionTrue
		if w && !p.waiting {
			p.line("waiting for the disruption budget: %s", c.Message)
		}
		p.waiting = w
	}
	finished := st.ClaimStatus.Finished()
	if msg := st.Message; !finished && msg != "" && msg != p.lastMsg && !strings.HasPrefix(msg, "claimed by ") && !p.waiting {
		p.line("  %s", oneLine(msg, 200))
	}
	p.lastMsg = st.Message
	for _, s := range st.Steps {
		if p.reported[s.Name] {
			continue
		}
		switch s.State {
		case v1alpha1.StepRunning:
			if _, ok := p.running[s.Name]; !ok {
				p.running[s.Name] = now
			}
		case v1alpha1.StepDone, v1alpha1.StepFailed, v1alpha1.StepSkipped:
			began, ok := p.running[s.Name]
			if !ok {
				began = p.mark
			}
			extra := ""
			if s.Attempt > 1 {
				extra = fmt.Sprintf(" (attempt %d)", s.Attempt)
			}
			if s.Message != "" {
				extra += "  " + oneLine(s.Message, 200)
			}
			p.line("step %-12s %-8s %7s%s", s.Name, s.State, took(now.Sub(began)), extra)
			p.reported[s.Name] = true
			p.mark = now
		}
	}
	if finished {
		p.ended = true
		p.line("%s in %s: %s", st.ClaimStatus, took(now.Sub(p.start)), oneLine(st.Message, 300))
	}
	return finished
}
