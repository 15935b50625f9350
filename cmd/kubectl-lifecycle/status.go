package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

func newStatusCmd(o *options) *cobra.Command {
	var out *outputFlags
	var selector string
	cmd := &cobra.Command{
		Use:   "status [NODE|EVENT]",
		Short: "Show LifecycleEvents: all, a node's, or one event in detail",
		Long: `Without an argument: a table of every LifecycleEvent (NAME NODE TRANSITION
STATUS STEP AGE). With a NODE: that node's events and its lifecycle
conditions. With an EVENT: its steps (state, attempt, times), its conditions
and its node's lifecycle conditions (LifecycleTransition, MaintenancePlanned,
DrainInProgress, Drained, MaintenanceInProgress, GracefulNodeShutdownInProgress,
GPUHealthy).`,
		Example: `  kubectl lifecycle status
  kubectl lifecycle status node-a
  kubectl lifecycle status node-a-drain-x7k2p
  kubectl lifecycle status -l lifecycle.x-k8s.io/rollout=drain-3f2a9c1b -o wide`,
		Args: argsBetween(0, 1),
		RunE: o.runE(func(ctx context.Context, args []string) error {
			p, err := out.printer()
			if err != nil {
				return err
			}
			cl, err := o.clients()
			if err != nil {
				return err
			}
			opts := metav1.ListOptions{LabelSelector: selector}
			var node *corev1.Node
			if len(args) == 1 {
				ev, err := cl.lc.Events.Get(ctx, args[0], metav1.GetOptions{})
				switch {
				case err == nil:
					if p != nil {
						ev.APIVersion, ev.Kind = v1alpha1.SchemeGroupVersion.String(), "LifecycleEvent"
						return p.PrintObj(ev, o.out)
					}
					return o.describe(ctx, cl, ev)
				case !apierrors.IsNotFound(err):
					return fmt.Errorf("get LifecycleEvent %s: %w", args[0], err)
				}
				node, err = cl.core.CoreV1().Nodes().Get(ctx, args[0], metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return fail(exitFailed, "no LifecycleEvent and no Node named %q", args[0])
				}
				if err != nil {
					return fmt.Errorf("get node %s: %w", args[0], err)
				}
				opts.FieldSelector = apiclient.BindingNodeSelector(node.Name).FieldSelector
			}
			l, err := cl.lc.Events.List(ctx, opts)
			if err != nil {
				return fmt.Errorf("list LifecycleEvents: %w", err)
			}
			sortEvents(l.Items)
			if p != nil {
				return p.PrintObj(typedEvents(l.Items), o.out)
			}
			if len(l.Items) == 0 {
				fmt.Fprintln(o.errOut, "No LifecycleEvents found.")
			} else {
				o.eventTable(l.Items, out.wide())
			}
			if node != nil {
				fmt.Fprintf(o.out, "\nNode %s:\n", node.Name)
				o.nodeBlock(o.out, node)
			}
			return nil
		}),
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "Label selector of the events, e.g. lifecycle.x-k8s.io/rollout=GROUP")
	out = addOutputFlags(cmd)
	return cmd
}

func (o *options) eventTable(items []v1alpha1.LifecycleEvent, wide bool) {
	header := []string{"NAME", "NODE", "TRANSITION", "STATUS", "STEP", "AGE"}
	if wide {
		header = append(header, "DRIVER", "HOLDER", "ROLLOUT", "MESSAGE")
	}
	t := newTable(o.out, header...)
	now := o.clock.Now()
	for i := range items {
		ev := &items[i]
		row := []string{ev.Name, ev.Spec.BindingNode, ev.Spec.TransitionName, phase(ev), ev.Status.CurrentStep, age(ev.CreationTimestamp, now)}
		if wide {
			holder := ""
			if ev.Status.Holder != nil {
				holder = ev.Status.Holder.Identity
			}
			row = append(row, ev.Status.Driver.Name, holder, ev.Labels[labelRollout], oneLine(ev.Status.Message, 120))
		}
		t.row(row...)
	}
	t.flush()
}

