package crash

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestJournalCrashBoundaries runs internal/journal's TestCrashBoundaries in
// the journal's test binary built with its failpoints compiled in (built
// beside the failpoint agent, TestMain): a process killed at each commit
// boundary of the journal leaves exactly the writes before it. The plain
// go test of internal/journal cannot (it skips that test, saying so).
func TestJournalCrashBoundaries(t *testing.T) {
	if testing.Short() {
		t.Skip("crash: needs the failpoint build; skipped under -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentFP.JournalTest, "-test.run", "^TestCrashBoundaries$", "-test.v", "-test.count=1")
	cmd.Dir = t.TempDir()
	cmd.Env = append(agentEnv(""), "LIFECYCLE_AGENT_REQUIRE_FAILPOINTS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", agentFP.JournalTest, err, out)
	}
	text := string(out)
	if strings.Contains(text, "--- SKIP") {
		t.Fatalf("TestCrashBoundaries skipped a case in the failpoint build:\n%s", text)
	}
	passed := len(regexp.MustCompile(`(?m)^\s+--- PASS: TestCrashBoundaries/journal`).FindAllString(text, -1))
	if passed < 12 {
		t.Fatalf("TestCrashBoundaries passed %d boundaries, want every one of the 12:\n%s", passed, text)
	}
	t.Logf("journal crash boundaries: %d passed with failpoints compiled in", passed)
}
