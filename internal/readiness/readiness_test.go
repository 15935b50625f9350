package readiness

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
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
