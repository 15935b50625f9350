package readiness

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// The checks, as readinessChecks names them.
const (
	CheckDaemonSets = "daemonsets"
	CheckResources  = "resources"
	CheckConditions = "conditions"
	CheckCommand    = "command"
)

// Checks is every check, in the order NotReady reports them.
var Checks = []string{CheckDaemonSets, CheckResources, CheckConditions, CheckCommand}

// Param is the per-event parameter that narrows the checks.
const Param = "readinessChecks"

// Snapshot is what the node had at claim.
type Snapshot struct {
	// Allocatable is each extended resource's allocatable count.
	Allocatable map[string]int64 `json:"allocatable,omitempty"`
	// DaemonSets are namespace/name of the DaemonSets with a Ready pod on
	// the node, sorted.
	DaemonSets []string `json:"daemonSets,omitempty"`
}

// Encode is the snapshot as the plan journals it.
func (s Snapshot) Encode() string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Decode reads Encode's form.
func Decode(v string) (Snapshot, error) {
	var s Snapshot
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return s, fmt.Errorf("readiness: the snapshot journaled at claim is unreadable: %w", err)
	}
	return s, nil
}

// API is what the checks read (*apiclient.Client implements it).
type API interface {
	GetNode(ctx context.Context) (*corev1.Node, error)
	// NodePods lists the pods bound to this node.
	NodePods(ctx context.Context) ([]corev1.Pod, error)
}

// Config is readiness.* (and what the agent adds: GPUHealthy where the GPU
// stack runs).
type Config struct {
	// Enabled are the checks run when an event names none; nil: daemonsets,
	// resources, conditions (and command when Command is set).
	Enabled []string
	// Conditions are Node condition types and their healthy status.
	Conditions map[string]corev1.ConditionStatus
	// Command, when set, must exit 0 (run by the caller's runner).
	Command        []string
	CommandTimeout time.Duration
	// Timeout bounds the wait; 0 means DefaultTimeout.
	Timeout time.Duration
	// Uncordon, when true, lets a timed-out event's abort lift the cordon
	// (readiness.onTimeout: uncordon); false keeps the node cordoned.
	Uncordon bool
	// DaemonSets narrows the DaemonSets the claim-time snapshot requires;
	// the zero value: every DaemonSet with a Ready pod on the node.
	DaemonSets DaemonSetFilter
}

// DaemonSetFilter selects the DaemonSets the daemonsets check requires
// (readiness.daemonSets.*). The agent, as the node, may read only its own
// pods, not DaemonSet objects: the selector is matched against the labels
// of the DaemonSet's pod on the node (its pod template's labels).
type DaemonSetFilter struct {
	// Namespaces, when set, are the only namespaces whose DaemonSets count.
	Namespaces []string
	// Selector, when set, must match the pod's labels.
	Selector labels.Selector
}

// NewDaemonSetFilter parses namespaces and a label selector (kubectl's
// syntax; "" selects all), naming what is wrong.
func NewDaemonSetFilter(namespaces []string, selector string) (DaemonSetFilter, error) {
	var f DaemonSetFilter
	for _, ns := range namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return f, fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
		}
	}
	f.Namespaces = slices.Clone(namespaces)
	if strings.TrimSpace(selector) != "" {
		sel, err := labels.Parse(selector)
		if err != nil {
			return f, fmt.Errorf("invalid label selector: %v", err)
		}
		f.Selector = sel
	}
	return f, nil
}

// selects reports whether p's DaemonSet counts.
func (f DaemonSetFilter) selects(p *corev1.Pod) bool {
	if len(f.Namespaces) > 0 && !slices.Contains(f.Namespaces, p.Namespace) {
		return false
	}
	return f.Selector == nil || f.Selector.Matches(labels.Set(p.Labels))
}

// Defaults.
const (
	DefaultTimeout        = 10 * time.Minute
	DefaultCommandTimeout = 30 * time.Second
)

