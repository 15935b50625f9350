package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// labelRollout on an event names the rollout (its disruption group) that
// created it; re-running the same rollout finds its events by it.
const labelRollout = "lifecycle.x-k8s.io/rollout"

// maxGroupLen is spec.disruption.group's limit (slot Leases are <group>-<i>).
const maxGroupLen = 56

// gpuResetParamGPUs is the gpu-reset driver's GPU list parameter
// (drivers.GPUResetParamGPUs; the plugin does not link the drivers).
const gpuResetParamGPUs = "gpus"

// gpuResetParamDrain is drivers.GPUResetParamDrain.
const gpuResetParamDrain = "drain"

var groupRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

type rolloutOptions struct {
	selector      string
	maxConcurrent int
	maxFailures   int
	wait          bool
	timeout       time.Duration
	group         string
	params        []string
	retryFailed   bool
	needsReboot   bool
	needsGPUReset bool
	out           *resultOutput
}

// need is the Node condition --needs-reboot or --needs-gpu-reset selects
// on; "" for neither.
func (r *rolloutOptions) need() string {
	switch {
	case r.needsReboot:
		return v1alpha1.NodeConditionRebootRequired
	case r.needsGPUReset:
		return v1alpha1.NodeConditionGPUResetRequired
	}
	return ""
}

func newRolloutCmd(o *options) *cobra.Command {
	r := &rolloutOptions{out: resultFormats()}
	var cmd *cobra.Command
	cmd = &cobra.Command{
		Use:   "rollout DRIVER (-l SELECTOR | NODE... | --needs-reboot | --needs-gpu-reset)",
		Short: "Run a driver's transition on many nodes, at most N at a time",
		Long: `Run DRIVER on every selected node under a disruption budget.

Each node gets one LifecycleEvent named rollout-<group>-<node>-<driver>,
labelled lifecycle.x-k8s.io/rollout=<group>, with spec.disruption
{group, maxConcurrent}: the agents take one of the Leases <group>-0 …
<group>-(N-1) in lifecycle-system before their first disruptive step, so
the budget holds even if this command dies.

With --wait the command also orders the rollout: it keeps at most
--max-concurrent of the rollout's events unfinished at a time (nodes in
name order), creates the next when one ends, stops creating once
--max-failures nodes have failed, waits for the running ones, and prints a
summary line whenever it changes. Without --wait it creates every event at
once and returns; the agents' slots still enforce --max-concurrent.

Re-running the same command resumes: the event names are deterministic, so
existing events are adopted (finished ones counted), never duplicated. The
default group is <driver>-<hash of the node list or of the selector>; pass
--group to name it, or to start the same operation again later.

--needs-reboot keeps, of the nodes selected (all nodes when neither NODE
arguments nor -l are given), exactly those whose agent reports the Node
condition RebootRequired=True (its reboot-required sentinel); none: the
command says so and exits 0. Its default group hashes the selector, not the
node list, so that running it again resumes the same rollout.

--needs-gpu-reset does the same with GPUResetRequired=True (a GPU's
recovery action, a pending row remap, a reset-class XID). For the
gpu-reset driver each node's event then gets gpus=<the indices its
condition names> unless --param gpus=... is given (a condition whose list
was cut, ",More", gets gpus=all), and drain=true when a GPU's recovery
action is DRAIN_AND_RESET unless --param drain=... is given.

-o name prints the names of the rollout's events (created or adopted), one
per line, when the command ends; -o json one object: {"rollout", "driver",
"nodes": [{"node", "event", "state", "claimStatus", "message"}], "done",
"running", "waiting", "failed", "result", "exitCode", "error"}. With either,
the progress lines go to stderr.`,
		Example: `  kubectl lifecycle rollout drain -l rack=r12 --max-concurrent 2 --wait
  kubectl lifecycle rollout reboot node-a node-b node-c --max-concurrent 1 --max-failures 1 --wait
  kubectl lifecycle rollout uncordon -l rack=r12 --max-concurrent 5 --group rack-r12-uncordon --wait
  kubectl lifecycle rollout reboot --needs-reboot --max-concurrent 1 --wait
  kubectl lifecycle rollout gpu-reset --needs-gpu-reset --max-concurrent 2 --wait`,
		Args: argsBetween(1, -1),
		RunE: o.resultE(r.out, func(ctx context.Context, args []string) error {
			if !r.wait && cmd.Flags().Changed("max-failures") {
				return usageErr("--max-failures needs --wait: without it nothing stays to count failures")
			}
			return o.rollout(ctx, args[0], args[1:], r)
		}),
	}
	f := cmd.Flags()
	f.StringVarP(&r.selector, "selector", "l", "", "Label selector of the nodes (instead of NODE arguments)")
	f.IntVar(&r.maxConcurrent, "max-concurrent", 1, "At most this many nodes disrupted at once (1-1000)")
	f.IntVar(&r.maxFailures, "max-failures", 1, "With --wait: start no more nodes once this many have failed; 0: never stop")
	f.BoolVar(&r.wait, "wait", false, "Order the rollout and follow it to the end")
	f.DurationVar(&r.timeout, "timeout", 0, "With --wait: give up after this long (exit 4; running events go on, re-run to resume). 0: no limit")
	f.StringVar(&r.group, "group", "", "Disruption group and rollout name (lowercase letters, digits, '-'; at most 56). Default: <driver>-<hash of the nodes or selector>")
	f.StringArrayVar(&r.params, "param", nil, "Driver parameter NAME=VALUE for every node's event (repeatable)")
	f.BoolVar(&r.retryFailed, "retry-failed", false, "Delete this rollout's failed events and run those nodes again")
	f.BoolVar(&r.needsReboot, "needs-reboot", false, "Only the selected nodes (default: all) that report RebootRequired=True")
	f.BoolVar(&r.needsGPUReset, "needs-gpu-reset", false, "Only the selected nodes (default: all) that report GPUResetRequired=True")
	cmd.MarkFlagsMutuallyExclusive("needs-reboot", "needs-gpu-reset")
	r.out.addFlag(cmd)
	return cmd
}

