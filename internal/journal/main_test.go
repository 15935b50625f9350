package journal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// The test binary doubles as the check subprocess (and as the crashing
// process of TestCrashBoundaries): with envRunCheck set it runs RunCheck on
// its arguments and exits, exactly as `lifecycle-agent journal check-file`.
const (
	envRunCheck  = "JOURNAL_TEST_RUN_CHECK"
	envCrashPath = "JOURNAL_TEST_CRASH_PATH"
)

func TestMain(m *testing.M) {
	if os.Getenv(envRunCheck) == "1" {
		os.Exit(RunCheck(os.Args[1:], os.Stdout, os.Stderr))
	}
	if p := os.Getenv(envCrashPath); p != "" {
		os.Exit(crashChild(p))
	}
	os.Exit(m.Run())
}

// testTime is the fake clock's time; corrupt files are named after it.
var testTime = time.Date(2026, 11, 30, 10, 15, 0, 0, time.UTC)

const corruptSuffix = ".corrupt-20261130T101500Z"

// checkCommand runs this test binary as the check subprocess.
func checkCommand(t testing.TB) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{"/usr/bin/env", envRunCheck + "=1", exe}
}

func testOptions(t testing.TB) Options {
	t.Helper()
	return Options{
		LockTimeout:  500 * time.Millisecond,
		CheckCommand: checkCommand(t),
		CheckTimeout: 60 * time.Second,
		Clock:        clocktesting.NewFakePassiveClock(testTime),
	}
}

// openJournal opens path and closes the journal when the test ends.
func openJournal(t testing.TB, path string, opts Options) (*Journal, *OpenReport) {
	t.Helper()
	j, rep, err := Open(context.Background(), path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { _ = j.Close() })
	return j, rep
}

func journalPath(t testing.TB) string {
	return filepath.Join(t.TempDir(), "journal.db")
}

func testEvent(uid string) EventRecord {
	obj := fmt.Sprintf(`{"apiVersion":"lifecycle.x-k8s.io/v1alpha1","kind":"LifecycleEvent","metadata":{"name":"ev-%s","uid":%q},"spec":{"transitionName":"drain-node-a","bindingNode":"node-a"}}`, uid, uid)
	return EventRecord{
		UID:             uid,
		Name:            "ev-" + uid,
		Driver:          "lifecycle-agent.x-k8s.io/drain",
		ResourceVersion: "42",
		State:           EventClaimed,
		Object:          json.RawMessage(obj),
	}
}

func mustPutEvent(t testing.TB, j *Journal, rec EventRecord) {
	t.Helper()
	if err := j.PutEvent(rec); err != nil {
		t.Fatal(err)
	}
}

func mustAppend(t testing.TB, j *Journal, uid string, rec StepRecord) uint64 {
	t.Helper()
	seq, err := j.AppendStep(uid, rec)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func fileSum(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// corruptFiles lists the moved-aside files next to path.
func corruptFiles(t testing.TB, path string) []string {
	t.Helper()
	m, err := filepath.Glob(path + ".corrupt-*")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func wantErrContains(t testing.TB, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}
