package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// Guest-side constants, fixed by hack/vm/build-image.sh.
const (
	// GuestAPIServer is the API server URL inside the guest: /etc/hosts maps
	// kubernetes to 10.0.2.100, which QEMU forwards to Options.APIForward.
	GuestAPIServer = "https://kubernetes:6443"
	// Hostname is the guest's host name (and so the agent's default node name).
	Hostname = "vm-node"
)

// Options configure Start.
type Options struct {
	// APIForward is the host's 127.0.0.1:PORT that the guest reaches as
	// https://kubernetes:6443. Empty: the guest reaches nothing.
	APIForward string
	// Mem (MiB) and SMP override run-vm.sh's defaults (1024, 2).
	Mem, SMP int
	// Dir is the run directory; empty: a new one (RunDir).
	Dir string
	// NoReboot makes QEMU exit when the guest reboots (-no-reboot): the
	// guest stays powered off until PowerOn, as a bare-metal node held in
	// POST or by its BMC.
	NoReboot bool
}

// VM is one running guest. Its methods must be called from the test's
// goroutine: infrastructure failures end the test with t.Fatal.
type VM struct {
	t    testing.TB
	Dir  string // run directory: serial.log, qemu.log, relay.log, disk.qcow2
	opts Options

	cache string
	key   string
	port  string

	mu   sync.Mutex
	proc *exec.Cmd
	done chan struct{}

	boots int // CI-READY markers seen so far
}

// Bind makes t the test that the VM's infrastructure failures end, until
// the returned func restores the previous one: for subtests that share one
// VM (TestRealNode's scenarios), run one at a time.
func (v *VM) Bind(t testing.TB) (restore func()) {
	prev := v.t
	v.t = t
	return func() { v.t = prev }
}

var (
	imageOnce sync.Once
	imageErr  error
)

// EnsureImage builds the VM image once per test binary (a cache hit when
// the stamp of its inputs matches) and records how long that took.
func EnsureImage(t testing.TB) {
	t.Helper()
	RequireHostTools(t)
	imageOnce.Do(func() {
		start := time.Now()
		var out bytes.Buffer
		cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "vm", "build-image.sh"))
		cmd.Stdout, cmd.Stderr = &out, &out
		imageErr = cmd.Run()
		d := time.Since(start)
		what := "image build (cold)"
		if strings.Contains(out.String(), "cache hit") {
			what = "image build (cache hit)"
		}
		Timings.Record(what, d)
		if imageErr != nil {
			imageErr = fmt.Errorf("hack/vm/build-image.sh: %w\n%s", imageErr, out.String())
		} else {
			fmt.Fprintf(os.Stderr, "vm: %s: %s\n", what, d.Round(100*time.Millisecond))
		}
	})
	if imageErr != nil {
		t.Fatalf("vm: cannot build the VM image: %v", imageErr)
	}
}