// rolloutNode is one node of a rollout and the latest word on its event.
type rolloutNode struct {
	node  string
	event string // rolloutEventName
	ev    *v1alpha1.LifecycleEvent
	// seen: the event was in the watch cache once; gone: and then it went
	// away before it ended (cancelled).
	seen, gone bool
	// finishedAt is when the event was first seen in an end state; ended
	// once it is also settled (see settled).
	finishedAt time.Time
	ended      bool
	// doneByNode: the event is gone (eventRetention) but the Node's
	// LifecycleTransition condition says it succeeded.
	doneByNode bool
	reported   bool
	// stale: with --needs-reboot (--needs-gpu-reset), this rollout's
	// finished event of a node that needs a reboot (reset) again since;
	// deleted and run again.
	stale *v1alpha1.LifecycleEvent
	// params of this node's event: the rollout's, with --needs-gpu-reset
	// and the gpu-reset driver the node's gpus.
	params map[string]string
}

// observe records the latest version of the node's event.
func (n *rolloutNode) observe(ev *v1alpha1.LifecycleEvent, now time.Time) {
	n.ev = ev
	if !ev.Status.ClaimStatus.Finished() {
		return
	}
	if n.finishedAt.IsZero() {
		n.finishedAt = now
	}
	n.ended = settled(ev, now.Sub(n.finishedAt))
}

func (n *rolloutNode) started() bool { return n.ev != nil || n.doneByNode }

func (n *rolloutNode) succeeded() bool {
	return n.doneByNode || (n.ended && !n.gone && n.ev.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded)
}

func (n *rolloutNode) failed() bool {
	return n.gone || (n.ended && n.ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded)
}

func (n *rolloutNode) running() bool { return n.started() && !n.succeeded() && !n.failed() }

// tally counts a rollout's nodes.
type tally struct{ done, running, waiting, failed int }

func count(nodes []*rolloutNode) tally {
	var t tally
	for _, n := range nodes {
		switch {
		case n.succeeded():
			t.done++
		case n.failed():
			t.failed++
		case n.running():
			t.running++
		default:
			t.waiting++
		}
	}
	return t
}

func (t tally) String() string {
	return fmt.Sprintf("done %d/%d, running %d, waiting %d, failed %d", t.done, t.done+t.running+t.waiting+t.failed, t.running, t.waiting, t.failed)
}

// next is the rollout's ordering rule: while fewer than maxConcurrent
// events are unfinished and fewer than maxFailures nodes have failed
// (maxFailures 0: no limit), start the next nodes that have no event yet,
// in the given order. stopped reports that the failure limit is reached.
func next(nodes []*rolloutNode, maxConcurrent, maxFailures int) (start []*rolloutNode, stopped bool) {
	t := count(nodes)
	if maxFailures > 0 && t.failed >= maxFailures {
		return nil, true
	}
	free := maxConcurrent - t.running
	for _, n := range nodes {
		if free <= 0 {
			break
		}
		if !n.started() {
			start = append(start, n)
			free--
		}
	}
	return start, false
}