// describe prints one event in detail, then its node's lifecycle conditions.
func (o *options) describe(ctx context.Context, cl *clients, ev *v1alpha1.LifecycleEvent) error {
	now := o.clock.Now()
	w := o.out
	st := ev.Status
	kv := func(k, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-13s %s\n", k+":", v)
		}
	}
	kv("Name", ev.Name)
	kv("Node", ev.Spec.BindingNode)
	tr := ev.Spec.TransitionName
	if st.Driver.Name != "" {
		tr += fmt.Sprintf(" (%s: %s -> %s)", st.Driver.Name, st.Driver.Start, st.Driver.End)
	}
	kv("Transition", tr)
	kv("Status", phase(ev))
	kv("Step", st.CurrentStep)
	kv("Message", st.Message)
	kv("Created", fmt.Sprintf("%s (%s ago)", timestamp(&ev.CreationTimestamp), age(ev.CreationTimestamp, now)))
	if h := st.Holder; h != nil {
		c := "by " + h.Identity
		if h.ClaimTime != nil {
			c = timestamp(h.ClaimTime) + " " + c
		}
		if h.BootID != "" {
			c += ", boot " + h.BootID
		}
		kv("Claimed", c)
		if h.RenewTime != nil && !st.ClaimStatus.Finished() {
			kv("Renewed", fmt.Sprintf("%s (%s ago)", timestamp(h.RenewTime), age(*h.RenewTime, now)))
		}
	}
	if st.Sla != nil {
		kv("SLA deadline", timestamp(st.Sla))
	}
	if st.CompletionTime != nil {
		c := timestamp(st.CompletionTime)
		if st.Holder != nil && st.Holder.ClaimTime != nil {
			c += " (took " + apiDuration(st.CompletionTime.Sub(st.Holder.ClaimTime.Time)) + ")"
		}
		kv("Completed", c)
	}
	if ev.DeletionTimestamp != nil {
		kv("Deleting", timestamp(ev.DeletionTimestamp)+" (the agent cancels it at its next safe point)")
	}
	if len(ev.Spec.Parameters) > 0 {
		var ps []string
		for k, v := range ev.Spec.Parameters {
			ps = append(ps, k+"="+v)
		}
		sort.Strings(ps)
		kv("Parameters", strings.Join(ps, " "))
	}
	if d := ev.Spec.Disruption; d != nil {
		kv("Disruption", fmt.Sprintf("group %s, maxConcurrent %d", d.Group, d.MaxConcurrent))
	}
	if g := ev.Labels[labelRollout]; g != "" {
		kv("Rollout", g)
	}
	if len(st.Steps) > 0 {
		fmt.Fprintln(w, "Steps:")
		t := newTable(indent(w), "STEP", "STATE", "ATTEMPT", "STARTED", "FINISHED", "DURATION", "MESSAGE")
		for _, s := range st.Steps {
			attempt, dur := "", ""
			if s.Attempt > 0 {
				attempt = fmt.Sprint(s.Attempt)
			}
			if s.StartTime != nil && s.FinishTime != nil {
				dur = apiDuration(s.FinishTime.Sub(s.StartTime.Time))
			}
			t.row(s.Name, string(s.State), attempt, timestamp(s.StartTime), timestamp(s.FinishTime), dur, oneLine(s.Message, 120))
		}
		t.flush()
	}
	if len(st.Conditions) > 0 {
		fmt.Fprintln(w, "Conditions:")
		t := newTable(indent(w), "TYPE", "STATUS", "REASON", "AGE", "MESSAGE")
		for _, c := range st.Conditions {
			t.row(c.Type, string(c.Status), c.Reason, age(c.LastTransitionTime, now), oneLine(c.Message, 120))
		}
		t.flush()
	}
	node, err := cl.core.CoreV1().Nodes().Get(ctx, ev.Spec.BindingNode, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		fmt.Fprintf(w, "Node %s: not found\n", ev.Spec.BindingNode)
	case err != nil:
		fmt.Fprintf(w, "Node %s: %v\n", ev.Spec.BindingNode, err)
	default:
		fmt.Fprintf(w, "Node %s:\n", node.Name)
		o.nodeBlock(w, node)
	}
	return nil
}

// nodeBlock prints whether the node is cordoned (and by whom) and its
// lifecycle conditions.
func (o *options) nodeBlock(w io.Writer, node *corev1.Node) {
	sched := "schedulable"
	if node.Spec.Unschedulable {
		sched = "cordoned"
		if by := node.Annotations[v1alpha1.AnnotationCordonedBy]; by != "" {
			sched += " by lifecycle-agent for " + by
		} else {
			sched += " (not by lifecycle-agent)"
		}
	}
	fmt.Fprintf(w, "  %s\n", sched)
	var conds []corev1.NodeCondition
	for _, typ := range v1alpha1.NodeConditionTypes {
		for _, c := range node.Status.Conditions {
			if string(c.Type) == typ {
				conds = append(conds, c)
			}
		}
	}
	if len(conds) == 0 {
		fmt.Fprintln(w, "  no lifecycle conditions")
		return
	}
	t := newTable(indent(w), "CONDITION", "STATUS", "REASON", "AGE", "MESSAGE")
	now := o.clock.Now()
	for _, c := range conds {
		t.row(string(c.Type), string(c.Status), c.Reason, age(c.LastTransitionTime, now), oneLine(c.Message, 120))
	}
	t.flush()
}

