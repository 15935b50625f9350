package crash

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
)

// TestGPUResetShippedWiring resets GPUs through the agent as it is
// assembled (internal/agent wires the gpu-reset driver to its own NVML
// session and GPU health monitor), not through a driver built by a test:
// the real binary in real host mode (a test logind on a private D-Bus for
// the inhibitor), on go-nvml's mock of a DGX H100 whose GPUs have device
// node files that the agent's NVML session holds open, as libnvidia-ml
// holds /dev/nvidia*. The nvidia-smi double refuses a reset while any
// process — the agent included — holds a node, with the real tool's words.
//
// GPU 0 starts with recovery action GPU_RESET, so GPUHealthy is False; the
// event must end Succeeded, the mock must see the reset with the agent's
// NVML session closed (nvidia-smi route) or open (NVML route) and no XID
// event set live (the monitor paused), and GPUHealthy must turn True after
// it: the monitor runs again. Without the pause (the wiring before this
// test existed, restored by a test-build switch) the same event ends
// Failed naming lifecycle-agent as the holder: the test can fail.
func TestGPUResetShippedWiring(t *testing.T) {
	fleet := devicestest.New(devicestest.DGXH100)
	fleet.StableUUIDs() // as the agent's test build does
	all := fleet.UUIDs(0, 1, 2, 3, 4, 5, 6, 7)
	for _, tc := range []struct {
		name, node, method, gpus string
		faults                   string // the mock's faults, when not GPU 0's GPU_RESET
		noSession                bool
		want                     []string // reset-log lines, in order; nil: no reset
		fail                     *regexp.Regexp
		check                    *regexp.Regexp // the check-gpus step's progress, in the agent's log
	}{
		{name: "nvidia-smi one GPU", node: "gpuw-smi", method: "auto", gpus: "0",
			want: []string{"reset " + all[0] + " session=closed eventsets=0"}},
		{name: "nvidia-smi all GPUs", node: "gpuw-all", method: "nvidia-smi", gpus: "all",
			want: resetLines(all, "closed")},
		{name: "nvml one GPU", node: "gpuw-nvml", method: "nvml", gpus: "0",
			want: []string{"reset " + all[0] + " session=open eventsets=0"}},
		{name: "without the pause", node: "gpuw-nopause", method: "auto", gpus: "0", noSession: true,
			fail: regexp.MustCompile(`processes hold the GPUs being reset: lifecycle-agent \(pid \d+\) holds \S+/nvidia0`)},
		// GPU 0 answers ERROR_RESET_REQUIRED to its process lists (and
		// ECC, retired pages, remapped rows): the reset it asks for goes
		// ahead, the device node's holders deciding, not refused for the
		// lists it cannot read (it was, with "process list unavailable").
		{name: "nvidia-smi a GPU that requires a reset", node: "gpuw-rr", method: "auto", gpus: "0", faults: "0:RESET_REQUIRED",
			want:  []string{"reset " + all[0] + " session=closed eventsets=0"},
			check: regexp.MustCompile(`step=check-gpus message="preconditions met: .*warning: \S+ \(index 0\): process list unreadable: the GPU requires a reset \(ERROR_RESET_REQUIRED\)`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runGPUWiringCase(t, tc.node, tc.method, tc.gpus, tc.faults, tc.noSession, tc.want, tc.fail, tc.check)
		})
	}
}