// defaultGroup derives the rollout's group from the driver and the node
// list (or the selector, so that a node joining it later is part of the
// same rollout): <driver>-<8 hex digits>.
func defaultGroup(short string, nodes []string, selector string) string {
	h := sha256.New()
	fmt.Fprintf(h, "driver=%s\n", short)
	if selector != "" {
		fmt.Fprintf(h, "selector=%s\n", selector)
	} else {
		sorted := append([]string(nil), nodes...)
		sort.Strings(sorted)
		for _, n := range sorted {
			fmt.Fprintf(h, "node=%s\n", n)
		}
	}
	prefix := short
	if len(prefix) > maxGroupLen-9 {
		prefix = strings.TrimRight(prefix[:maxGroupLen-9], "-")
	}
	return prefix + "-" + hex.EncodeToString(h.Sum(nil))[:8]
}

// rolloutEventName is rollout-<group>-<node>-<driver>; names longer than
// 253 characters are cut and end with a hash of the full name.
func rolloutEventName(group, node, short string) string {
	n := "rollout-" + group + "-" + node + "-" + short
	if len(n) <= 253 {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	return strings.TrimRight(n[:253-11], "-.") + "-" + hex.EncodeToString(sum[:])[:10]
}

// doneOnNode reports whether the Node's LifecycleTransition condition says
// that event reached end: the trace a finished event leaves once the agent
// deleted it (eventRetention).
func doneOnNode(node *corev1.Node, event, end, need string) bool {
	for _, c := range node.Status.Conditions {
		if string(c.Type) == v1alpha1.NodeConditionLifecycleTransition {
			done := c.Status == corev1.ConditionFalse && c.Reason == end && strings.Contains(c.Message, "(event "+event+")")
			// With --needs-reboot (--needs-gpu-reset) a need that came
			// back after it ended is work again.
			return done && !(need != "" && needBackSince(node, need, &c.LastTransitionTime))
		}
	}
	return false
}

// needBackSince says whether the node's need condition (RebootRequired,
// GPUResetRequired) turned True after t (the end of an earlier event of
// the same rollout). Both are whole seconds on the API: a need back within
// the second the event ended is taken for the same need, so that one need
// never gets two events.
func needBackSince(node *corev1.Node, need string, t *metav1.Time) bool {
	if t == nil {
		return false
	}
	c := nodeCond(node, need)
	return c != nil && c.Status == corev1.ConditionTrue && c.LastTransitionTime.After(t.Time)
}

// drainAndReset says whether a GPU of the node asks to be drained before
// its reset (recovery action DRAIN_AND_RESET, in GPUResetRequired's reason).
func drainAndReset(node *corev1.Node) bool {
	c := nodeCond(node, v1alpha1.NodeConditionGPUResetRequired)
	return c != nil && strings.Contains(c.Reason, ":RecoveryAction_DRAIN_AND_RESET")
}

// gpusNeedingReset is the gpu-reset driver's gpus parameter for a node
// whose GPUResetRequired=True names its GPUs in the reason
// ("GPU3:RecoveryAction_GPU_RESET,GPU5:RemappedRowsPending" → "3,5"); a
// reason cut short (",More") or unreadable gives "all".
func gpusNeedingReset(node *corev1.Node) string {
	c := nodeCond(node, v1alpha1.NodeConditionGPUResetRequired)
	if c == nil {
		return "all"
	}
	var idx []string
	for _, part := range strings.Split(c.Reason, ",") {
		gpu, _, ok := strings.Cut(part, ":")
		n, err := strconv.Atoi(strings.TrimPrefix(gpu, "GPU"))
		if !ok || !strings.HasPrefix(gpu, "GPU") || err != nil || n < 0 {
			return "all"
		}
		if s := strconv.Itoa(n); !slices.Contains(idx, s) {
			idx = append(idx, s)
		}
	}
	if len(idx) == 0 {
		return "all"
	}
	return strings.Join(idx, ",")
}

func (o *options) rollout(ctx context.Context, driver string, nodeArgs []string, r *rolloutOptions) error {
	switch {
	case r.maxConcurrent < 1 || r.maxConcurrent > 1000:
		return usageErr("--max-concurrent %d: want 1 to 1000", r.maxConcurrent)
	case r.maxFailures < 0:
		return usageErr("--max-failures %d: want 0 (no limit) or more", r.maxFailures)
	case r.selector != "" && len(nodeArgs) > 0:
		return usageErr("rollout takes NODE arguments or -l SELECTOR (one of the two)")
	case r.selector == "" && len(nodeArgs) == 0 && r.need() == "":
		return usageErr("rollout takes NODE arguments, -l SELECTOR, --needs-reboot or --needs-gpu-reset")
	case r.group != "" && (len(r.group) > maxGroupLen || !groupRE.MatchString(r.group)):
		return usageErr("--group %q: want at most %d lowercase letters, digits and '-', starting and ending with a letter or digit", r.group, maxGroupLen)
	}
	short := driverShort(driver)
	if short == "" {
		return usageErr("driver %q: want a name such as drain or lifecycle-agent.x-k8s.io/drain", driver)
	}
	params, err := parseParams(r.params)
	if err != nil {
		return err
	}
	selector := ""
	if r.selector != "" {
		sel, err := labels.Parse(r.selector)
		if err != nil {
			return usageErr("-l %q: %v", r.selector, err)
		}
		selector = sel.String()
	}
	cl, err := o.clients()
	if err != nil {
		return err
	}

	// The nodes, in name order.
	nodeObjs := map[string]*corev1.Node{}
	if selector != "" || len(nodeArgs) == 0 {
		l, err := cl.core.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return fmt.Errorf("list nodes %s: %w", selector, err)
		}
		for i := range l.Items {
			nodeObjs[l.Items[i].Name] = &l.Items[i]
		}
		if len(nodeObjs) == 0 && selector != "" {
			return usageErr("no nodes match -l %s", selector)
		}
	} else {
		for _, name := range nodeArgs {
			if _, dup := nodeObjs[name]; dup {
				continue
			}
			n, err := cl.core.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return usageErr("node %q not found", name)
			}
			if err != nil {
				return fmt.Errorf("get node %s: %w", name, err)
			}
			nodeObjs[name] = n
		}
	}
	if need := r.need(); need != "" {
		for name, n := range nodeObjs {
			if c := nodeCond(n, need); c == nil || c.Status != corev1.ConditionTrue {
				delete(nodeObjs, name)
			}
		}
		if len(nodeObjs) == 0 {
			fmt.Fprintf(o.out, "no selected node reports %s=True: nothing to do\n", need)
			group := rolloutGroup(r, short, nil, nodeArgs, selector)
			r.out.value = func(code int, msg string) any { return newRolloutResult(group, short, nil, code, msg) }
			return nil
		}
	}
	names := sortedKeys(nodeObjs)
	group := rolloutGroup(r, short, names, nodeArgs, selector)

	// Adopt what an earlier run of the same rollout created.
	existing, err := cl.lc.Events.List(ctx, metav1.ListOptions{LabelSelector: labelRollout + "=" + group})
	if err != nil {
		return fmt.Errorf("list the events of rollout %s: %w", group, err)
	}
	byName := map[string]*v1alpha1.LifecycleEvent{}
	for i := range existing.Items {
		byName[existing.Items[i].Name] = &existing.Items[i]
	}
	nodes := make([]*rolloutNode, 0, len(names))
	for _, name := range names {
		n := &rolloutNode{node: name, event: rolloutEventName(group, name, short), params: params}
		if _, given := params[gpuResetParamGPUs]; r.needsGPUReset && short == "gpu-reset" && !given {
			n.params = maps.Clone(params)
			if n.params == nil {
				n.params = map[string]string{}
			}
			n.params[gpuResetParamGPUs] = gpusNeedingReset(nodeObjs[name])
			if _, given := params[gpuResetParamDrain]; !given && drainAndReset(nodeObjs[name]) {
				n.params[gpuResetParamDrain] = "true"
			}
		}
		if ev := byName[n.event]; ev != nil {
			if ev.Spec.BindingNode != name || ev.Spec.TransitionName != name+"-"+short {
				return fail(exitFailed, "lifecycleevent %s exists but runs %s on node %s, not %s-%s: choose another --group",
					ev.Name, ev.Spec.TransitionName, ev.Spec.BindingNode, name, short)
			}
			o.warnDiffers(ev, n.params, r.maxConcurrent)
			if need := r.need(); need != "" && needBackSince(nodeObjs[name], need, ev.Status.CompletionTime) {
				// Its reboot is done and the node needs another: run
				// it again, as --retry-failed does a failed one.
				n.stale = ev
			} else {
				n.observe(ev, o.clock.Now())
			}
		}
		nodes = append(nodes, n)
	}
	by := "-l " + selector
	if selector == "" {
		by = strings.Join(names, " ")
	}
	fmt.Fprintf(o.out, "rollout %s: %s on %d node(s) (%s), max-concurrent %d", group, short, len(nodes), by, r.maxConcurrent)
	if r.wait {
		fmt.Fprintf(o.out, ", max-failures %d", r.maxFailures)
	}
	fmt.Fprintln(o.out)
	if err := o.deleteFinished(ctx, cl, nodes, r.retryFailed, r.need()); err != nil {
		return err
	}
	// Every node still to start needs the transition; a node whose event
	// is gone may be done already by its Node condition.
	var missing []string
	for _, n := range nodes {
		if n.started() {
			continue
		}
		lt, err := cl.lc.Transitions.Get(ctx, n.node+"-"+short, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && driverShort(lt.Spec.Driver) != short) {
			missing = append(missing, n.node)
			continue
		}
		if err != nil {
			return fmt.Errorf("get LifecycleTransition %s-%s: %w", n.node, short, err)
		}
		n.doneByNode = doneOnNode(nodeObjs[n.node], n.event, string(lt.Spec.End), r.need())
	}
	if len(missing) > 0 {
		return usageErr("no transition <node>-%s published for %d node(s): %s (see 'kubectl lifecycle transitions NODE'; is lifecycle-agent running there with driver %s enabled?)",
			short, len(missing), strings.Join(missing, ", "), short)
	}

	if t := count(nodes); t.waiting < len(nodes) {
		fmt.Fprintf(o.out, "resuming: %d node(s) already started by an earlier run: %s\n", len(nodes)-t.waiting, t)
	}
	ro := &rolloutRun{o: o, cl: cl, group: group, short: short, params: params, r: r, nodes: nodes, start: o.clock.Now()}
	r.out.value = func(code int, msg string) any { return newRolloutResult(group, short, nodes, code, msg) }
	if r.out.format == outName {
		defer func() {
			for _, n := range nodes {
				if n.ev != nil {
					r.out.name(n.event)
				}
			}
		}()
	}
	if !r.wait {
		return ro.createAll(ctx)
	}
	return ro.follow(ctx)
}

