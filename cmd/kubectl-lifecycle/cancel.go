package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

func newCancelCmd(o *options) *cobra.Command {
	var (
		wait     bool
		timeout  time.Duration
		selector string
		res      = resultFormats()
	)
	cmd := &cobra.Command{
		Use:   "cancel (EVENT... | -l SELECTOR)",
		Short: "Cancel LifecycleEvents by deleting them",
		Long: `Delete LifecycleEvents. A Pending event is gone at once; a running one is
cancelled by its agent at the next safe point (between steps, or when the
running step can stop): the agent undoes what it owns (its cordon), writes
Failed, removes its finalizer, and the event is gone.

With -l, every unfinished event matching the label selector is cancelled,
e.g. the rest of a rollout. With --wait the command returns once the
events are gone.

-o name prints each deleted event's name; -o json one object when the
command ends: {"events": [{"event", "node", "claimStatus", "cancelled",
"gone"}], "result", "exitCode", "error"}. With either, the progress lines go
to stderr.`,
		Example: `  kubectl lifecycle cancel node-a-drain-x7k2p --wait
  kubectl lifecycle cancel -l lifecycle.x-k8s.io/rollout=drain-3f2a9c1b`,
		Args: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 0) == (selector == "") {
				return usageErr("cancel takes EVENT names or -l SELECTOR (one of the two): usage: %s", cmd.UseLine())
			}
			return nil
		},
		RunE: o.resultE(res, func(ctx context.Context, args []string) error {
			cl, err := o.clients()
			if err != nil {
				return err
			}
			names := args
			var done []cancelledEvent
			last := map[string]*v1alpha1.LifecycleEvent{} // deleted, not seen gone yet (waitGone)
			value := func(code int, msg string) any {
				for i := range done {
					_, there := last[done[i].Event]
					done[i].Gone = wait && !there
				}
				return cancelResult{Events: append([]cancelledEvent{}, done...), outcomeFields: outcomeOf(code, msg)}
			}
			if selector != "" {
				l, err := cl.lc.Events.List(ctx, metav1.ListOptions{LabelSelector: selector})
				if err != nil {
					return fmt.Errorf("list LifecycleEvents: %w", err)
				}
				sortEvents(l.Items)
				for _, ev := range l.Items {
					if !ev.Status.ClaimStatus.Finished() {
						names = append(names, ev.Name)
					}
				}
				if len(names) == 0 {
					res.value = value
					fmt.Fprintf(o.out, "no unfinished LifecycleEvents match %s\n", selector)
					return nil
				}
			}
			for _, name := range names {
				ev, err := cl.lc.Events.Get(ctx, name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return fail(exitFailed, "lifecycleevent %q not found", name)
				}
				if err != nil {
					return fmt.Errorf("get LifecycleEvent %s: %w", name, err)
				}
				bg := metav1.DeletePropagationBackground
				err = cl.lc.Events.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg, Preconditions: &metav1.Preconditions{UID: &ev.UID}})
				if err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("delete LifecycleEvent %s: %w", name, err)
				}
				last[name] = ev
				res.name(name)
				res.value = value
				done = append(done, cancelledEvent{Event: name, Node: ev.Spec.BindingNode, ClaimStatus: claimStatus(ev), Cancelled: !ev.Status.ClaimStatus.Finished()})
				switch {
				case ev.Status.ClaimStatus.Finished():
					fmt.Fprintf(o.out, "lifecycleevent %s deleted (it had already ended %s)\n", name, ev.Status.ClaimStatus)
				case ev.Status.ClaimStatus == v1alpha1.LifecycleEventClaimed:
					at := ""
					if ev.Status.CurrentStep != "" {
						at = " (now in step " + ev.Status.CurrentStep + ")"
					}
					fmt.Fprintf(o.out, "lifecycleevent %s deleted; the agent on node %s cancels it at its next safe point%s\n", name, ev.Spec.BindingNode, at)
				default:
					fmt.Fprintf(o.out, "lifecycleevent %s deleted (it was not claimed yet)\n", name)
				}
			}
			if !wait {
				return nil
			}
			return o.waitGone(ctx, cl, last, timeout)
		}),
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "Wait until the events are gone")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "With --wait: give up after this long (exit 4). 0: no limit")
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "Cancel every unfinished event matching this label selector")
	res.addFlag(cmd)
	return cmd
}

// waitGone waits until every named event is gone and says how each ended.
func (o *options) waitGone(ctx context.Context, cl *clients, last map[string]*v1alpha1.LifecycleEvent, timeout time.Duration) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sel := metav1.ListOptions{}
	if len(last) == 1 {
		sel.FieldSelector = "metadata.name=" + sortedKeys(last)[0]
	}
	c := startEventCache(wctx, cl.lc, sel)
	if err := c.synced(wctx); err != nil {
		return err
	}
	deadline := o.timeoutC(timeout)
	for {
		for name, prev := range last {
			if ev, ok := c.get(name); ok && ev.UID == prev.UID {
				last[name] = ev
				continue
			}
			end := string(prev.Status.ClaimStatus)
			if end == "" {
				end = "Pending"
			}
			if prev.Status.Message != "" {
				end += ": " + oneLine(prev.Status.Message, 200)
			}
			how := "gone"
			if !prev.Status.ClaimStatus.Finished() {
				how = "cancelled" // deleted before an end state: no end state is written
			}
			fmt.Fprintf(o.out, "lifecycleevent %s %s (last status %s)\n", name, how, end)
			delete(last, name)
		}
		if len(last) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fail(exitInterrupted, "interrupted while waiting for %s to go", strings.Join(sortedKeys(last), ", "))
		case <-deadline:
			return fail(exitTimeout, "timed out after %s; still there: %s", timeout, strings.Join(sortedKeys(last), ", "))
		case <-c.changed:
		}
	}
}