// TestGPUResetNotInterruptedByCancel: a gpu-reset event deleted while
// nvidia-smi resets its GPU (the double's reset takes 3 s, and like the
// real binary it is killed if the agent cancels its command). A cancel
// takes effect at the next safe point (DESIGN §2), and the middle of a
// reset is not one: the reset completes (the mock logs it, the monitor
// paused), then the event is aborted and gone, and GPUHealthy turns True.
// Before, deleting the event cancelled the step's context and with it
// nvidia-smi: the mock logged no reset (on a real GPU: a reset killed
// midway), and the same for the event's deadline and the agent's stop.
func TestGPUResetNotInterruptedByCancel(t *testing.T) {
	ctx := context.Background()
	admin := env.AdminConfig()
	node := "gpuw-cancel"
	fleet := devicestest.New(devicestest.DGXH100)
	fleet.StableUUIDs()
	c, resetLog := gpuWiringCase(t, node, "nvidia-smi", "LIFECYCLE_AGENT_TEST_GPU_RESET_TAKES=3s")
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(admin)
	health := func() string { return gpuHealthy(ctx, cs, node) }
	a := c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	tn := node + "-gpu-reset"
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, tn, metav1.GetOptions{})
		return err == nil
	})
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: tn, BindingNode: node, Parameters: map[string]string{"gpus": "0"}}}
	if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reset under way", 60*time.Second, a, func() bool { return strings.Contains(a.logText(), logGPUReset) })
	if err := lc.Events.Delete(ctx, c.event, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the cancelled event gone", 2*time.Minute, a, func() bool {
		_, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	b, _ := os.ReadFile(resetLog)
	if got, want := strings.TrimSpace(string(b)), "reset "+fleet.UUIDs(0)[0]+" session=closed eventsets=0"; got != want {
		t.Fatalf("resets the mock saw: %q, want %q (the reset completed, then the cancel)\nagent log:\n%s", got, want, tail(a.log, 40))
	}
	if log := a.logText(); !strings.Contains(log, "cancel") {
		t.Errorf("the agent did not log the cancel:\n%s", tail(a.log, 40))
	}
	waitFor(t, "GPUHealthy True after the reset (the monitor runs again)", 30*time.Second, a, func() bool {
		return strings.HasPrefix(health(), string(corev1.ConditionTrue)+"/")
	}, health)
}

// gpuWiringCase is a case for the real binary in real host mode on
// go-nvml's mock of a DGX H100, GPU 0 with recovery action GPU_RESET, its
// device nodes held by the agent's NVML session and the test build's
// nvidia-smi double (a test logind for the inhibitor; gpu.resetMethod
// method; extraEnv for the agent). It returns the case and the file where
// the mock logs each reset that took effect.
func gpuWiringCase(t *testing.T, node, method string, extraEnv ...string) (*crashCase, string) {
	t.Helper()
	kubelet := chaosNode(t, node)
	logind := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	c := chaosCase(t, node, node+"-reset", agentConfig+"gpu:\n  resetMethod: "+method+"\n", env.NodeConfig(node))
	c.kubelet = kubelet
	c.hostMode = "real"
	devDir := filepath.Join(c.dir, "dev")
	if err := os.Mkdir(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	resetLog := filepath.Join(c.dir, "resets")
	c.extraEnv = append(c.extraEnv, "DBUS_SYSTEM_BUS_ADDRESS="+logind.Address(),
		"LIFECYCLE_AGENT_TEST_NVML=dgxh100", "LIFECYCLE_AGENT_TEST_NVML_FAULTS=0:GPU_RESET",
		"LIFECYCLE_AGENT_TEST_GPU_DEVICES="+devDir, "LIFECYCLE_AGENT_TEST_GPU_RESET_LOG="+resetLog)
	c.extraEnv = append(c.extraEnv, extraEnv...)
	return c, resetLog
}

func resetLines(uuids []string, session string) []string {
	var out []string
	for _, u := range uuids {
		out = append(out, fmt.Sprintf("reset %s session=%s eventsets=0", u, session))
	}
	return out
}

func runGPUWiringCase(t *testing.T, node, method, gpus, faults string, noSession bool, want []string, fail, check *regexp.Regexp) {
	ctx := context.Background()
	admin := env.AdminConfig()
	var extra []string
	if noSession {
		extra = append(extra, "LIFECYCLE_AGENT_TEST_NO_GPU_SESSION=1")
	}
	if faults != "" {
		extra = append(extra, "LIFECYCLE_AGENT_TEST_NVML_FAULTS="+faults) // the last value of a key is the one used
	}
	c, resetLog := gpuWiringCase(t, node, method, extra...)
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(admin)
	health := func() string { return gpuHealthy(ctx, cs, node) }
	a := c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	tn := node + "-gpu-reset"
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, tn, metav1.GetOptions{})
		return err == nil
	})
	waitFor(t, "GPUHealthy False for GPU 0's fault", 60*time.Second, a, func() bool {
		return strings.HasPrefix(health(), string(corev1.ConditionFalse)+"/")
	}, health)
	got := runGPUReset(t, lc, c, a, tn, gpus)
	var resets []string
	if b, _ := os.ReadFile(resetLog); len(b) > 0 {
		resets = strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	if fail != nil {
		if got.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !fail.MatchString(got.Status.Message) {
			t.Fatalf("without the pause the gpu-reset ended %s: %q; want Failed matching %s", got.Status.ClaimStatus, got.Status.Message, fail)
		}
		if len(resets) != 0 {
			t.Errorf("without the pause the mock saw resets: %q", resets)
		}
		return
	}
	if got.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("gpu-reset ended %s: %s\nagent log:\n%s", got.Status.ClaimStatus, got.Status.Message, tail(a.log, 40))
	}
	if strings.Join(resets, "\n") != strings.Join(want, "\n") {
		t.Errorf("resets the mock saw:\n%s\nwant:\n%s", strings.Join(resets, "\n"), strings.Join(want, "\n"))
	}
	if check != nil && !check.MatchString(a.logText()) {
		t.Errorf("the check-gpus step's progress (the status message, the agent's log) does not match %s:\n%s", check, tail(a.log, 40))
	}
	waitFor(t, "GPUHealthy True after the reset (the monitor runs again)", 30*time.Second, a, func() bool {
		return strings.HasPrefix(health(), string(corev1.ConditionTrue)+"/")
	}, health)
	log := a.logText()
	for _, w := range []string{"GPU monitor paused", "GPU monitor resumed"} {
		if !strings.Contains(log, w) {
			t.Errorf("the agent did not log %q", w)
		}
	}
}