// rolloutGroup is --group, or the default group of the rollout of short
// on the nodes names (sorted) chosen by nodeArgs and selector.
func rolloutGroup(r *rolloutOptions, short string, names, nodeArgs []string, selector string) string {
	switch {
	case r.group != "":
		return r.group
	case r.need() != "":
		// The set shrinks as nodes reboot: name the rollout by what
		// selects it, so that running it again adopts its events.
		args := append([]string(nil), nodeArgs...)
		sort.Strings(args)
		flag := "needs-reboot"
		if r.needsGPUReset {
			flag = "needs-gpu-reset"
		}
		return defaultGroup(short, nil, flag+";"+selector+";"+strings.Join(args, ","))
	}
	return defaultGroup(short, names, selector)
}

func (o *options) warnDiffers(ev *v1alpha1.LifecycleEvent, params map[string]string, maxConcurrent int) {
	if !maps.Equal(ev.Spec.Parameters, params) && (len(ev.Spec.Parameters) > 0 || len(params) > 0) {
		fmt.Fprintf(o.errOut, "warning: adopting lifecycleevent %s, whose parameters %v differ from --param %v\n", ev.Name, ev.Spec.Parameters, params)
	}
	if d := ev.Spec.Disruption; d != nil && int(d.MaxConcurrent) != maxConcurrent {
		fmt.Fprintf(o.errOut, "warning: adopting lifecycleevent %s, created with maxConcurrent %d (now %d)\n", ev.Name, d.MaxConcurrent, maxConcurrent)
	}
}

