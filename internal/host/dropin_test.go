package host

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
)

// newDropInEnv returns a Logind whose drop-in directory is also the fake
// logind's configuration directory, so a reload changes InhibitDelayMax as
// on a real host.
func newDropInEnv(t *testing.T) (*Logind, *logindtest.Server, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "logind.conf.d") // created on demand
	srv := logindtest.Start(t, logindtest.Options{ConfDir: dir})
	l := newTestLogind(t, srv, func(c *Config) { c.LogindConfDir = dir })
	return l, srv, dir
}

func wantDropIn(secs string) string {
	return "# Written by lifecycle-agent: the shutdown budget, or the kubelet's\n" +
		"# 99-kubelet.conf if larger. Rewritten by the agent; do not edit.\n" +
		"[Login]\nInhibitDelayMaxSec=" + secs + "\n"
}

func TestEnsureInhibitDelay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kubelet string // content of 99-kubelet.conf; empty: absent
		budget  time.Duration
		want    string // InhibitDelayMaxSec written
		wantErr error
	}{
		{name: "no kubelet file", budget: 30 * time.Second, want: "30"},
		{name: "kubelet larger wins", kubelet: "[Login]\nInhibitDelayMaxSec=120\n", budget: 30 * time.Second, want: "120"},
		{name: "budget larger wins", kubelet: "[Login]\nInhibitDelayMaxSec=10\n", budget: 30 * time.Second, want: "30"},
		{name: "budget rounds up", budget: 2500 * time.Millisecond, want: "3"},
		{name: "kubelet time span with units", kubelet: "# kubelet\n[Login]\nInhibitDelayMaxSec=1min 30s\n", budget: time.Minute, want: "90"},
		{name: "kubelet key outside Login ignored", kubelet: "[Other]\nInhibitDelayMaxSec=600\n", budget: 30 * time.Second, want: "30"},
		{name: "kubelet unparsable", kubelet: "[Login]\nInhibitDelayMaxSec=infinity\n", budget: 30 * time.Second, wantErr: ErrInvalidConfig},
		{name: "zero budget", budget: 0, wantErr: ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			l, srv, dir := newDropInEnv(t)
			if tc.kubelet != "" {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "99-kubelet.conf"), []byte(tc.kubelet), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			changed, err := l.EnsureInhibitDelay(ctx, tc.budget)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("EnsureInhibitDelay error = %v, want %v", err, tc.wantErr)
				}
				if _, serr := os.Stat(l.DropInPath()); !errors.Is(serr, os.ErrNotExist) {
					t.Fatalf("drop-in written despite error (stat: %v)", serr)
				}
				if n := len(srv.KillUnits()); n != 0 {
					t.Fatalf("logind reloaded %d times despite error", n)
				}
				return
			}
			if err != nil || !changed {
				t.Fatalf("EnsureInhibitDelay = %v, %v; want true, nil", changed, err)
			}
			got, err := os.ReadFile(filepath.Join(dir, "99-lifecycle-agent.conf"))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != wantDropIn(tc.want) {
				t.Fatalf("drop-in =\n%s\nwant\n%s", got, wantDropIn(tc.want))
			}
			st, err := os.Stat(l.DropInPath())
			if err != nil || st.Mode().Perm() != 0o644 {
				t.Fatalf("drop-in mode %v, %v; want 0644", st.Mode(), err)
			}
			want := logindtest.KillUnitCall{Unit: "systemd-logind.service", Mode: "all", Signal: int32(syscall.SIGHUP)}
			if calls := srv.KillUnits(); len(calls) != 1 || calls[0] != want {
				t.Fatalf("KillUnit calls = %+v, want [%+v]", calls, want)
			}
			// The (fake) logind re-read the drop-ins.
			eff, err := l.InhibitDelayMax(ctx)
			if err != nil || eff != mustSeconds(t, tc.want) {
				t.Fatalf("effective InhibitDelayMax = %s, %v; want %ss", eff, err, tc.want)
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if strings.Contains(e.Name(), ".tmp") {
					t.Fatalf("temporary file %s left behind", e.Name())
				}
			}
		})
	}
}

func mustSeconds(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s + "s")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestEnsureInhibitDelayIdempotent(t *testing.T) {
	ctx := testCtx(t)
	l, srv, _ := newDropInEnv(t)
	if changed, err := l.EnsureInhibitDelay(ctx, 30*time.Second); err != nil || !changed {
		t.Fatalf("first EnsureInhibitDelay = %v, %v", changed, err)
	}
	st1, err := os.Stat(l.DropInPath())
	if err != nil {
		t.Fatal(err)
	}
	changed, err := l.EnsureInhibitDelay(ctx, 30*time.Second)
	if err != nil || changed {
		t.Fatalf("second EnsureInhibitDelay = %v, %v; want false, nil", changed, err)
	}
	st2, err := os.Stat(l.DropInPath())
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(st1, st2) {
		t.Fatal("unchanged drop-in was rewritten")
	}
	if n := len(srv.KillUnits()); n != 1 {
		t.Fatalf("logind reloaded %d times, want 1", n)
	}
	// A new budget rewrites and reloads.
	if changed, err := l.EnsureInhibitDelay(ctx, 45*time.Second); err != nil || !changed {
		t.Fatalf("EnsureInhibitDelay(45s) = %v, %v", changed, err)
	}
	if n := len(srv.KillUnits()); n != 2 {
		t.Fatalf("logind reloaded %d times, want 2", n)
	}
	if d := srv.InhibitDelayMax(); d != 45*time.Second {
		t.Fatalf("fake logind InhibitDelayMax = %s, want 45s", d)
	}
}

