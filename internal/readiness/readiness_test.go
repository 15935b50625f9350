package readiness

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSelected(t *testing.T) {
	withCmd := Config{Command: []string{"/bin/true"}}
	for _, tc := range []struct {
		cfg     Config
		param   string
		want    string
		wantErr string
	}{
		{param: "", want: "daemonsets,resources,conditions"},
		{cfg: withCmd, param: "", want: "daemonsets,resources,conditions,command"},
		{cfg: Config{Enabled: []string{}}, param: "", want: ""},
		{cfg: Config{Enabled: []string{"daemonsets", "command"}}, param: "", want: "daemonsets"},
		{param: "none", want: ""},
		{param: "resources, daemonsets,resources", want: "resources,daemonsets"},
		{param: "command", wantErr: "readiness.command is not configured"},
		{param: "gpus", wantErr: `parameters.readinessChecks: "gpus" is not one of none, daemonsets, resources, conditions, command`},
	} {
		got, err := tc.cfg.Selected(tc.param)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Selected(%q) err = %v, want %q", tc.param, err, tc.wantErr)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != tc.want {
			t.Errorf("Selected(%q) = %q, %v; want %q", tc.param, got, err, tc.want)
		}
	}
}

func TestExtended(t *testing.T) {
	for name, want := range map[corev1.ResourceName]bool{
		"nvidia.com/gpu": true, "example.com/fpga": true, "rdma/hca": true,
		"cpu": false, "memory": false, "hugepages-2Mi": false, "pods": false,
		"kubernetes.io/batch": false, "node.kubernetes.io/x": false,
	} {
		if got := Extended(name); got != want {
			t.Errorf("Extended(%s) = %v, want %v", name, got, want)
		}
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	s := Snapshot{Allocatable: map[string]int64{"nvidia.com/gpu": 8}, DaemonSets: []string{"kube-system/kube-proxy"}}
	got, err := Decode(s.Encode())
	if err != nil || got.Allocatable["nvidia.com/gpu"] != 8 || got.DaemonSets[0] != "kube-system/kube-proxy" {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	if _, err := Decode("{"); err == nil || !strings.Contains(err.Error(), "unreadable") {
		t.Errorf("bad snapshot: %v", err)
	}
}

// nodeAPI is a fixed Node and pod list.
type nodeAPI struct {
	node corev1.Node
	pods []corev1.Pod
}

func (a *nodeAPI) GetNode(context.Context) (*corev1.Node, error) { n := a.node; return &n, nil }
func (a *nodeAPI) NodePods(context.Context) ([]corev1.Pod, error) {
	return slices.Clone(a.pods), nil
}

// dsPod is a pod of DaemonSet ns/name on the node, labelled app=name.
func dsPod(ns, name string, ready bool) corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	yes := true
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-x", Labels: map[string]string{"app": name},
			OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: name, Controller: &yes}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// readiness.daemonSets.namespaces and .selector narrow the DaemonSets the
// snapshot at claim requires, so one outside them that is not back does
// not hold the node.
func TestDaemonSetFilter(t *testing.T) {
	api := &nodeAPI{pods: []corev1.Pod{
		dsPod("kube-system", "cni", true),
		dsPod("gpu-operator", "nvidia-device-plugin", true),
		dsPod("monitoring", "node-exporter", true),
		dsPod("kube-system", "kube-proxy", false), // not Ready at claim: never required
	}}
	for _, tc := range []struct {
		name       string
		namespaces []string
		selector   string
		want       string
	}{
		{name: "default: every Ready one", want: "gpu-operator/nvidia-device-plugin,kube-system/cni,monitoring/node-exporter"},
		{name: "namespaces", namespaces: []string{"kube-system", "gpu-operator"}, want: "gpu-operator/nvidia-device-plugin,kube-system/cni"},
		{name: "selector", selector: "app in (cni,nvidia-device-plugin)", want: "gpu-operator/nvidia-device-plugin,kube-system/cni"},
		{name: "both", namespaces: []string{"kube-system"}, selector: "app!=cni", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := NewDaemonSetFilter(tc.namespaces, tc.selector)
			if err != nil {
				t.Fatal(err)
			}
			cfg := Config{DaemonSets: f}
			snap, err := cfg.Take(context.Background(), api)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(snap.DaemonSets, ","); got != tc.want {
				t.Errorf("snapshot DaemonSets %q, want %q", got, tc.want)
			}
		})
	}

	// The monitoring DaemonSet's pod is not Ready after the reboot: it
	// holds the node only when the filter selected it at claim.
	f, _ := NewDaemonSetFilter([]string{"kube-system"}, "")
	cfg := Config{DaemonSets: f}
	snap, err := cfg.Take(context.Background(), api)
	if err != nil {
		t.Fatal(err)
	}
	after := &nodeAPI{pods: []corev1.Pod{dsPod("kube-system", "cni", true), dsPod("monitoring", "node-exporter", false)}}
	if got, err := cfg.NotReady(context.Background(), after, snap, []string{CheckDaemonSets}, nil, time.Time{}); err != nil || len(got) != 0 {
		t.Errorf("with readiness.daemonSets.namespaces [kube-system]: not ready %q %v, want ready", got, err)
	}
	all, err := Config{}.Take(context.Background(), api)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := (Config{}).NotReady(context.Background(), after, all, []string{CheckDaemonSets}, nil, time.Time{}); strings.Join(got, "|") != "DaemonSet gpu-operator/nvidia-device-plugin has no Ready pod on the node|DaemonSet monitoring/node-exporter has no Ready pod on the node" {
		t.Errorf("with no filter: not ready %q", got)
	}
}

