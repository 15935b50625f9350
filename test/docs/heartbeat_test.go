package docs

import (
	"os/exec"
	"path/filepath"
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
	out, code := run("sleep 2.5")
	if code != 0 || !strings.Contains(out, "[part] still the part: 1s\n") || !strings.Contains(out, "[part] still the part: 2s\n") ||
		!strings.Contains(out, "[part] the part: done in 2s (CPU 0s)\n") {
		t.Errorf("timed over a 2.5 s command: exit %d, printed:\n%s\nwant a heartbeat at 1s and 2s, then \"done in 2s\"", code, out)
	}
	out, code = run("sh -c 'exit 3'")
	if code != 3 || !strings.Contains(out, "[part] the part: failed after 0s") {
		t.Errorf("timed over a failing command: exit %d, printed:\n%s\nwant exit 3 and \"failed after 0s\"", code, out)
	}
	for _, script := range []string{"kubebin.sh", "nodebin.sh", "prombin.sh", "demo/prepare.sh"} {
		b, err := exec.Command("grep", "-c", "^[^#]*timed ", filepath.Join(testenv.RepoRoot(), "hack", script)).Output()
		if err != nil || strings.TrimSpace(string(b)) == "0" {
			t.Errorf("hack/%s runs no build through timed (hack/heartbeat.sh): %v", script, err)
		}
	}
}
