package packaging

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/engine"
)

var maintainerScripts = []string{"postinst", "prerm", "postrm"}

// TestMaintainerScriptsStatic checks the scripts as shipped: executable,
// POSIX sh, parsed by sh -n and clean under shellcheck.
func TestMaintainerScriptsStatic(t *testing.T) {
	deb := needDeb(t)
	needTools(t, "shellcheck")
	ctl := extractControl(t, deb)
	for _, name := range maintainerScripts {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(ctl, name)
			st, err := os.Stat(path)
			if err != nil {
				t.Fatalf("the package has no %s: %v", name, err)
			}
			if st.Mode().Perm() != 0o755 {
				t.Errorf("%s: mode %v, want 0755", name, st.Mode().Perm())
			}
			if first := strings.SplitN(string(readFile(t, path)), "\n", 2)[0]; first != "#!/bin/sh" {
				t.Errorf("%s: first line %q, want #!/bin/sh", name, first)
			}
			mustRun(t, "", "sh", "-n", path)
			mustRun(t, "", "shellcheck", "--shell=sh", path)
		})
	}
}

// harness runs one maintainer script with recording stubs of
// deb-systemd-helper, deb-systemd-invoke and systemctl first in PATH, after
// creating a journal, the agent's logind drop-in and the kubelet's. Mode
// systemd and nosystemd run it in a private mount namespace (unshare) with
// fresh tmpfs on /run, /var/lib and /etc/systemd, so nothing on the host is
// seen or touched, with or without /run/systemd/system (how the scripts,
// like debhelper's, tell that systemd is PID 1). Mode dpkgroot sets
// DPKG_ROOT to a temporary directory instead (dpkg --root, no systemd
// actions at all) and needs no namespace.
const harness = `#!/bin/sh
set -e
mode=$1 script=$2
shift 2
r=
if [ "$mode" = dpkgroot ]; then
	r=$DPKG_ROOT
else
	mount -t tmpfs tmpfs /run
	mount -t tmpfs tmpfs /var/lib
	mount -t tmpfs tmpfs /etc/systemd
	if [ "$mode" = systemd ]; then mkdir -p /run/systemd/system; fi
fi
files="var/lib/lifecycle-agent/journal.db etc/systemd/logind.conf.d/99-lifecycle-agent.conf etc/systemd/logind.conf.d/99-kubelet.conf"
mkdir -p "$r/var/lib/lifecycle-agent" "$r/etc/systemd/logind.conf.d"
for f in $files; do : >"$r/$f"; done
"$script" "$@"
for f in $files; do
	if [ -e "$r/$f" ]; then echo "kept /$f" >>"$STUB_LOG"; else echo "removed /$f" >>"$STUB_LOG"; fi
done
`

// stub records its command line; `deb-systemd-helper --quiet was-enabled`
// answers from $STUB_WAS_ENABLED; `lifecycle-agent status` is the packaged
// binary's own, asking the agent at $STUB_AGENT_SOCKET (the other
// lifecycle-agent commands, unpublish, are only recorded).
const stub = `#!/bin/sh
echo "${0##*/} $*" >>"$STUB_LOG"
if [ "${0##*/} $1 $2" = "deb-systemd-helper --quiet was-enabled" ]; then
	[ "$STUB_WAS_ENABLED" = yes ]
	exit
fi
if [ "${0##*/} $1" = "lifecycle-agent status" ]; then
	LIFECYCLE_AGENT_SOCKET_PATH=$STUB_AGENT_SOCKET exec "$STUB_REAL_AGENT" "$@"
fi
`

// serveAgentStatus answers GET /status on a unix socket as an agent running
// event does, and returns the socket's path.
func serveAgentStatus(t *testing.T, event *engine.EventSnapshot) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lacs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	st := agent.StatusView{Snapshot: engine.Snapshot{Node: "pkg-node", Identity: "pkg-node", State: "event " + event.Name + ": step drain", Event: event}, HostMode: "real"}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return sock
}

var (
	unshareOnce sync.Once
	unshareErr  error
)