// readyAt sets when pod's Ready condition last changed.
func readyAt(p corev1.Pod, at time.Time) corev1.Pod {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			p.Status.Conditions[i].LastTransitionTime = metav1.NewTime(at)
		}
	}
	return p
}

// After a reboot the API server still shows each DaemonSet pod as the old
// boot left it, Ready, until the new boot's kubelet posts its status (seen
// in the VM scenario TestRealNode/RebootWithPods: the agent uncordoned in
// that window). A pod counts as Ready only when it became Ready in this
// boot; at claim (Take) a Ready pod counts whatever its boot.
func TestDaemonSetReadyFromAnEarlierBoot(t *testing.T) {
	boot := time.Date(2026, 12, 6, 18, 57, 0, 0, time.UTC)
	before := boot.Add(-40 * time.Minute)
	api := &nodeAPI{pods: []corev1.Pod{
		readyAt(dsPod("kube-system", "node-agent", true), before),
		readyAt(dsPod("gpu-operator", "nvidia-device-plugin", true), before),
	}}
	snap, err := Config{}.Take(context.Background(), api)
	if err != nil || strings.Join(snap.DaemonSets, ",") != "gpu-operator/nvidia-device-plugin,kube-system/node-agent" {
		t.Fatalf("snapshot %q %v: want both, Ready at claim", snap.DaemonSets, err)
	}
	checks := []string{CheckDaemonSets}

	// The new boot's kubelet has posted the device plugin's pod (Ready 20 s
	// into the boot), not yet node-agent's: that one is not ready.
	api.pods[1] = readyAt(api.pods[1], boot.Add(20*time.Second))
	got, err := Config{}.NotReady(context.Background(), api, snap, checks, nil, boot)
	want := "DaemonSet kube-system/node-agent has no Ready pod on the node (its pod's Ready is from before this boot: since 2026-12-06T18:17:00Z, the boot began 2026-12-06T18:57:00Z)"
	if err != nil || strings.Join(got, "|") != want {
		t.Fatalf("not ready %q %v, want %q", got, err, want)
	}
	// Without the boot time (unknown) the stale status is taken as it reads.
	if got, err := (Config{}).NotReady(context.Background(), api, snap, checks, nil, time.Time{}); err != nil || len(got) != 0 {
		t.Fatalf("with no boot time: not ready %q %v, want ready", got, err)
	}

	// The kubelet posts it not Ready, then Ready again within the boot's
	// first second: the API's whole seconds still count it as this boot's.
	api.pods[0] = readyAt(api.pods[0], boot.Add(999*time.Millisecond).Truncate(time.Second))
	if got, err := (Config{}).NotReady(context.Background(), api, snap, checks, nil, boot.Add(999*time.Millisecond)); err != nil || len(got) != 0 {
		t.Fatalf("Ready in the boot's first second: not ready %q %v, want ready", got, err)
	}

	// A second pod of the DaemonSet, Ready in this boot, beside a stale one
	// (a rollout): the DaemonSet is ready.
	old := readyAt(dsPod("kube-system", "node-agent", true), before)
	old.Name = "node-agent-old"
	api.pods = append([]corev1.Pod{old}, api.pods...)
	if got, err := (Config{}).NotReady(context.Background(), api, snap, checks, nil, boot); err != nil || len(got) != 0 {
		t.Fatalf("with one pod of this boot Ready: not ready %q %v, want ready", got, err)
	}
}

func TestNewDaemonSetFilterErrors(t *testing.T) {
	for _, tc := range []struct {
		namespaces []string
		selector   string
		want       string
	}{
		{namespaces: []string{"Kube_System"}, want: `namespace "Kube_System": a lowercase RFC 1123 label`},
		{selector: "app in (cni", want: "invalid label selector: "},
	} {
		if _, err := NewDaemonSetFilter(tc.namespaces, tc.selector); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewDaemonSetFilter(%q, %q) = %v, want an error containing %q", tc.namespaces, tc.selector, err, tc.want)
		}
	}
}