// Selected returns the checks to run for an event's readinessChecks value
// ("" the configured ones, "none", or a comma list), or an error naming
// the parameter.
func (c Config) Selected(param string) ([]string, error) {
	switch strings.TrimSpace(param) {
	case "":
		if c.Enabled != nil {
			// The command check is configured by default and means nothing
			// until readiness.command is set: not named then.
			return slices.DeleteFunc(slices.Clone(c.Enabled), func(s string) bool { return s == CheckCommand && len(c.Command) == 0 }), nil
		}
		out := []string{CheckDaemonSets, CheckResources, CheckConditions}
		if len(c.Command) > 0 {
			out = append(out, CheckCommand)
		}
		return out, nil
	case "none":
		return []string{}, nil
	}
	var out []string
	for _, s := range strings.Split(param, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(Checks, s) {
			return nil, fmt.Errorf("parameters.%s: %q is not one of none, %s", Param, s, strings.Join(Checks, ", "))
		}
		if s == CheckCommand && len(c.Command) == 0 {
			return nil, fmt.Errorf("parameters.%s: command: readiness.command is not configured on this node", Param)
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// Extended reports whether a resource name is an extended resource: a
// domain-prefixed name outside kubernetes.io (nvidia.com/gpu, …).
func Extended(name corev1.ResourceName) bool {
	domain, _, ok := strings.Cut(string(name), "/")
	return ok && domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io")
}

// Take reads the snapshot from the Node and its pods: the DaemonSets that
// c.DaemonSets selects. Only the snapshot is filtered: the checks require
// what it lists, so an event keeps the filter of its claim after the
// configuration changes (the snapshot is journaled with the plan).
func (c Config) Take(ctx context.Context, api API) (Snapshot, error) {
	var s Snapshot
	node, err := api.GetNode(ctx)
	if err != nil {
		return s, fmt.Errorf("readiness: reading the Node: %w", err)
	}
	for name, q := range node.Status.Allocatable {
		if Extended(name) {
			if s.Allocatable == nil {
				s.Allocatable = map[string]int64{}
			}
			s.Allocatable[string(name)] = q.Value()
		}
	}
	pods, err := api.NodePods(ctx)
	if err != nil {
		return s, fmt.Errorf("readiness: listing the node's pods: %w", err)
	}
	// Not judged against the boot: a pod Ready now, whatever boot it is
	// from, is what the node has and must have again.
	s.DaemonSets, _ = readyDaemonSets(slices.DeleteFunc(pods, func(p corev1.Pod) bool { return !c.DaemonSets.selects(&p) }), time.Time{})
	return s, nil
}

// daemonSetOf names the DaemonSet that controls p, or "".
func daemonSetOf(p *corev1.Pod) string {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			return p.Namespace + "/" + o.Name
		}
	}
	return ""
}

// podReady: running, not terminating, and Ready (kubectl's podutils,
// through apiclient, judges the condition, as the drain's budget cache does).
func podReady(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && apiclient.PodReady(p)
}

// readyDaemonSets names the DaemonSets with a Ready pod among pods, and,
// when boot is not zero, those whose only Ready pod became Ready before boot
// (stale): the status a previous boot left, until this boot's kubelet posts
// the pod's own.
func readyDaemonSets(pods []corev1.Pod, boot time.Time) (ready []string, stale map[string]time.Time) {
	for i := range pods {
		ds := daemonSetOf(&pods[i])
		if ds == "" || !podReady(&pods[i]) || slices.Contains(ready, ds) {
			continue
		}
		if since, ok := readySince(&pods[i]); ok && !boot.IsZero() && since.Before(boot.Truncate(time.Second)) {
			if stale == nil {
				stale = map[string]time.Time{}
			}
			stale[ds] = since
			continue
		}
		ready = append(ready, ds)
	}
	sort.Strings(ready)
	return ready, stale
}

// readySince is when p's Ready condition (the first, the one podReady
// judges) last changed: the kubelet sets it to True with the time. ok is
// false when the condition carries no time, as a status not written by a
// kubelet may.
func readySince(p *corev1.Pod) (time.Time, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.LastTransitionTime.Time, !c.LastTransitionTime.IsZero()
		}
	}
	return time.Time{}, false
}

// Runner runs the readiness command (HostOps.Run).
type Runner func(ctx context.Context, argv []string, timeout time.Duration) error

// NotReady lists what is not back yet among checks: nothing means ready.
// An error is the API's (the caller retries). boot is when the current boot
// began (drivers.HostOps.BootTime; zero when unknown): a DaemonSet pod
// counts as Ready only when its Ready condition became True at or after it,
// so that the status a previous boot left on the API server (Ready, the old
// container) is not taken for this boot's. The comparison is in whole
// seconds, as the API stores the time.
func (c Config) NotReady(ctx context.Context, api API, snap Snapshot, checks []string, run Runner, boot time.Time) ([]string, error) {
	var out []string
	var node *corev1.Node
	if slices.Contains(checks, CheckResources) || slices.Contains(checks, CheckConditions) {
		n, err := api.GetNode(ctx)
		if err != nil {
			return nil, fmt.Errorf("readiness: reading the Node: %w", err)
		}
		node = n
	}
	if slices.Contains(checks, CheckDaemonSets) && len(snap.DaemonSets) > 0 {
		pods, err := api.NodePods(ctx)
		if err != nil {
			return nil, fmt.Errorf("readiness: listing the node's pods: %w", err)
		}
		ready, stale := readyDaemonSets(pods, boot)
		for _, ds := range snap.DaemonSets {
			switch since, isStale := stale[ds]; {
			case slices.Contains(ready, ds):
			case isStale:
				out = append(out, fmt.Sprintf("DaemonSet %s has no Ready pod on the node (its pod's Ready is from before this boot: since %s, the boot began %s)",
					ds, since.UTC().Format(time.RFC3339), boot.UTC().Format(time.RFC3339)))
			default:
				out = append(out, "DaemonSet "+ds+" has no Ready pod on the node")
			}
		}
	}
	if slices.Contains(checks, CheckResources) {
		names := make([]string, 0, len(snap.Allocatable))
		for n := range snap.Allocatable {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			want := snap.Allocatable[n]
			var have int64
			if q, ok := node.Status.Allocatable[corev1.ResourceName(n)]; ok {
				have = q.Value()
			}
			if have < want {
				out = append(out, fmt.Sprintf("allocatable %s is %d of %d", n, have, want))
			}
		}
	}
	if slices.Contains(checks, CheckConditions) {
		types := make([]string, 0, len(c.Conditions))
		for t := range c.Conditions {
			types = append(types, t)
		}
		sort.Strings(types)
		for _, t := range types {
			want := c.Conditions[t]
			got := corev1.ConditionUnknown
			reason := "not reported"
			for _, cond := range node.Status.Conditions {
				if string(cond.Type) == t {
					got, reason = cond.Status, cond.Reason
				}
			}
			if got != want {
				out = append(out, fmt.Sprintf("condition %s is %s (%s), want %s", t, got, reason, want))
			}
		}
	}
	if slices.Contains(checks, CheckCommand) && len(c.Command) > 0 && run != nil {
		timeout := c.CommandTimeout
		if timeout <= 0 {
			timeout = DefaultCommandTimeout
		}
		if err := run(ctx, c.Command, timeout); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			out = append(out, fmt.Sprintf("readiness.command %s: %v", c.Command[0], err))
		}
	}
	return out, nil
}
