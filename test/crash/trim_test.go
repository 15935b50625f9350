package crash

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// TestIdleTrim: the built agent, idle for a minute, releases the pages its
// start-up touched (internal/agent/trim.go): its log says so with its
// resident set before and after, the file-backed part of that set is
// small, and the next event — whose code was paged out — still runs to
// Succeeded.
func TestIdleTrim(t *testing.T) {
	ctx := context.Background()
	c, lc := rebootCase(t, "idle-trim")
	// Only clean pages can be dropped: a binary just linked may still
	// have dirty ones in the page cache (an installed one has none).
	f, err := os.Open(agentFP.Path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	a := c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	re := regexp.MustCompile(`msg="idle: released memory".*rssKiBBefore=(\d+) rssKiBAfter=(\d+)`)
	var m []string
	waitFor(t, "the idle agent's trim", 2*time.Minute, a, func() bool {
		m = re.FindStringSubmatch(a.logText())
		return m != nil
	})
	before, _ := strconv.Atoi(m[1])
	after, _ := strconv.Atoi(m[2])
	if after >= before/2 {
		t.Errorf("the trim took the agent's resident set from %d KiB to %d KiB; want it at least halved", before, after)
	}
	st, err := os.ReadFile("/proc/" + strconv.Itoa(a.cmd.Process.Pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			kib, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			t.Logf("trim: resident set %d KiB → %d KiB; file-backed part now %d KiB", before, after, kib)
			if kib > 16<<10 {
				t.Errorf("file-backed resident set %d KiB after the trim; want at most 16 MiB", kib)
			}
		}
	}

	c.createReboot(t, lc, a)
	waitFor(t, "the event after the trim to succeed", time.Minute, a, func() bool {
		got, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && got.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded
	})
}
