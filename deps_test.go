package lifecycleagent_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestImportRules walks the import graph of the agent's own packages and
// fails when a layering rule of STYLE.md is broken:
//   - only internal/host imports godbus or go-systemd;
//   - only internal/devices imports go-nvml;
//   - only internal/apiclient imports client-go (besides test helpers, the
//     demo and benchmarks under test/, hack/ and bench/, and the kubectl plugin).
func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "kustomize_disable_go_plugin_support", "-json=ImportPath,Imports", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/lifecycle-agent/lifecycle-agent/"
	rules := []struct {
		dep     string
		allowed []string
	}{
		{"github.com/godbus/dbus", []string{"internal/host"}},
		{"github.com/coreos/go-systemd", []string{"internal/host"}},
		{"github.com/NVIDIA/go-nvml", []string{"internal/devices"}},
		{"k8s.io/client-go", []string{"internal/apiclient", "test/", "bench", "hack/", "cmd/kubectl-lifecycle"}},
		{"k8s.io/kubectl", []string{"internal/apiclient"}},
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	checked := 0
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		checked++
		rel := strings.TrimPrefix(p.ImportPath, mod)
		for _, imp := range p.Imports {
			for _, r := range rules {
				if !strings.HasPrefix(imp, r.dep) {
					continue
				}
				ok := false
				for _, a := range r.allowed {
					if strings.HasPrefix(rel, a) {
						ok = true
					}
				}
				if !ok {
					t.Errorf("%s imports %s; only %v may", rel, imp, r.allowed)
				}
			}
		}
	}
	if checked < 5 {
		t.Fatalf("go list returned only %d packages", checked)
	}
}
