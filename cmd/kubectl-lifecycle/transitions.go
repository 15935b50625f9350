package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

func newTransitionsCmd(o *options) *cobra.Command {
	var out *outputFlags
	cmd := &cobra.Command{
		Use:     "transitions [NODE]",
		Aliases: []string{"transition", "lt"},
		Short:   "List what each node's agent can do",
		Long: `List the LifecycleTransitions: what each node's lifecycle-agent can do, with
the driver that does it and its SLA. With NODE, only those that apply to
that node (published for it, or for all nodes or a selector matching it).`,
		Example: `  kubectl lifecycle transitions
  kubectl lifecycle transitions node-a
  kubectl lifecycle transitions node-a -o yaml`,
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
			node := ""
			if len(args) == 1 {
				node = args[0]
			}
			items, err := transitionsFor(ctx, cl, node)
			if err != nil {
				return err
			}
			if p != nil {
				return p.PrintObj(typedTransitions(items), o.out)
			}
			if len(items) == 0 {
				if node != "" {
					fmt.Fprintf(o.errOut, "No transitions found for node %s: is lifecycle-agent running there?\n", node)
				} else {
					fmt.Fprintln(o.errOut, "No transitions found: no lifecycle-agent has published any.")
				}
				return nil
			}
			header := []string{"NODE", "TRANSITION", "START", "END", "DRIVER", "SLA"}
			if out.wide() {
				header = append(header, "AGE")
			}
			t := newTable(o.out, header...)
			now := o.clock.Now()
			for _, lt := range items {
				sla := ""
				if lt.Spec.Sla != nil {
					sla = compact(lt.Spec.Sla.Duration)
				}
				row := []string{transitionNodes(&lt, node), lt.Name, string(lt.Spec.Start), string(lt.Spec.End), lt.Spec.Driver, sla}
				if out.wide() {
					row = append(row, age(lt.CreationTimestamp, now))
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

// transitionsFor lists every transition, or those that apply to node,
// sorted by node and name.
func transitionsFor(ctx context.Context, cl *clients, node string) ([]v1alpha1.LifecycleTransition, error) {
	var n *corev1.Node
	if node != "" {
		var err error
		n, err = cl.core.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fail(exitFailed, "node %q not found", node)
		}
		if err != nil {
			return nil, fmt.Errorf("get node %s: %w", node, err)
		}
	}
	l, err := cl.lc.Transitions.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list LifecycleTransitions: %w", err)
	}
	var items []v1alpha1.LifecycleTransition
	for _, lt := range l.Items {
		if n != nil {
			ok, err := apiclient.TransitionApplies(&lt, n)
			if err != nil || !ok {
				continue
			}
		}
		items = append(items, lt)
	}
	sort.Slice(items, func(i, j int) bool {
		a, b := transitionNodes(&items[i], ""), transitionNodes(&items[j], "")
		if a != b {
			return a < b
		}
		return items[i].Name < items[j].Name
	})
	return items, nil
}

// transitionNodes is the NODE column: the node, <all> or <selector>.
func transitionNodes(lt *v1alpha1.LifecycleTransition, node string) string {
	switch {
	case node != "":
		return node
	case lt.Spec.NodeName != nil:
		return *lt.Spec.NodeName
	case lt.Spec.AllNodes != nil && *lt.Spec.AllNodes:
		return "<all>"
	}
	return "<selector>"
}

// driverShort is the last part of a driver name: lifecycle-agent.x-k8s.io/drain → drain.
func driverShort(driver string) string { return driver[strings.LastIndex(driver, "/")+1:] }

// offers describes what a node's transitions offer: "drain (node-a-drain), …".
func offers(items []v1alpha1.LifecycleTransition) string {
	var parts []string
	for _, lt := range items {
		parts = append(parts, fmt.Sprintf("%s (%s)", driverShort(lt.Spec.Driver), lt.Name))
	}
	return strings.Join(parts, ", ")
}

// resolveTransition finds the transition <node>-<driver> and checks that
// it is done by that driver. Anything else is a usage error that lists
// what the node offers.
func resolveTransition(ctx context.Context, cl *clients, driver, node string) (*v1alpha1.LifecycleTransition, error) {
	short := driverShort(driver)
	if short == "" {
		return nil, usageErr("driver %q: want a name such as drain or lifecycle-agent.x-k8s.io/drain", driver)
	}
	name := node + "-" + short
	lt, err := cl.lc.Transitions.Get(ctx, name, metav1.GetOptions{})
	if err == nil && driverShort(lt.Spec.Driver) == short && (!strings.Contains(driver, "/") || lt.Spec.Driver == driver) {
		return lt, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("get LifecycleTransition %s: %w", name, err)
	}
	if err == nil {
		return nil, usageErr("LifecycleTransition %s is done by driver %s, not %s", name, lt.Spec.Driver, driver)
	}
	items, lerr := transitionsFor(ctx, cl, node)
	if lerr != nil {
		return nil, usageErr("node %s has no transition %s: %v", node, name, lerr)
	}
	if len(items) == 0 {
		return nil, usageErr("node %s has no transition %s: no transitions are published for it (is lifecycle-agent running there?)", node, name)
	}
	return nil, usageErr("node %s has no transition %s; it offers: %s", node, name, offers(items))
}
