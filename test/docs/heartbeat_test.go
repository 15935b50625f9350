package docs

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// TestHeartbeat: a long build is never silent (issue 43). hack/kubebin.sh,
// hack/nodebin.sh, hack/prombin.sh and hack/demo/prepare.sh run their builds
// through hack/heartbeat.sh's timed: while the command runs, a "still"
// line every HEARTBEAT_SECONDS; after it, its time; a failure says so and
// keeps the command's status.
func TestHeartbeat(t *testing.T) {
	hb := filepath.Join(testenv.RepoRoot(), "hack", "heartbeat.sh")
	run := func(cmd string) (string, int) {
		t.Helper()
		c := exec.Command("bash", "-c", ". "+hb+"; HEARTBEAT_SECONDS=1 timed part 'the part' "+cmd)
		out, err := c.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	// The seconds printed depend on the machine's load: only the lines'
	// shapes are checked, not their times.
	still := regexp.MustCompile(`(?m)^\[part\] still the part: \d+s$`)
	done := regexp.MustCompile(`(?m)^\[part\] the part: done in \d+s \(CPU \d+s\)$`)
	failed := regexp.MustCompile(`(?m)^\[part\] the part: failed after \d+s \(CPU \d+s\)$`)
	out, code := run("sleep 3.5")
	if code != 0 || !still.MatchString(out) || !done.MatchString(out) {
		t.Errorf("timed over a 3.5 s command: exit %d, printed:\n%s\nwant a heartbeat (\"still the part: Ns\") and then \"done in Ns (CPU Ns)\"", code, out)
	}
	out, code = run("sh -c 'exit 3'")
	if code != 3 || !failed.MatchString(out) {
		t.Errorf("timed over a failing command: exit %d, printed:\n%s\nwant exit 3 and \"failed after Ns (CPU Ns)\"", code, out)
	}
	for _, script := range []string{"kubebin.sh", "nodebin.sh", "prombin.sh", "demo/prepare.sh"} {
		b, err := exec.Command("grep", "-c", "^[^#]*timed ", filepath.Join(testenv.RepoRoot(), "hack", script)).Output()
		if err != nil || strings.TrimSpace(string(b)) == "0" {
			t.Errorf("hack/%s runs no build through timed (hack/heartbeat.sh): %v", script, err)
		}
	}
}
