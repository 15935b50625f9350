package readiness

import (
	"context"
	"slices"
	"strings"
	"testing"

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
	if got, err := cfg.NotReady(context.Background(), after, snap, []string{CheckDaemonSets}, nil); err != nil || len(got) != 0 {
		t.Errorf("with readiness.daemonSets.namespaces [kube-system]: not ready %q %v, want ready", got, err)
	}
	all, err := Config{}.Take(context.Background(), api)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := (Config{}).NotReady(context.Background(), after, all, []string{CheckDaemonSets}, nil); strings.Join(got, "|") != "DaemonSet gpu-operator/nvidia-device-plugin has no Ready pod on the node|DaemonSet monitoring/node-exporter has no Ready pod on the node" {
		t.Errorf("with no filter: not ready %q", got)
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
