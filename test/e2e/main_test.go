// Package e2e holds the tests that run against the real control plane
// (test/testenv): admission, authorization and the claim protocol's
// building blocks as a real kube-apiserver enforces them.
package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	// The journal's integrity check runs in a subprocess: this binary.
	if len(os.Args) > 1 && os.Args[1] == "journal-check-file" {
		os.Exit(journal.RunCheck(os.Args[2:], os.Stdout, os.Stderr))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	var err error
	env, err = testenv.Start(ctx, testenv.Options{Log: os.Stderr, ControllerManager: true,
		// KEP-5683's gate on (alpha, off by default): test/crash and test/vm
		// run with it off; the agent behaves the same (docs/conditions.md).
		FeatureGates: "NodeLifecycleConditions=true"})
	if err == nil {
		err = env.InstallManifests(ctx)
	}
	cancel()
	if err != nil {
		// Never skip: a test that cannot run fails and says why.
		fmt.Fprintf(os.Stderr, "FAIL: cannot start the test control plane: %v\n", err)
		if env != nil {
			env.Stop()
		}
		os.Exit(1)
	}
	code := m.Run()
	env.Stop()
	os.Exit(code)
}