// EnvPersistenced, set by runGPUDriverRootCase for a child copy of this
// test binary, makes it the driver container's nvidia-persistenced
// (devicestest.ServePersistenced): SOCKET|NODE,NODE,…
const envPersistenced = "CRASH_TEST_PERSISTENCED"

// persistencedMain runs the stand-in daemon when this binary was started
// as one; it reports whether it was.
func persistencedMain() bool {
	v := os.Getenv(envPersistenced)
	if v == "" {
		return false
	}
	sock, nodes, _ := strings.Cut(v, "|")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := devicestest.ServePersistenced(ctx, sock, strings.Split(nodes, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "persistenced stand-in:", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

// TestGPUResetOperatorDriverRoot: a GPU Operator node. The driver lives
// in the driver container, its root at gpu.driverRoot (a directory with
// usr/bin/nvidia-smi here), and the container's nvidia-persistenced holds
// the GPU's device node with persistence mode on (a stand-in process that
// lets go when nvidia-smi of its root asks, as the real daemon does). The
// agent (gpu.nvidiaSMI auto) runs the root's nvidia-smi (chroot) for the
// persistence change and the reset: the event ends Succeeded, persistence
// is back on and the daemon holds the node again. Turning persistence off
// through the host's NVML (what the agent did before) leaves the daemon
// holding the node and the reset refused naming it.
func TestGPUResetOperatorDriverRoot(t *testing.T) {
	ctx := context.Background()
	admin := env.AdminConfig()
	node := "gpuw-operator"
	kubelet := chaosNode(t, node)
	logind := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	c := chaosCase(t, node, node+"-reset", "", env.NodeConfig(node))
	root := filepath.Join(c.dir, "driver")
	devDir := filepath.Join(c.dir, "dev")
	for _, d := range []string{filepath.Join(root, "usr/bin"), devDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/nvidia-smi"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.config(), []byte(agentConfig+"gpu:\n  driverRoot: "+root+"\n  services: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.kubelet = kubelet
	c.hostMode = "real"
	fleet := devicestest.New(devicestest.DGXH100)
	if _, err := fleet.DeviceNodes(devDir); err != nil {
		t.Fatal(err)
	}
	fleet.StableUUIDs()
	u0 := fleet.UUID(0)
	// The daemon, holding GPU 0's node (persistence mode on for GPU 0).
	sock := filepath.Join(root, devicestest.PersistencedSocket)
	pd := exec.Command(os.Args[0], "-test.run=^$")
	pd.Env = append(os.Environ(), envPersistenced+"="+sock+"|"+fleet.DevicePath(0))
	pd.Stdout, pd.Stderr = os.Stderr, os.Stderr
	if err := pd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pd.Process.Signal(syscall.SIGTERM); _ = pd.Wait() })
	held := func() bool {
		scan, err := devices.FindHolders("", []string{fleet.DevicePath(0)})
		return err == nil && slices.ContainsFunc(scan.Holders, func(h devices.Holder) bool { return h.PID == pd.Process.Pid })
	}
	deadline := time.Now().Add(10 * time.Second)
	for !held() {
		if time.Now().After(deadline) {
			t.Fatal("the persistenced stand-in does not hold GPU 0's node")
		}
		time.Sleep(50 * time.Millisecond)
	}
	resetLog := filepath.Join(c.dir, "resets")
	c.extraEnv = append(c.extraEnv, "DBUS_SYSTEM_BUS_ADDRESS="+logind.Address(),
		"LIFECYCLE_AGENT_TEST_NVML=dgxh100", "LIFECYCLE_AGENT_TEST_NVML_FAULTS=0:PERSISTENCE",
		"LIFECYCLE_AGENT_TEST_GPU_DEVICES="+devDir, "LIFECYCLE_AGENT_TEST_GPU_RESET_LOG="+resetLog)
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		t.Fatal(err)
	}
	a := c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	tn := node + "-gpu-reset"
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, tn, metav1.GetOptions{})
		return err == nil
	})
	got := runGPUReset(t, lc, c, a, tn, "0")
	if got.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("gpu-reset ended %s: %s\nagent log:\n%s", got.Status.ClaimStatus, got.Status.Message, tail(a.log, 40))
	}
	if b, _ := os.ReadFile(resetLog); strings.TrimSpace(string(b)) != "reset "+u0+" session=closed eventsets=0" {
		t.Errorf("resets the mock saw: %q", b)
	}
	if !held() {
		t.Error("after the reset the persistence daemon does not hold GPU 0's node again (persistence mode not restored through it)")
	}
	log := a.logText()
	for _, w := range []string{"persistence mode set through the driver root's nvidia-smi", `route=nvidia-smi-in:` + root} {
		if !strings.Contains(log, w) {
			t.Errorf("the agent did not log %q", w)
		}
	}
}