// deleteFinished deletes the rollout's events that must run again — the
// failed ones with --retry-failed, those of nodes whose need came back
// (stale) — and waits until they are gone (they have no finalizer any
// more), so their nodes start again.
func (o *options) deleteFinished(ctx context.Context, cl *clients, nodes []*rolloutNode, retryFailed bool, need string) error {
	for _, n := range nodes {
		ev, why := n.stale, fmt.Sprintf("it reports %s=True again since its event %s ended", need, n.event)
		if ev == nil {
			if !retryFailed || !n.failed() {
				continue
			}
			ev, why = n.ev, fmt.Sprintf("deleted its failed event %s (%s)", n.event, oneLine(n.ev.Status.Message, 120))
		}
		uid := ev.UID
		err := cl.lc.Events.Delete(ctx, n.event, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete event %s: %w", n.event, err)
		}
		deadline := o.clock.After(time.Minute)
		for {
			_, err := cl.lc.Events.Get(ctx, n.event, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-deadline:
				return fail(exitFailed, "event %s still there a minute after its deletion", n.event)
			case <-o.clock.After(200 * time.Millisecond):
			}
		}
		fmt.Fprintf(o.out, "retrying %s: %s\n", n.node, why)
		n.ev, n.stale, n.finishedAt, n.ended = nil, nil, time.Time{}, false
	}
	return nil
}