func TestEnsureInhibitDelayRetriesFailedReload(t *testing.T) {
	ctx := testCtx(t)
	l, srv, _ := newDropInEnv(t)
	srv.SetError("KillUnit", "org.freedesktop.DBus.Error.AccessDenied", "denied")
	changed, err := l.EnsureInhibitDelay(ctx, 30*time.Second)
	var be *BusError
	if !errors.As(err, &be) || be.Name != "org.freedesktop.DBus.Error.AccessDenied" {
		t.Fatalf("EnsureInhibitDelay error = %v, want the KillUnit BusError", err)
	}
	if !changed {
		t.Fatal("changed = false although the drop-in was written")
	}
	srv.SetError("KillUnit", "", "")
	// Same content, but logind still has the old value: reload again.
	if changed, err := l.EnsureInhibitDelay(ctx, 30*time.Second); err != nil || !changed {
		t.Fatalf("retry = %v, %v; want true, nil", changed, err)
	}
	if n := len(srv.KillUnits()); n != 1 {
		t.Fatalf("KillUnit recorded %d times, want 1", n)
	}
	if changed, err := l.EnsureInhibitDelay(ctx, 30*time.Second); err != nil || changed {
		t.Fatalf("third call = %v, %v; want false, nil", changed, err)
	}
}

func TestParseTimespan(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    time.Duration
		wantErr bool
	}{
		{name: "bare seconds", in: "30", want: 30 * time.Second},
		{name: "seconds suffix", in: "30s", want: 30 * time.Second},
		{name: "sec suffix with space", in: "30 sec", want: 30 * time.Second},
		{name: "compound", in: "1min 30s", want: 90 * time.Second},
		{name: "compound no space", in: "1h5m", want: time.Hour + 5*time.Minute},
		{name: "fraction", in: "2.5s", want: 2500 * time.Millisecond},
		{name: "milliseconds", in: "500ms", want: 500 * time.Millisecond},
		{name: "infinity refused", in: "infinity", wantErr: true},
		{name: "empty", in: "", wantErr: true},
		{name: "unknown unit", in: "5 fortnights", wantErr: true},
		{name: "negative", in: "-5", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseTimespan(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseTimespan(%q) error = %v, wantErr %v", tc.in, err, tc.wantErr)
			}
			if !tc.wantErr && got != tc.want {
				t.Fatalf("parseTimespan(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.conf")
	for _, content := range []string{"one\n", "two\n"} {
		if err := WriteFileAtomic(path, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("content = %q, %v; want %q", got, err, content)
		}
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("mode = %v, %v; want 0640", st.Mode(), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want 1 (temp files left?)", len(ents))
	}
	if err := WriteFileAtomic(filepath.Join(dir, "missing", "f"), []byte("x"), 0o644); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

// TestFollowKubeletDropIn: the agent wrote its budget before the kubelet
// started (a node's first boot); the kubelet then writes a larger
// InhibitDelayMaxSec into 99-kubelet.conf. The agent's drop-in follows
// within the kubelet's ~3 s check, and logind (reloaded over D-Bus) reports
// the kubelet's value, so the kubelet's graceful node shutdown starts.
// Without the follow our file, which sorts last, would keep 5 s.
func TestFollowKubeletDropIn(t *testing.T) {
	ctx := testCtx(t)
	l, _, dir := newDropInEnv(t)
	if _, err := l.EnsureInhibitDelay(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.FollowKubeletDropIn(ctx, 5*time.Second) }()
	effective := func(want time.Duration) bool {
		d, err := l.InhibitDelayMax(ctx)
		return err == nil && d == want
	}
	kubelet := filepath.Join(dir, "99-kubelet.conf")
	// The kubelet's write, as it does it (a plain WriteFile); before or
	// after the watch is set up (the follow checks once after setting it).
	if err := os.WriteFile(kubelet, []byte("[Login]\nInhibitDelayMaxSec=30\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second) // the kubelet gives up after about 3 s
	for !effective(30 * time.Second) {
		if time.Now().After(deadline) {
			got, _ := os.ReadFile(l.DropInPath())
			d, _ := l.InhibitDelayMax(ctx)
			t.Fatalf("logind's InhibitDelayMax %s 3 s after the kubelet wrote 30s (our drop-in:\n%s)", d, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, _ := os.ReadFile(l.DropInPath()); string(got) != wantDropIn("30") {
		t.Fatalf("drop-in =\n%s\nwant\n%s", got, wantDropIn("30"))
	}
	// The kubelet's grace period lowered below our budget: ours is kept.
	if err := os.Remove(kubelet); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(3 * time.Second)
	for !effective(5 * time.Second) {
		if time.Now().After(deadline) {
			t.Fatal("after the kubelet's drop-in went away, logind did not come back to the agent's 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("FollowKubeletDropIn returned early: %v", err)
	default:
	}
}