// TestMaintainerScriptsBehaviour runs postinst, prerm and postrm for
// install, upgrade, remove and purge, with systemd running and without
// (a chroot or an image build), and checks which systemd helpers they call
// and which files they leave. It uses deb-systemd-helper's, not dpkg's,
// view: the real dpkg run on a systemd machine is in the VM tests.
func TestMaintainerScriptsBehaviour(t *testing.T) {
	deb := needDeb(t)
	needTools(t, "unshare")
	ctl := extractControl(t, deb)

	stubs := t.TempDir()
	realAgent := filepath.Join(extract(t, deb), "usr/bin/lifecycle-agent")
	agentConfig := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(agentConfig, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	running := serveAgentStatus(t, &engine.EventSnapshot{Name: "drain-pkg-node", Driver: "lifecycle-agent.x-k8s.io/drain", ClaimStatus: "Claimed"})
	for _, name := range []string{"deb-systemd-helper", "deb-systemd-invoke", "systemctl", "lifecycle-agent"} {
		if err := os.WriteFile(filepath.Join(stubs, name), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	harnessPath := filepath.Join(t.TempDir(), "harness.sh")
	if err := os.WriteFile(harnessPath, []byte(harness), 0o755); err != nil {
		t.Fatal(err)
	}

	const (
		unmask     = "deb-systemd-helper unmask lifecycle-agent.service"
		wasEnabled = "deb-systemd-helper --quiet was-enabled lifecycle-agent.service"
		enable     = "deb-systemd-helper enable lifecycle-agent.service"
		update     = "deb-systemd-helper update-state lifecycle-agent.service"
		reload     = "systemctl --system daemon-reload"
		start      = "deb-systemd-invoke start lifecycle-agent.service"
		restart    = "deb-systemd-invoke restart lifecycle-agent.service"
		stop       = "deb-systemd-invoke stop lifecycle-agent-recover.service lifecycle-agent.service"
		purge      = "deb-systemd-helper purge lifecycle-agent.service"
		status     = "lifecycle-agent status"
		unpublish  = "lifecycle-agent unpublish --timeout 15s"
		journal    = "/var/lib/lifecycle-agent/journal.db"
		dropIn     = "/etc/systemd/logind.conf.d/99-lifecycle-agent.conf"
	)
	// postrm purge calls deb-systemd-helper only when it is installed, as
	// debhelper's postrm does (init-system-helpers is Essential on Debian).
	var purgeCalls []string
	if _, err := os.Stat("/usr/bin/deb-systemd-helper"); err == nil {
		purgeCalls = []string{purge}
	}

	tests := []struct {
		name       string
		mode       string // systemd, nosystemd, dpkgroot
		script     string
		args       []string
		wasEnabled bool
		wantCalls  []string
		wantGone   []string // files removed; the others must be kept
		event      bool     // the agent answers status with an event running
		wantSays   string   // in the script's output
	}{
		{
			name: "install starts the agent", mode: "systemd",
			script: "postinst", args: []string{"configure", ""}, wasEnabled: true,
			wantCalls: []string{unmask, wasEnabled, enable, reload, start},
		},
		{
			name: "upgrade restarts the agent", mode: "systemd",
			script: "postinst", args: []string{"configure", "0.0.9"}, wasEnabled: true,
			wantCalls: []string{unmask, wasEnabled, enable, reload, restart},
		},
		{
			name: "upgrade keeps the admin's disable", mode: "systemd",
			script: "postinst", args: []string{"configure", "0.0.9"}, wasEnabled: false,
			wantCalls: []string{unmask, wasEnabled, update, reload, restart},
		},
		{
			name: "install in a chroot enables without starting", mode: "nosystemd",
			script: "postinst", args: []string{"configure", ""}, wasEnabled: true,
			wantCalls: []string{unmask, wasEnabled, enable},
		},
		{
			name: "install with dpkg --root enables without starting", mode: "dpkgroot",
			script: "postinst", args: []string{"configure", ""}, wasEnabled: true,
			wantCalls: []string{unmask, wasEnabled, enable},
		},
		{
			name: "remove stops the agent, withdraws its transitions and drops its logind drop-in", mode: "systemd",
			script: "prerm", args: []string{"remove"},
			wantCalls: []string{status, stop, unpublish}, wantGone: []string{dropIn},
		},
		{
			name: "remove warns while an event runs", mode: "systemd",
			script: "prerm", args: []string{"remove"}, event: true,
			wantCalls: []string{status, stop, unpublish}, wantGone: []string{dropIn},
			wantSays: "lifecycle-agent: prerm: WARNING: event drain-pkg-node (lifecycle-agent.x-k8s.io/drain, Claimed) is running on this node; removal stops it mid-way.",
		},
		{
			name: "upgrade leaves the old agent running", mode: "systemd",
			script: "prerm", args: []string{"upgrade", "0.2.0"},
		},
		{
			name: "remove in a chroot", mode: "nosystemd",
			script: "prerm", args: []string{"remove"},
			wantCalls: []string{status, unpublish}, wantGone: []string{dropIn},
		},
		{
			name: "remove with dpkg --root", mode: "dpkgroot",
			script: "prerm", args: []string{"remove"},
			wantGone: []string{dropIn},
		},
		{
			name: "remove keeps the journal", mode: "systemd",
			script: "postrm", args: []string{"remove"},
			wantCalls: []string{reload},
		},
		{
			name: "purge deletes the journal", mode: "systemd",
			script: "postrm", args: []string{"purge"},
			wantCalls: purgeCalls, wantGone: []string{journal},
		},
		{
			name: "purge in a chroot", mode: "nosystemd",
			script: "postrm", args: []string{"purge"},
			wantCalls: purgeCalls, wantGone: []string{journal},
		},
		{
			name: "purge with dpkg --root deletes under the root only", mode: "dpkgroot",
			script: "postrm", args: []string{"purge"},
			wantGone: []string{journal},
		},
		{
			name: "postrm upgrade does nothing", mode: "systemd",
			script: "postrm", args: []string{"upgrade", "0.2.0"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "calls")
			sock := filepath.Join(t.TempDir(), "no-agent.sock") // nothing answers
			if tc.event {
				sock = running
			}
			env := []string{
				"PATH=" + stubs + ":/usr/sbin:/usr/bin:/sbin:/bin",
				"STUB_LOG=" + log,
				"STUB_WAS_ENABLED=" + map[bool]string{true: "yes", false: "no"}[tc.wasEnabled],
				"STUB_REAL_AGENT=" + realAgent,
				"STUB_AGENT_SOCKET=" + sock,
				"LIFECYCLE_AGENT_CONFIG=" + agentConfig,
				"DPKG_ROOT=",
			}
			argv := append([]string{harnessPath, tc.mode, filepath.Join(ctl, tc.script)}, tc.args...)
			if tc.mode == "dpkgroot" {
				env[len(env)-1] = "DPKG_ROOT=" + t.TempDir()
			} else {
				needUnshare(t)
				argv = append([]string{"unshare", "--mount", "--propagation", "private", "sh"}, argv...)
			}
			out, err := runIn(context.Background(), "", env, time.Minute, argv[0], argv[1:]...)
			if err != nil {
				t.Fatalf("%s %s: %v\n%s", tc.script, strings.Join(tc.args, " "), err, out)
			}
			var calls, gone []string
			for _, line := range strings.Split(strings.TrimSpace(string(readFile(t, log))), "\n") {
				switch {
				case strings.HasPrefix(line, "removed "):
					gone = append(gone, strings.TrimPrefix(line, "removed "))
				case strings.HasPrefix(line, "kept "):
				default:
					calls = append(calls, line)
				}
			}
			if !slices.Equal(calls, tc.wantCalls) {
				t.Errorf("calls:\n  %s\nwant:\n  %s", strings.Join(calls, "\n  "), strings.Join(tc.wantCalls, "\n  "))
			}
			if !slices.Equal(gone, tc.wantGone) {
				t.Errorf("removed %q, want %q", gone, tc.wantGone)
			}
			if said := strings.Contains(string(out), "WARNING: event"); said != (tc.wantSays != "") || !strings.Contains(string(out), tc.wantSays) {
				t.Errorf("%s %s said:\n%s\nwant %q", tc.script, strings.Join(tc.args, " "), out, tc.wantSays)
			}
		})
	}
}

// needUnshare skips the test when this machine cannot make a private mount
// namespace (a container without CAP_SYS_ADMIN).
func needUnshare(t *testing.T) {
	t.Helper()
	unshareOnce.Do(func() {
		out, err := runIn(context.Background(), "", nil, time.Minute,
			"unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /run")
		if err != nil {
			unshareErr = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
		}
	})
	if unshareErr != nil {
		t.Skipf("no private mount namespace here (%v); the VM tests cover this case", unshareErr)
	}
}

// recoverStub is systemctl for TestRecoverScript: `show -P PROP` answers
// from $STUB_STATES, one "ActiveState Result ExecMainCode ExecMainStatus"
// line per state, the next line on each ActiveState query (the last line
// repeats); every call is recorded.
const recoverStub = `#!/bin/sh
echo "systemctl $*" >>"$STUB_LOG"
[ "$1 $2" = "show -P" ] || exit 0
prop=$3
n=$(grep -c "show -P ActiveState" "$STUB_LOG")
line=$(sed -n "${n}p" "$STUB_STATES")
[ -n "$line" ] || line=$(tail -n 1 "$STUB_STATES")
set -- $line
case $prop in
ActiveState) echo "$1" ;;
Result) echo "$2" ;;
ExecMainCode) echo "$3" ;;
ExecMainStatus) echo "$4" ;;
esac
`

// TestRecoverScript runs /usr/lib/lifecycle-agent/recover, as the package
// ships it, against a systemctl that reports the agent's state: it starts
// the agent again only when its start limit stopped the restarts (systemd
// 252 says start-limit-hit only for a manual start; a limit that trips on
// an automatic restart keeps the last failure's result, as the VM test
// (h) showed) and the agent is still failed after the wait; an exit 2 (a
// bad config) or an admin's stop is left alone.
func TestRecoverScript(t *testing.T) {
	deb := needDeb(t)
	needTools(t, "shellcheck")
	script := filepath.Join(extract(t, deb), "usr/lib/lifecycle-agent/recover")
	if st, err := os.Stat(script); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("recover script: %v (mode %v), want it at mode 0755", err, st)
	}
	mustRun(t, "", "shellcheck", "--shell=sh", script)
	stubs := t.TempDir()
	if err := os.WriteFile(filepath.Join(stubs, "systemctl"), []byte(recoverStub), 0o755); err != nil {
		t.Fatal(err)
	}
	show := func(p string) string { return "systemctl show -P " + p + " lifecycle-agent.service" }
	state, result, code, status := show("ActiveState"), show("Result"), show("ExecMainCode"), show("ExecMainStatus")
	const (
		reset = "systemctl reset-failed lifecycle-agent.service"
		start = "systemctl start --no-block lifecycle-agent.service"
	)
	for _, tc := range []struct {
		name, states string
		wantCalls    []string
		wantSays     string
	}{
		{
			name: "start-limit-hit: started again after the wait", states: "failed start-limit-hit 1 1\n",
			wantCalls: []string{state, result, state, result, reset, start},
			wantSays:  "lifecycle-agent.service started again after its start limit",
		},
		{
			name: "limit tripped on an automatic restart (Result=exit-code, exit 1): started again", states: "failed exit-code 1 1\n",
			wantCalls: []string{state, result, code, status, state, result, code, status, reset, start},
			wantSays:  "hit its start limit; starting it again in 0s",
		},
		{
			name: "exit 2 (bad config): left alone", states: "failed exit-code 1 2\n",
			wantCalls: []string{state, result, code, status, state, result, status},
			wantSays:  "is failed (Result=exit-code, exit status 2), not stopped by its start limit: leaving it alone",
		},
		{
			name: "stopped by an admin: left alone", states: "inactive success 1 0\n",
			wantCalls: []string{state, state, result, status},
			wantSays:  "is inactive (Result=success, exit status 0), not stopped by its start limit: leaving it alone",
		},
		{
			name: "started by someone while waiting: left alone", states: "failed start-limit-hit 1 1\nactive success 0 0\n",
			wantCalls: []string{state, result, state, state},
			wantSays:  "changed state while waiting (active): leaving it alone",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			log, states := filepath.Join(dir, "calls"), filepath.Join(dir, "states")
			if err := os.WriteFile(states, []byte(tc.states), 0o644); err != nil {
				t.Fatal(err)
			}
			env := []string{"PATH=" + stubs + ":/usr/bin:/bin", "STUB_LOG=" + log, "STUB_STATES=" + states, "LIFECYCLE_AGENT_RECOVER_DELAY=0"}
			out, err := runIn(context.Background(), "", env, time.Minute, script)
			if err != nil {
				t.Fatalf("recover: %v\n%s", err, out)
			}
			calls := strings.Split(strings.TrimSpace(string(readFile(t, log))), "\n")
			if !slices.Equal(calls, tc.wantCalls) {
				t.Errorf("calls:\n  %s\nwant:\n  %s", strings.Join(calls, "\n  "), strings.Join(tc.wantCalls, "\n  "))
			}
			if !strings.Contains(string(out), tc.wantSays) {
				t.Errorf("recover said:\n%s\nwant %q", out, tc.wantSays)
			}
		})
	}
}