// rolloutRun is one invocation of the rollout command.
type rolloutRun struct {
	o      *options
	cl     *clients
	group  string
	short  string
	params map[string]string
	r      *rolloutOptions
	nodes  []*rolloutNode
	start  time.Time
}

func (ro *rolloutRun) line(format string, args ...any) {
	fmt.Fprintf(ro.o.out, "[%6s] %s\n", took(ro.o.clock.Since(ro.start)), fmt.Sprintf(format, args...))
}

// create makes node n's event, or adopts it when it appeared meanwhile.
func (ro *rolloutRun) create(ctx context.Context, n *rolloutNode) error {
	ev := &v1alpha1.LifecycleEvent{
		ObjectMeta: metav1.ObjectMeta{Name: n.event, Labels: map[string]string{labelRollout: ro.group, labelManagedBy: managedBy}},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: n.node + "-" + ro.short, BindingNode: n.node, Parameters: n.params,
			Disruption: &v1alpha1.DisruptionBudget{Group: ro.group, MaxConcurrent: int32(ro.r.maxConcurrent)}},
	}
	created, err := ro.cl.lc.Events.Create(ctx, ev, metav1.CreateOptions{FieldManager: managedBy})
	if apierrors.IsAlreadyExists(err) {
		created, err = ro.cl.lc.Events.Get(ctx, n.event, metav1.GetOptions{})
		if err == nil {
			n.observe(created, ro.o.clock.Now())
			ro.line("%s: adopted lifecycleevent %s (created meanwhile by someone else)", n.node, n.event)
			return nil
		}
	}
	if err != nil {
		return fail(exitFailed, "create lifecycleevent %s: %v (events already created go on; re-run the same command to resume)", n.event, err)
	}
	n.observe(created, ro.o.clock.Now())
	ro.line("%s: started lifecycleevent %s", n.node, n.event)
	return nil
}

// createAll is the rollout without --wait: every event at once.
func (ro *rolloutRun) createAll(ctx context.Context) error {
	for _, n := range ro.nodes {
		if n.started() {
			continue
		}
		if err := ro.create(ctx, n); err != nil {
			return err
		}
	}
	t := count(ro.nodes)
	fmt.Fprintln(ro.o.out, t)
	fmt.Fprintf(ro.o.out, "the agents run at most %d at a time; follow with 'kubectl lifecycle status -l %s=%s'\n", ro.r.maxConcurrent, labelRollout, ro.group)
	if t.failed > 0 {
		return fail(exitFailed, "rollout %s: %d node(s) failed before: %s (re-run with --retry-failed to run them again)", ro.group, t.failed, strings.Join(ro.failedNodes(), ", "))
	}
	return nil
}

func (ro *rolloutRun) failedNodes() []string {
	var out []string
	for _, n := range ro.nodes {
		if n.failed() {
			out = append(out, n.node)
		}
	}
	return out
}