// CacheDir is where build-image.sh keeps the image.
func CacheDir() string {
	if d := os.Getenv("VM_CACHE_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "lifecycle-agent", "vm")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "lifecycle-agent", "vm")
}

// RunDir makes a run directory for t, short enough for unix socket paths
// (qmp.sock, ssh's ControlPath), kept and printed when t fails.
func RunDir(t testing.TB) string {
	t.Helper()
	name := regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(strings.TrimPrefix(t.Name(), "Test"), "-")
	if len(name) > 24 {
		name = name[:24]
	}
	parent := os.Getenv("LIFECYCLE_AGENT_VM_DIR")
	if parent == "" {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "lavm-"+name+"-")
	if err != nil {
		t.Fatalf("vm: run dir: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("LIFECYCLE_AGENT_VM_KEEP") == "1" {
			t.Logf("vm: run directory kept: %s (serial.log, qemu.log, relay.log, guest-journal.txt, testenv/)", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

// Start boots a fresh VM (a new overlay on the cached image) and waits until
// ssh works. It is stopped when the test ends.
func Start(t testing.TB, opts Options) *VM {
	t.Helper()
	EnsureImage(t)
	dir := opts.Dir
	if dir == "" {
		dir = RunDir(t)
	}
	v := &VM{t: t, Dir: dir, opts: opts, cache: CacheDir()}
	v.key = filepath.Join(v.cache, "id_ed25519")
	t.Cleanup(v.cleanup)
	start := time.Now()
	v.launch(false)
	v.waitBoot(0, start, "boot")
	return v
}

func (v *VM) runVM() string { return filepath.Join(testenv.RepoRoot(), "hack", "vm", "run-vm.sh") }

// launch starts qemu through `run-vm.sh launch`, which execs qemu in the
// foreground: the process is our child and dies with the test binary.
func (v *VM) launch(reuseDisk bool) {
	v.t.Helper()
	logf, err := os.OpenFile(filepath.Join(v.Dir, "run-vm.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		v.t.Fatalf("vm: %v", err)
	}
	cmd := exec.Command(v.runVM(), "launch")
	cmd.Env = append(os.Environ(), "VM_RUN_DIR="+v.Dir, "VM_CACHE_DIR="+v.cache, "VM_API_FORWARD="+v.opts.APIForward)
	if reuseDisk {
		cmd.Env = append(cmd.Env, "VM_REUSE_DISK=1")
	}
	if v.opts.NoReboot {
		cmd.Env = append(cmd.Env, "VM_QEMU_EXTRA=-no-reboot")
	}
	if v.opts.Mem > 0 {
		cmd.Env = append(cmd.Env, "VM_MEM="+strconv.Itoa(v.opts.Mem))
	}
	if v.opts.SMP > 0 {
		cmd.Env = append(cmd.Env, "VM_SMP="+strconv.Itoa(v.opts.SMP))
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		v.t.Fatalf("vm: run-vm.sh launch: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	v.mu.Lock()
	v.proc, v.done = cmd, done
	v.mu.Unlock()
	// run-vm.sh writes ssh.port before it execs qemu.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(v.Dir, "ssh.port")); err == nil && len(bytes.TrimSpace(b)) > 0 {
			v.port = strings.TrimSpace(string(b))
			break
		}
		select {
		case <-done:
			v.t.Fatalf("vm: run-vm.sh launch exited early:\n%s", v.tailFile("run-vm.log", 30))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			v.t.Fatalf("vm: run-vm.sh launch wrote no ssh.port in 60s:\n%s", v.tailFile("run-vm.log", 30))
		}
	}
}

// Running reports whether qemu is still running.
func (v *VM) Running() bool {
	v.mu.Lock()
	done := v.done
	v.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

func (v *VM) exited() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.done
}

func bootTimeout() time.Duration {
	if s, err := strconv.Atoi(os.Getenv("VM_BOOT_TIMEOUT")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 300 * time.Second
}

// readyRE matches the boot marker of ci-ready.service, which is not always
// at the start of a line: the serial autologin shell's prompt may come first.
var readyRE = regexp.MustCompile(`CI-READY ([0-9a-f-]{36}) uptime=`)

// markers returns the boot IDs of the CI-READY lines on the serial console.
func (v *VM) markers() []string {
	b, _ := os.ReadFile(filepath.Join(v.Dir, "serial.log"))
	var ids []string
	for _, m := range readyRE.FindAllSubmatch(b, -1) {
		ids = append(ids, string(m[1]))
	}
	return ids
}

// Boots is how many boots the serial console has shown so far (for
// WaitBoot after a reboot the guest starts itself).
func (v *VM) Boots() int { return len(v.markers()) }

// WaitBoot waits for a boot after the first `after` ones (see Boots) and for
// ssh, and returns the new boot ID. Use it after a reboot that the guest
// (the agent) starts on its own.
func (v *VM) WaitBoot(after int) string {
	v.t.Helper()
	return v.waitBoot(after, time.Now(), "boot (guest-initiated)")
}

func (v *VM) waitBoot(after int, start time.Time, what string) string {
	v.t.Helper()
	v.closeMux()
	deadline := time.Now().Add(bootTimeout())
	var id string
	for {
		if ids := v.markers(); len(ids) > after {
			id = ids[len(ids)-1]
			break
		}
		if !v.Running() {
			v.t.Fatalf("vm: qemu exited while waiting for %s\n%s\n%s", what, v.tailFile("run-vm.log", 20), v.tailFile("serial.log", 30))
		}
		if time.Now().After(deadline) {
			v.t.Fatalf("vm: no boot marker after %s waiting for %s\n%s", bootTimeout(), what, v.tailFile("serial.log", 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	marker := time.Since(start)
	for {
		if _, _, code, err := v.ssh(30*time.Second, nil, "true"); err == nil && code == 0 {
			break
		}
		if !v.Running() {
			v.t.Fatalf("vm: qemu exited while waiting for ssh\n%s", v.tailFile("serial.log", 30))
		}
		if time.Now().After(deadline) {
			v.t.Fatalf("vm: ssh not ready %s after the boot marker", bootTimeout())
		}
		time.Sleep(500 * time.Millisecond)
	}
	d := time.Since(start)
	v.boots = v.Boots()
	Timings.Record(what, d)
	v.t.Logf("vm: %s: boot marker after %s, ssh after %s (boot_id %s)", what, marker.Round(100*time.Millisecond), d.Round(100*time.Millisecond), id)
	return id
}

func (v *VM) sshArgs() []string {
	return []string{
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=6",
		"-i", v.key, "-o", "ControlMaster=auto", "-o", "ControlPath=" + filepath.Join(v.Dir, "ssh.mux"), "-o", "ControlPersist=300",
	}
}

func (v *VM) closeMux() {
	mux := filepath.Join(v.Dir, "ssh.mux")
	if _, err := os.Stat(mux); err != nil {
		return
	}
	_ = exec.Command("ssh", "-o", "ControlPath="+mux, "-O", "exit", "root@127.0.0.1").Run()
	_ = os.Remove(mux)
}

// ssh runs cmd in the guest. err is set when ssh itself failed (exit 255)
// or the timeout passed; code is the remote exit code otherwise.
func (v *VM) ssh(timeout time.Duration, stdin []byte, cmd string) (stdout, stderr string, code int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args := append(v.sshArgs(), "-p", v.port, "root@127.0.0.1", cmd)
	c := exec.CommandContext(ctx, "ssh", args...)
	c.WaitDelay = 5 * time.Second
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &e
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	runErr := c.Run()
	stdout, stderr = o.String(), e.String()
	if ctx.Err() != nil {
		return stdout, stderr, -1, fmt.Errorf("vm: ssh %q: timeout after %s", cmd, timeout)
	}
	var ee *exec.ExitError
	if errors.As(runErr, &ee) {
		code = ee.ExitCode()
		if code == 255 {
			v.closeMux()
			return stdout, stderr, code, fmt.Errorf("vm: ssh %q: exit 255: %s", cmd, strings.TrimSpace(stderr))
		}
		return stdout, stderr, code, nil
	}
	if runErr != nil {
		return stdout, stderr, -1, fmt.Errorf("vm: ssh %q: %w", cmd, runErr)
	}
	return stdout, stderr, 0, nil
}

// CmdTimeout bounds one guest command.
const CmdTimeout = 10 * time.Minute

// Run runs cmd in the guest (through bash -c, as root) and returns its
// stdout and exit code. An ssh failure ends the test.
func (v *VM) Run(cmd string) (stdout string, code int) {
	v.t.Helper()
	out, errOut, code, err := v.ssh(CmdTimeout, nil, cmd)
	if err != nil {
		v.t.Fatalf("%v\nstderr: %s", err, errOut)
	}
	return out, code
}

// MustRun runs cmd and ends the test unless it exits 0.
func (v *VM) MustRun(cmd string) string {
	v.t.Helper()
	out, errOut, code, err := v.ssh(CmdTimeout, nil, cmd)
	if err != nil || code != 0 {
		v.t.Fatalf("vm: %q: exit %d %v\nstdout: %s\nstderr: %s", cmd, code, err, out, errOut)
	}
	return out
}

// Try runs cmd and reports every outcome, ssh failures included, without
// ending the test: for commands that may race with a reboot or shutdown.
func (v *VM) Try(cmd string) (stdout, stderr string, code int, err error) {
	return v.ssh(2*time.Minute, nil, cmd)
}

// WriteFile writes data to path in the guest with mode (e.g. 0o600), owned
// by root, through a temporary file and a rename.
func (v *VM) WriteFile(path string, data []byte, mode os.FileMode) {
	v.t.Helper()
	cmd := fmt.Sprintf("set -e; d=$(dirname %[1]q); mkdir -p \"$d\"; t=$(mktemp \"$d/.vmtmp.XXXXXX\"); cat > \"$t\"; chmod %[2]o \"$t\"; chown root:root \"$t\"; sync \"$t\"; mv -f \"$t\" %[1]q",
		path, mode.Perm())
	out, errOut, code, err := v.ssh(CmdTimeout, data, cmd)
	if err != nil || code != 0 {
		v.t.Fatalf("vm: write %s: exit %d %v\n%s%s", path, code, err, out, errOut)
	}
}

// CopyIn copies the host file src to dst in the guest (scp).
func (v *VM) CopyIn(src, dst string) {
	v.t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), CmdTimeout)
	defer cancel()
	args := append(v.sshArgs(), "-q", "-P", v.port, src, "root@127.0.0.1:"+dst)
	if out, err := exec.CommandContext(ctx, "scp", args...).CombinedOutput(); err != nil {
		v.t.Fatalf("vm: scp %s -> %s: %v\n%s", src, dst, err, out)
	}
	if st, err := os.Stat(src); err == nil {
		v.t.Logf("vm: copied %s (%d KiB) to %s in %s", filepath.Base(src), st.Size()/1024, dst, time.Since(start).Round(100*time.Millisecond))
	}
}

// CopyOut copies the guest file src to the host path dst.
func (v *VM) CopyOut(src, dst string) {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CmdTimeout)
	defer cancel()
	args := append(v.sshArgs(), "-q", "-P", v.port, "root@127.0.0.1:"+src, dst)
	if out, err := exec.CommandContext(ctx, "scp", args...).CombinedOutput(); err != nil {
		v.t.Fatalf("vm: scp %s -> %s: %v\n%s", src, dst, err, out)
	}
}

// BootID is the guest's current boot ID.
func (v *VM) BootID() string {
	v.t.Helper()
	return strings.TrimSpace(v.MustRun("cat /proc/sys/kernel/random/boot_id"))
}

// Reboot runs `systemctl reboot` in the guest and waits for the new boot.
// It returns the new boot ID, which differs from the old one.
func (v *VM) Reboot() string {
	v.t.Helper()
	old := v.BootID()
	before := v.Boots()
	start := time.Now()
	_, _, _, _ = v.ssh(30*time.Second, nil, "systemctl reboot")
	id := v.waitBoot(before, start, "reboot")
	if id == old {
		v.t.Fatalf("vm: boot ID %s unchanged after reboot", id)
	}
	return id
}

// HardReset presses the reset button (QMP system_reset): no orderly
// shutdown, what the guest had not synced is lost, as in a power cut. It
// waits for the next boot and returns its boot ID.
func (v *VM) HardReset() string {
	v.t.Helper()
	before := v.Boots()
	start := time.Now()
	if _, err := v.QMP("system_reset"); err != nil {
		v.t.Fatalf("vm: QMP system_reset: %v", err)
	}
	v.t.Logf("vm: power cut (QMP system_reset)")
	return v.waitBoot(before, start, "hard reset")
}

// Poweroff runs `systemctl poweroff` in the guest and waits until QEMU has
// exited (the guest powered off). The disk is kept for PowerOn.
func (v *VM) Poweroff() time.Duration {
	v.t.Helper()
	start := time.Now()
	_, _, _, _ = v.ssh(30*time.Second, nil, "systemctl poweroff")
	v.WaitPoweredOff(start)
	return time.Since(start)
}

// WaitPoweredOff waits until QEMU exits after a guest shutdown that
// started at start (VM_SHUTDOWN_TIMEOUT, default 120 s).
func (v *VM) WaitPoweredOff(start time.Time) {
	v.t.Helper()
	timeout := 120 * time.Second
	if s, err := strconv.Atoi(os.Getenv("VM_SHUTDOWN_TIMEOUT")); err == nil && s > 0 {
		timeout = time.Duration(s) * time.Second
	}
	select {
	case <-v.exited():
	case <-time.After(timeout):
		v.t.Fatalf("vm: guest did not power off within %s\n%s", timeout, v.tailFile("serial.log", 30))
	}
	v.closeMux()
	d := time.Since(start)
	Timings.Record("poweroff", d)
	v.t.Logf("vm: powered off in %s", d.Round(100*time.Millisecond))
}

// PowerOn boots the powered-off VM again on the same disk and waits for it.
func (v *VM) PowerOn() string {
	v.t.Helper()
	if v.Running() {
		v.t.Fatalf("vm: PowerOn: the VM is running")
	}
	before := v.Boots()
	start := time.Now()
	v.launch(true)
	return v.waitBoot(before, start, "power on")
}

// Journal returns the guest's systemd journal of unit, every boot, oldest
// first (journalctl -o short-precise).
func (v *VM) Journal(unit string) string {
	v.t.Helper()
	out, _ := v.Run("journalctl --no-pager -o short-precise -u " + shellQuote(unit))
	return out
}

// JournalBoot returns the journal of unit for one boot: 0 this one, -1 the
// previous one.
func (v *VM) JournalBoot(unit string, boot int) string {
	v.t.Helper()
	out, _ := v.Run(fmt.Sprintf("journalctl --no-pager -o short-precise -b %d -u %s", boot, shellQuote(unit)))
	return out
}

// Stop ends the VM at once (QMP quit, then SIGKILL): tests need no orderly
// shutdown at the end. Safe to call twice.
func (v *VM) Stop() {
	if !v.Running() {
		return
	}
	v.closeMux()
	_, _ = v.QMP("quit")
	select {
	case <-v.exited():
	case <-time.After(5 * time.Second):
		v.mu.Lock()
		if v.proc != nil && v.proc.Process != nil {
			_ = syscall.Kill(-v.proc.Process.Pid, syscall.SIGKILL)
		}
		v.mu.Unlock()
		<-v.exited()
	}
}

func (v *VM) cleanup() {
	saved := false
	if v.t.Failed() && v.Running() {
		if out, _, _, err := v.ssh(60*time.Second, nil, "journalctl --no-pager -o short-precise"); err == nil {
			saved = os.WriteFile(filepath.Join(v.Dir, "guest-journal.txt"), []byte(out), 0o644) == nil
		}
		if out, _, _, err := v.ssh(30*time.Second, nil, "systemctl --no-pager status lifecycle-agent; ls -la /var/lib/lifecycle-agent /etc/lifecycle-agent"); err == nil {
			_ = os.WriteFile(filepath.Join(v.Dir, "guest-status.txt"), []byte(out), 0o644)
		}
	}
	v.Stop()
	if v.t.Failed() && !saved {
		// ssh is gone (a guest without network, stuck in shutdown, or
		// powered off): read the persistent journal from the disk itself.
		if err := v.journalFromDisk(filepath.Join(v.Dir, "guest-journal.txt")); err != nil {
			v.t.Logf("vm: guest journal not recovered from the disk: %v", err)
		}
	}
	if v.t.Failed() {
		v.t.Logf("vm: last serial console lines:\n%s", v.tailFile("serial.log", 15))
	}
}

// journalFromDisk copies the guest's persistent journal out of the stopped
// VM's disk (qemu-img convert to a sparse raw file, debugfs rdump from the
// ext4 root, journalctl --file) into dst.
func (v *VM) journalFromDisk(dst string) error {
	tmp, err := os.MkdirTemp(v.Dir, "journal-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	raw := filepath.Join(tmp, "disk.raw")
	run := func(name string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return string(out), nil
	}
	if _, err := run("qemu-img", "convert", "-O", "raw", filepath.Join(v.Dir, "disk.qcow2"), raw); err != nil {
		return err
	}
	if _, err := run("debugfs", "-R", "rdump /var/log/journal "+tmp, raw); err != nil {
		return err
	}
	files, _ := filepath.Glob(filepath.Join(tmp, "journal", "*", "*.journal"))
	if len(files) == 0 {
		return errors.New("no journal files under /var/log/journal on the guest disk")
	}
	args := []string{"--no-pager", "-o", "short-precise"}
	for _, f := range files {
		args = append(args, "--file", f)
	}
	out, err := run("journalctl", args...)
	if err != nil {
		return err
	}
	v.t.Logf("vm: guest journal read from the disk (ssh unavailable): %s", dst)
	return os.WriteFile(dst, []byte(out), 0o644)
}

func (v *VM) tailFile(name string, n int) string {
	f, err := os.Open(filepath.Join(v.Dir, name))
	if err != nil {
		return "(no " + name + ")"
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, strings.TrimRight(sc.Text(), "\r"))
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return "--- " + name + " ---\n" + strings.Join(lines, "\n")
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
