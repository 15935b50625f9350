package crash

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

var (
	env     *testenv.Env
	agentFP *fpBinary
	// startup is how long TestMain took (build and control plane).
	startup time.Duration
)

func TestMain(m *testing.M) {
	if persistencedMain() {
		return
	}
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // TestCrashSafety skips itself
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	// The binary builds while the control plane starts.
	var (
		wg       sync.WaitGroup
		buildErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		agentFP, buildErr = buildFailpointBinary(ctx, testenv.RepoRoot(), os.Stderr)
	}()
	// The control plane's directory (logs, audit log) is kept when a test
	// fails.
	dir, err := os.MkdirTemp("", "lifecycle-agent-crash-")
	if err == nil {
		env, err = testenv.Start(ctx, testenv.Options{Log: os.Stderr, ControllerManager: true, AuditLog: true, Dir: dir})
	}
	if err == nil {
		err = env.InstallManifests(ctx)
	}
	wg.Wait()
	cancel()
	if err == nil && buildErr != nil {
		err = fmt.Errorf("building the agent with failpoints: %w", buildErr)
	}
	if err != nil {
		// Never skip: a test that cannot run fails and says why.
		fmt.Fprintf(os.Stderr, "FAIL: crash tests cannot start: %v\n", err)
		if env != nil {
			env.Stop()
		}
		os.Exit(1)
	}
	startup = time.Since(t0)
	code := m.Run()
	env.Stop()
	if code == 0 {
		os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "crash: control plane logs and audit log kept in %s\n", dir)
	}
	os.Exit(code)
}