// follow orders the rollout (see next) and reports until nothing runs.
func (ro *rolloutRun) follow(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := startEventCache(wctx, ro.cl.lc, metav1.ListOptions{LabelSelector: labelRollout + "=" + ro.group})
	if err := c.synced(wctx); err != nil {
		if ctx.Err() != nil {
			return fail(exitInterrupted, "interrupted")
		}
		return err
	}
	// Finished before this run: reported in the resume line already.
	for _, n := range ro.nodes {
		n.reported = n.succeeded() || n.failed()
	}
	deadline := ro.o.timeoutC(ro.r.timeout)
	lastSummary, stopNoted := "", false
	pendingSince := map[string]time.Time{}
	for {
		cached := c.list()
		now := ro.o.clock.Now()
		for _, n := range ro.nodes {
			if n.doneByNode || n.gone {
				continue
			}
			if ev, ok := cached[n.event]; ok {
				n.seen = true
				n.observe(ev, now)
			} else if n.seen && n.ev != nil {
				if n.ev.Status.ClaimStatus.Finished() {
					n.ended = true // deleted after it ended: its last status stands
				} else {
					n.gone = true
				}
			}
		}
		for _, n := range ro.nodes {
			if n.reported || !(n.succeeded() || n.failed()) {
				continue
			}
			n.reported = true
			switch {
			case n.gone:
				ro.line("%s: lifecycleevent %s was deleted before it ended (cancelled)", n.node, n.event)
			case n.succeeded():
				ro.line("%s: Succeeded in %s", n.node, eventTook(n.ev))
			default:
				ro.line("%s: %s after %s: %s", n.node, n.ev.Status.ClaimStatus, eventTook(n.ev), oneLine(n.ev.Status.Message, 300))
			}
		}
		start, stopped := next(ro.nodes, ro.r.maxConcurrent, ro.r.maxFailures)
		for _, n := range start {
			if err := ro.create(ctx, n); err != nil {
				return err
			}
		}
		t := count(ro.nodes)
		if s := t.String(); s != lastSummary {
			ro.line("%s", s)
			lastSummary = s
		}
		if stopped && !stopNoted && t.waiting > 0 {
			stopNoted = true
			ro.line("max-failures (%d) reached: starting no more nodes; waiting for the %d running", ro.r.maxFailures, t.running)
		}
		for _, n := range ro.nodes {
			pending := n.ev != nil && !n.gone && (n.ev.Status.ClaimStatus == "" || n.ev.Status.ClaimStatus == v1alpha1.LifecycleEventPending)
			if !pending {
				delete(pendingSince, n.node)
				continue
			}
			since, ok := pendingSince[n.node]
			if !ok {
				pendingSince[n.node] = now
			} else if !since.IsZero() && now.Sub(since) >= pendingHint {
				ro.line("%s: lifecycleevent %s still Pending after %s: is lifecycle-agent running there?", n.node, n.event, compact(pendingHint))
				pendingSince[n.node] = time.Time{} // said once
			}
		}
		if t.running == 0 && (t.waiting == 0 || stopped) {
			return ro.finish(t, stopped)
		}
		select {
		case <-ctx.Done():
			return fail(exitInterrupted, "interrupted: %s; running events go on; re-run the same command to resume", t)
		case <-deadline:
			return fail(exitTimeout, "timed out after %s: %s; running events go on; re-run the same command to resume", ro.r.timeout, t)
		case <-c.changed:
		case <-ro.o.clock.After(time.Second):
		}
	}
}

func (ro *rolloutRun) finish(t tally, stopped bool) error {
	total := len(ro.nodes)
	if t.failed == 0 {
		ro.line("rollout %s complete: %d/%d nodes done", ro.group, t.done, total)
		return nil
	}
	msg := fmt.Sprintf("rollout %s: %d of %d node(s) failed: %s", ro.group, t.failed, total, strings.Join(ro.failedNodes(), ", "))
	if stopped && t.waiting > 0 {
		var ns []string
		for _, n := range ro.nodes {
			if !n.started() {
				ns = append(ns, n.node)
			}
		}
		msg += fmt.Sprintf("; max-failures %d reached, not started: %s", ro.r.maxFailures, strings.Join(ns, ", "))
	}
	msg += "; fix the cause, then re-run the same command with --retry-failed"
	return fail(exitFailed, "%s", msg)
}

// eventTook is claim → completion as the agent recorded them.
func eventTook(ev *v1alpha1.LifecycleEvent) string {
	if ev == nil || ev.Status.CompletionTime == nil {
		return "?"
	}
	from := ev.CreationTimestamp.Time
	if h := ev.Status.Holder; h != nil && h.ClaimTime != nil {
		from = h.ClaimTime.Time
	}
	return apiDuration(ev.Status.CompletionTime.Sub(from))
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// nodeCond is the node's condition of that type, nil when it has none.
func nodeCond(n *corev1.Node, typ string) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}