// TestGPUStackStartsLate: on a GPU Operator node the driver pod starts
// after the agent at every boot, so NVML is not under gpu.driverRoot when
// the agent starts. The real agent starts without its GPU stack, and once
// the library appears (the test build's mock "appears" with a file) it
// starts GPU health and publishes the gpu-reset transition — without a
// restart — and a gpu-reset event then succeeds.
func TestGPUStackStartsLate(t *testing.T) {
	ctx := context.Background()
	node := "gpu-late"
	kubelet := chaosNode(t, node)
	c := chaosCase(t, node, node+"-reset", "", env.NodeConfig(node))
	root := filepath.Join(c.dir, "driver") // no libnvidia-ml.so.1 yet
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.config(), []byte(strings.Replace(chaosConfig, "gpu:\n", "gpu:\n  driverRoot: "+root+"\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.kubelet = kubelet
	appears := filepath.Join(c.dir, "driver-up")
	c.extraEnv = append(c.extraEnv, "LIFECYCLE_AGENT_TEST_NVML=dgxh100", "LIFECYCLE_AGENT_TEST_NVML_AFTER="+appears)
	lc, err := apiclient.NewLifecycleClients(env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	a := c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	waitFor(t, "the drain transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, node+"-drain", metav1.GetOptions{})
		return err == nil
	})
	tn := node + "-gpu-reset"
	if _, err := lc.Transitions.Get(ctx, tn, metav1.GetOptions{}); err == nil {
		t.Fatal("the gpu-reset transition is published before NVML loaded")
	}
	if err := os.WriteFile(appears, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the gpu-reset transition published once NVML loads", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, tn, metav1.GetOptions{})
		return err == nil
	})
	waitFor(t, "GPUHealthy published", 30*time.Second, a, func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == devices.ConditionType && c.Status == corev1.ConditionTrue
		})
	})
	got := runGPUReset(t, lc, c, a, tn, "0")
	if got.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("gpu-reset ended %s: %s", got.Status.ClaimStatus, got.Status.Message)
	}
	if a.exited() || !strings.Contains(a.logText(), "NVML loaded after start") {
		t.Errorf("the agent did not start its GPU stack in place (exited %v)", a.exited())
	}
}

// runGPUReset creates the case's gpu-reset event for gpus on transition tn
// and waits (up to 2 minutes) until it has ended.
func runGPUReset(t *testing.T, lc *apiclient.LifecycleClients, c *crashCase, a *agentProc, tn, gpus string) *v1alpha1.LifecycleEvent {
	t.Helper()
	ctx := context.Background()
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: tn, BindingNode: c.node, Parameters: map[string]string{"gpus": gpus}}}
	if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *v1alpha1.LifecycleEvent
	waitFor(t, "the gpu-reset to end", 2*time.Minute, a, func() bool {
		var err error
		got, err = lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && got.Status.CompletionTime != nil
	})
	return got
}
