package docs

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// shimName is the name under which this test binary acts as kubectl.
const shimName = "kubectl"

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == shimName {
		os.Exit(kubectlShim(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// kubectlShim is the quick start's kubectl (see the package doc): `kubectl
// lifecycle ...` and `kubectl apply -f -`, nothing else.
func kubectlShim(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	switch {
	case len(args) >= 1 && args[0] == "lifecycle":
		// kubectl's plugin mechanism: kubectl lifecycle X → kubectl-lifecycle X.
		path, err := exec.LookPath("kubectl-lifecycle")
		if err != nil {
			fmt.Fprintf(stderr, "kubectl (test/docs shim): kubectl-lifecycle not on PATH: %v\n", err)
			return 127
		}
		err = syscall.Exec(path, append([]string{"kubectl-lifecycle"}, args[1:]...), os.Environ())
		fmt.Fprintf(stderr, "kubectl (test/docs shim): exec %s: %v\n", path, err)
		return 127
	case len(args) == 3 && args[0] == "apply" && args[1] == "-f" && args[2] == "-":
		data, err := io.ReadAll(stdin)
		if err != nil {
			fmt.Fprintf(stderr, "kubectl (test/docs shim): read stdin: %v\n", err)
			return 1
		}
		kc := os.Getenv("KUBECONFIG")
		cfg, err := clientcmd.BuildConfigFromFlags("", kc)
		if err != nil {
			fmt.Fprintf(stderr, "kubectl (test/docs shim): KUBECONFIG=%q: %v\n", kc, err)
			return 1
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := testenv.Apply(ctx, cfg, data); err != nil {
			fmt.Fprintf(stderr, "kubectl (test/docs shim): apply: %v\n", err)
			return 1
		}
		docs := 0
		for _, l := range strings.Split(string(data), "\n") {
			if l == "---" {
				docs++
			}
		}
		fmt.Fprintf(stdout, "kubectl (test/docs shim): server-side applied %d documents from stdin\n", docs)
		return 0
	}
	fmt.Fprintf(stderr, "kubectl (test/docs shim): only `kubectl lifecycle ...` and `kubectl apply -f -` are supported, got: kubectl %s\n", strings.Join(args, " "))
	return 127
}