// indent prefixes each line written through it with two spaces.
type indentWriter struct {
	w       io.Writer
	midLine bool
}

func indent(w io.Writer) io.Writer { return &indentWriter{w: w} }

func (i *indentWriter) Write(p []byte) (int, error) {
	var b strings.Builder
	for _, c := range string(p) {
		if !i.midLine {
			b.WriteString("  ")
		}
		b.WriteRune(c)
		i.midLine = c != '\n'
	}
	if _, err := io.WriteString(i.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}

func newHistoryCmd(o *options) *cobra.Command {
	var out *outputFlags
	cmd := &cobra.Command{
		Use:   "history [NODE]",
		Short: "List finished LifecycleEvents (Succeeded, Failed, SlaExpired) with completion times and messages",
		Long: `List the finished LifecycleEvents of NODE (or of every node), oldest first,
with when they completed, how long they took and their last message.

Finished events are kept in the API for the agents' eventRetention (24h by
default); older history is in each node's journal ('lifecycle-agent journal
export' on the node).`,
		Example: `  kubectl lifecycle history node-a
  kubectl lifecycle history -o wide`,
		Args: argsBetween(0, 1),
		RunE: o.runE(func(ctx context.Context, args []string) error {
			p, err := out.printer()
			if err != nil {
				return err
			}
			cl, err := o.clients()
			if err != nil {
				return err
			}
			opts := metav1.ListOptions{}
			node := ""
			if len(args) == 1 {
				node = args[0]
				opts = apiclient.BindingNodeSelector(node)
			}
			l, err := cl.lc.Events.List(ctx, opts)
			if err != nil {
				return fmt.Errorf("list LifecycleEvents: %w", err)
			}
			var items []v1alpha1.LifecycleEvent
			for _, ev := range l.Items {
				if ev.Status.ClaimStatus.Finished() {
					items = append(items, ev)
				}
			}
			sort.SliceStable(items, func(i, j int) bool { return completed(&items[i]).Before(completed(&items[j])) })
			if p != nil {
				return p.PrintObj(typedEvents(items), o.out)
			}
			if len(items) == 0 {
				what := "any node"
				if node != "" {
					what = "node " + node
				}
				fmt.Fprintf(o.errOut, "No finished LifecycleEvents for %s (finished events are kept for the agents' eventRetention, 24h by default).\n", what)
				return nil
			}
			header := []string{"NAME"}
			if node == "" {
				header = append(header, "NODE")
			}
			header = append(header, "TRANSITION", "STATUS", "COMPLETED", "DURATION", "MESSAGE")
			if out.wide() {
				header = append(header, "HOLDER", "ROLLOUT")
			}
			t := newTable(o.out, header...)
			for i := range items {
				ev := &items[i]
				row := []string{ev.Name}
				if node == "" {
					row = append(row, ev.Spec.BindingNode)
				}
				dur := ""
				if h := ev.Status.Holder; h != nil && h.ClaimTime != nil && ev.Status.CompletionTime != nil {
					dur = apiDuration(ev.Status.CompletionTime.Sub(h.ClaimTime.Time))
				}
				msgLen := 80
				if out.wide() {
					msgLen = 400
				}
				row = append(row, ev.Spec.TransitionName, string(ev.Status.ClaimStatus), timestamp(ev.Status.CompletionTime), dur, oneLine(ev.Status.Message, msgLen))
				if out.wide() {
					holder := ""
					if ev.Status.Holder != nil {
						holder = ev.Status.Holder.Identity
					}
					row = append(row, holder, ev.Labels[labelRollout])
				}
				t.row(row...)
			}
			t.flush()
			return nil
		}),
	}
	out = addOutputFlags(cmd)
	return cmd
}

// completed is when the event ended (its creation if the agent wrote no
// completion time).
func completed(ev *v1alpha1.LifecycleEvent) time.Time {
	if ev.Status.CompletionTime != nil {
		return ev.Status.CompletionTime.Time
	}
	return ev.CreationTimestamp.Time
}
