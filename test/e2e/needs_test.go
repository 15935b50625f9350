package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
)

// The reboot-required need (issue 15.1) on the real API server, written
// with the node's own identity (system:node:<name>: the Node authorizer and
// NodeRestriction let it patch its own status with a condition type of
// ours): False at start, True with Debian's package list once the sentinel
// exists, False again when it goes (the reboot clears /var/run); then the
// same with a sentinel command, which replaces the file.
func TestRebootRequiredCondition(t *testing.T) {
	node := "needs-node"
	newNode(t, node)
	rec := recordConditions(t, node)
	dir := t.TempDir()
	file := filepath.Join(dir, "reboot-required")
	a := startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) {
		c.Needs.Reboot.SentinelFile = file
		c.Needs.Reboot.Interval = 100 * time.Millisecond
	}})
	rr := func(status corev1.ConditionStatus, reason, msg string) func() bool {
		return func() bool {
			c := nodeCondition(getNode(t, node), v1alpha1.NodeConditionRebootRequired)
			return c != nil && c.Status == status && c.Reason == reason && strings.Contains(c.Message, msg)
		}
	}
	waitFor(t, "RebootRequired=False (no sentinel)", 30*time.Second, rr(corev1.ConditionFalse, "SentinelFile", file+" absent"))
	if err := os.WriteFile(file+".pkgs", []byte("linux-image-6.1.0-28-amd64\nlibc6\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("*** System restart required ***\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "RebootRequired=True", 30*time.Second, rr(corev1.ConditionTrue, "SentinelFile", file+" exists; packages: linux-image-6.1.0-28-amd64, libc6"))
	os.Remove(file)
	waitFor(t, "RebootRequired=False again", 30*time.Second, rr(corev1.ConditionFalse, "SentinelFile", "absent"))
	rec.Expect(t, 0, []string{"RebootRequired=False/SentinelFile", "RebootRequired=True/SentinelFile", "RebootRequired=False/SentinelFile"})
	a.stop(t)

	flag := filepath.Join(dir, "needs-it")
	startAgent(t, node, agentOpts{retention: time.Hour, dir: a.dir, configure: func(c *config.Config) {
		c.Needs.Reboot.SentinelCommand = "test -e " + flag
		c.Needs.Reboot.Interval = 100 * time.Millisecond
	}})
	waitFor(t, "RebootRequired=False/SentinelCommand", 30*time.Second, rr(corev1.ConditionFalse, "SentinelCommand", "exited 1"))
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "RebootRequired=True/SentinelCommand", 30*time.Second, rr(corev1.ConditionTrue, "SentinelCommand", "`test -e "+flag+"` exited 0"))
}
