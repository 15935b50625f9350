package v1alpha1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedFilesAreFresh regenerates the deepcopy code and the CRDs with
// the pinned controller-gen (hack/tools) into a temp dir and compares them
// with what is committed. Run `make generate` when it fails.
func TestGeneratedFilesAreFresh(t *testing.T) {
	root, _ := filepath.Abs("../..")
	out := t.TempDir()
	cmd := exec.Command("go", "tool", "controller-gen", "object:headerFile=/dev/null", "crd",
		"paths="+filepath.Join(root, "api")+"/...",
		"output:crd:dir="+filepath.Join(out, "crds"), "output:object:dir="+filepath.Join(out, "obj"))
	cmd.Dir = filepath.Join(root, "hack", "tools")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("controller-gen: %v\n%s", err, b)
	}
	compare := func(got, want string) {
		g, err := os.ReadFile(got)
		if err != nil {
			t.Fatal(err)
		}
		w, err := os.ReadFile(want)
		if err != nil {
			t.Fatalf("%s is missing; run make generate", want)
		}
		if !bytes.Equal(g, w) {
			t.Errorf("%s is stale; run make generate", want)
		}
	}
	compare(filepath.Join(out, "obj", "zz_generated.deepcopy.go"), filepath.Join(root, "api", "v1alpha1", "zz_generated.deepcopy.go"))
	crds, _ := filepath.Glob(filepath.Join(out, "crds", "*.yaml"))
	committed, _ := filepath.Glob(filepath.Join(root, "deploy", "crds", "*.yaml"))
	if len(crds) != len(committed) || len(crds) != 3 {
		t.Fatalf("generated %d CRDs, committed %d; want 3 each (make generate)", len(crds), len(committed))
	}
	for _, c := range crds {
		compare(c, filepath.Join(root, "deploy", "crds", filepath.Base(c)))
	}
}
