// Package devicestest builds devices.Managers over go-nvml's mock DGX servers
// (mock/dgxh100 and mock/dgxa100) for the tests of the packages that use
// devices (the gpu-reset driver, gpuhealth, the gpu commands). It is a
// non-test package so that those tests can share it, and it lives under
// internal/devices because it imports go-nvml (STYLE 2).
//
// A Fleet is the hardware: eight GPUs whose health signals, processes, MIG
// and persistence modes, fabric state and reset behaviour are plain fields
// (GPU) that a test changes with Set. Every NVML call the devices package
// makes is wired to that model — go-nvml's mock panics on an unset func —
// and every mutating call is recorded in order (Calls):
//
//	persistence <uuid> on|off     SetPersistenceMode
//	drain <uuid> on|off           DeviceModifyDrainState
//	remove <uuid>                 DeviceRemoveGpu / DeviceRemoveGpu_v2 (accepted)
//	remove <uuid> refused         … answered ERROR_IN_USE
//	discover                      DeviceDiscoverGpus
//	nvidia-smi --gpu-reset -i <uuid,…> [refused]   the SMI route (SMIRunner, RunSMI)
//	reset <uuid>                  a reset took effect on that GPU
//
// A reset (NVML route: removal then rediscovery; SMI route: one nvidia-smi
// run) clears what a real reset clears: pending retired pages, pending row
// remaps, volatile ECC counters, the recovery action and latched state; on a
// DGX H100 the fabric then reports IN_PROGRESS for FabricPollsAfterReset
// reads before COMPLETED. Resets counts them per GPU, which is what crash
// tests assert ("exactly one reset per GPU").
//
// Models: DGXH100 (Hopper on NVSwitch: single GPUs may be reset, fabric
// registration is reported) and DGXA100 (Ampere on NVSwitch: the reset group
// is the whole set, GetGpuFabricInfo is NOT_SUPPORTED).
//
// Strict like the real tools:
//
//   - A GPU removed from the bus (NVML route) is gone: DeviceGetCount drops
//     it, DeviceGetHandleByIndex skips it, DeviceGetHandleByUUID answers
//     NOT_FOUND, nvidia-smi finds no such device — until DeviceDiscoverGpus.
//     OffBus models a GPU that fell off the bus: gone, and no rediscovery
//     brings it back.
//   - With DeviceNodes, every GPU has a device node file (nvidia<minor> in
//     a test directory). An initialized NVML session holds every node open,
//     as libnvidia-ml does (Init opens, Shutdown closes; counted per
//     process like nvmlInit). The nvidia-smi double refuses a reset while
//     any process — this one's NVML session, or a stand-in child process —
//     holds the GPU's node open, found from /proc/*/fd with
//     devices.FindHolders, exactly as the agent looks for them, with the
//     real tool's message: "In use by another client".
//   - The nvidia-smi double (SMIRunner) ends with its context, as the real
//     binary run by exec.CommandContext is killed: a reset killed midway
//     (SlowReset) resets nothing and fails with the signal.
package devicestest

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

// Model names a mock server.
type Model string

const (
	// DGXH100 is eight H100 SXM5 GPUs on NVSwitch (Hopper): single GPUs may
	// be reset; fabric registration is reported and waited for.
	DGXH100 Model = "dgxh100"
	// DGXA100 is eight A100 GPUs on NVSwitch (Ampere): the reset group is the
	// whole set; GetGpuFabricInfo answers NOT_SUPPORTED.
	DGXA100 Model = "dgxa100"
)

// Models lists both, for table tests.
var Models = []Model{DGXH100, DGXA100}

// GPU is the mutable state of one mock GPU. Change it with Fleet.Set; read
// it with Fleet.GPU.
type GPU struct {
	Persistence  bool
	ComputePIDs  []uint32
	GraphicsPIDs []uint32
	MIG          bool

	RetiredPagesPending    bool
	RemappedRowsPending    bool
	RemappedRowsFailure    bool
	ECCVolatileUncorrected uint64
	RecoveryAction         devices.RecoveryAction

	// NVLinksDown: every NVLink reports FEATURE_DISABLED (links not trained,
	// e.g. before Fabric Manager ran), so NVML shows no link to a switch.
	NVLinksDown bool
	// FabricState is what GetGpuFabricInfo reports (DGX H100 only).
	FabricState devices.FabricState
	// FabricPollsAfterReset: after a reset the fabric reports IN_PROGRESS for
	// this many reads, then COMPLETED.
	FabricPollsAfterReset int

	// FailReset makes every reset of this GPU fail: the NVML removal answers
	// ERROR_IN_USE, nvidia-smi exits 1.
	FailReset bool
	// Lost makes identity and signal reads answer ERROR_GPU_IS_LOST.
	Lost bool
	// ResetRequired makes the reads of its state (process lists, ECC
	// counters, retired pages, remapped rows) answer ERROR_RESET_REQUIRED,
	// NVML's "the GPU requires a reset before it can be used again";
	// identity, PCI and mode reads still answer. A reset clears it.
	ResetRequired bool

	// OffBus: the GPU fell off the bus; invisible to NVML and nvidia-smi,
	// and DeviceDiscoverGpus does not bring it back.
	OffBus bool

	// Set by the fleet.
	Resets        int // resets that took effect
	ResetAttempts int // resets tried (refused ones included)
	Removed       bool

	fabricPending int
	drained       bool // NVML drain state (DeviceModifyDrainState)
}

// Fleet is a mock DGX: a go-nvml mock server with every NVML call of the
// devices package wired to a GPU model. Safe for concurrent use.
type Fleet struct {
	model Model
	srv   *server.Server

	mu          sync.Mutex
	gpus        []*GPU
	calls       []string
	sets        []chan nvml.EventData // live event sets, each with its queue
	setsCreated int

	devRoot  string     // DeviceNodes' directory; "" without nodes
	inits    int        // nvmlInit count minus nvmlShutdown count
	held     []*os.File // the session's open device nodes
	resetLog io.Writer  // LogResets
	initFail nvml.Return
	stale    nvml.Return // DriverReload: what the open session answers

	resetTakes time.Duration // SlowReset
}

// New builds a fleet of the given model with healthy, idle GPUs:
// persistence off, MIG off, no processes, recovery action NONE, fabric
// COMPLETED (H100).
func New(model Model) *Fleet {
	var srv *server.Server
	switch model {
	case DGXH100:
		srv = dgxh100.New()
	case DGXA100:
		srv = dgxa100.New()
	default:
		panic(fmt.Sprintf("devicestest: unknown model %q", model))
	}
	f := &Fleet{model: model, srv: srv}
	for i := range srv.Devices {
		g := &GPU{RecoveryAction: devices.RecoveryActionNone}
		if model == DGXH100 {
			g.FabricState = devices.FabricCompleted
		}
		f.gpus = append(f.gpus, g)
		f.wireDevice(i)
	}
	f.wireServer()
	return f
}

// DeviceNodes creates a device node file nvidia<minor> per GPU under dir
// and returns dir. From then on an initialized NVML session holds them open
// and the nvidia-smi double refuses a reset of a GPU whose node any process
// holds. Call before the first Manager.
func (f *Fleet) DeviceNodes(dir string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.srv.Devices {
		p := filepath.Join(dir, fmt.Sprintf("nvidia%d", f.dev(i).Minor))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			return "", err
		}
	}
	f.devRoot = dir
	return dir, nil
}

// DevicePath is GPU i's device node (DeviceNodes).
func (f *Fleet) DevicePath(i int) string {
	return filepath.Join(f.devRoot, fmt.Sprintf("nvidia%d", f.dev(i).Minor))
}

// SessionOpen reports whether an NVML session (Init without Shutdown) is
// open on the fleet.
func (f *Fleet) SessionOpen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inits > 0
}

// FailInit makes the next Inits answer ret (SUCCESS clears it): a driver
// being reloaded answers ERROR_DRIVER_NOT_LOADED.
func (f *Fleet) FailInit(ret nvml.Return) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initFail = ret
}

// DriverReload: the driver under the open NVML session went away or was
// replaced, as the real library then behaves — every enumeration, handle
// and event wait of that session answers ret (ERROR_DRIVER_NOT_LOADED,
// ERROR_LIB_RM_VERSION_MISMATCH) until it is shut down; a new session
// (Init) works again unless FailInit says otherwise. No open session: a
// no-op.
func (f *Fleet) DriverReload(ret nvml.Return) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inits > 0 {
		f.stale = ret
	}
}

// Model is the fleet's model.
func (f *Fleet) Model() Model { return f.model }

// NVML is the mock library, for devices.Config.NVML.
func (f *Fleet) NVML() nvml.Interface { return f.srv }

// Len is the number of GPUs.
func (f *Fleet) Len() int { return len(f.srv.Devices) }

// StableUUIDs replaces the mock server's random GPU UUIDs with ones made
// from the model and the index, the same in every process: a test build's
// agent that restarts sees the GPUs it planned for, as a real host's keep
// their UUIDs. Call it before the first Manager.
func (f *Fleet) StableUUIDs() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.srv.Devices {
		f.dev(i).UUID = fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", crc32.ChecksumIEEE([]byte(f.model)), i)
	}
}

// PCIBusID is GPU i's PCI bus ID as NVML reports it ("00000000:07:00.0"),
// read without an NVML session.
func (f *Fleet) PCIBusID(i int) string { return f.dev(i).PciBusID }

// UUID is GPU i's UUID.
func (f *Fleet) UUID(i int) string { return f.dev(i).UUID }

// UUIDs returns the UUIDs of the given indices, or of every GPU when none
// are given.
func (f *Fleet) UUIDs(idx ...int) []string {
	if len(idx) == 0 {
		for i := range f.srv.Devices {
			idx = append(idx, i)
		}
	}
	out := make([]string, 0, len(idx))
	for _, i := range idx {
		out = append(out, f.UUID(i))
	}
	return out
}

// Index returns the index of the GPU with that UUID, or -1.
func (f *Fleet) Index(uuid string) int {
	for i := range f.srv.Devices {
		if f.UUID(i) == uuid {
			return i
		}
	}
	return -1
}

// Set changes GPU i under the fleet's lock.
func (f *Fleet) Set(i int, fn func(*GPU)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.gpus[i])
}

// SetAll changes every GPU.
func (f *Fleet) SetAll(fn func(*GPU)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range f.gpus {
		fn(g)
	}
}

// GPU returns a copy of GPU i's state.
func (f *Fleet) GPU(i int) GPU {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := *f.gpus[i]
	g.ComputePIDs = slices.Clone(g.ComputePIDs)
	g.GraphicsPIDs = slices.Clone(g.GraphicsPIDs)
	return g
}

// Resets returns the number of resets that took effect, per UUID (every GPU
// is listed, zeros included).
func (f *Fleet) Resets() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.gpus))
	for i, g := range f.gpus {
		out[f.UUID(i)] = g.Resets
	}
	return out
}

// Calls returns the recorded mutating calls, in order.
func (f *Fleet) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// ClearCalls forgets the recorded calls.
func (f *Fleet) ClearCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// Options tune Manager.
type Options struct {
	Clock              clock.Clock   // nil: the real clock
	Logger             *slog.Logger  // nil: discard
	FabricPollInterval time.Duration // 0: devices' default
	FabricTimeout      time.Duration // 0: devices' default
	EventWait          time.Duration // 0: 20 ms (the mock's Wait never blocks longer)
	// NVSwitchDevices is the nvidia-nvswitch device list the Manager reads;
	// "" reads none (never the host's).
	NVSwitchDevices string
}

// Manager builds and initializes a devices.Manager over the fleet. The
// caller calls Shutdown. Several Managers over one fleet model agent
// restarts: the hardware state survives, the in-process state does not.
func (f *Fleet) Manager(o Options) (*devices.Manager, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.EventWait == 0 {
		o.EventWait = 20 * time.Millisecond
	}
	m, err := devices.New(devices.Config{
		NVML: f.srv, Logger: o.Logger, Clock: o.Clock, EventWait: o.EventWait,
		FabricPollInterval: o.FabricPollInterval, FabricTimeout: o.FabricTimeout, NVSwitchDevices: nvswitchDevices(o.NVSwitchDevices),
	})
	if err != nil {
		return nil, err
	}
	if err := m.Init(); err != nil {
		return nil, err
	}
	return m, nil
}

func nvswitchDevices(p string) string {
	if p == "" {
		return devices.NoNVSwitchDevices
	}
	return p
}

// SMIRunner is a devices.CommandRunner that plays nvidia-smi for
// `nvidia-smi --gpu-reset -i <uuid,…>` against the fleet; any other command
// fails.
//
// It is as strict about its context as exec.CommandContext with the real
// binary: a context already done starts nothing, and a reset that takes
// time (SlowReset) is killed by the context's end, as the agent's exec
// kills nvidia-smi — the GPUs then not reset, and the call failing with
// the signal.
func (f *Fleet) SMIRunner() devices.CommandRunner {
	return func(ctx context.Context, name string, args ...string) ([]byte, []byte, error) {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		f.mu.Lock()
		takes := f.resetTakes
		f.mu.Unlock()
		if takes > 0 && slices.Contains(args, "--gpu-reset") {
			select {
			case <-time.After(takes):
			case <-ctx.Done():
				f.mu.Lock()
				f.calls = append(f.calls, name+" "+strings.Join(args, " ")+" killed")
				f.mu.Unlock()
				return nil, nil, errors.New("signal: terminated")
			}
		}
		out, err := f.RunSMI(append([]string{name}, args...))
		if err != nil {
			return []byte(out), []byte(err.Error()), err
		}
		return []byte(out), nil, nil
	}
}

// RunSMI plays nvidia-smi for argv (argv[0] is the binary). Like the real
// tool it refuses the whole reset when any named GPU has processes,
// persistence mode on, or FailReset set.
//
// argv may start with "chroot ROOT": nvidia-smi then runs inside a driver
// root (the GPU Operator's). Like chroot, that fails unless ROOT holds
// usr/bin/nvidia-smi; and the persistence daemon it reaches is ROOT's.
// Besides --gpu-reset it plays `nvidia-smi -i <uuid> -pm 0|1`: persistence
// mode set, and the persistence daemon listening on
// <root>/var/run/nvidia-persistenced/socket (ServePersistenced) told, as
// the real nvidia-smi tells nvidia-persistenced, so that it closes (or
// opens again) the GPU's device node. NVML's SetPersistenceMode in the
// agent's process does not reach that daemon: the node stays held.
func (f *Fleet) RunSMI(argv []string) (string, error) {
	root := "/"
	if len(argv) > 2 && argv[0] == "chroot" {
		root, argv = argv[1], argv[2:]
		if fi, err := os.Stat(filepath.Join(root, "usr/bin/nvidia-smi")); err != nil || fi.Mode()&0o111 == 0 || argv[0] != "nvidia-smi" {
			return "", fmt.Errorf("exit status 127: chroot: failed to run command '%s': No such file or directory", argv[0])
		}
	}
	if len(argv) == 5 && filepath.Base(argv[0]) == "nvidia-smi" && argv[1] == "-i" && argv[3] == "-pm" && (argv[4] == "0" || argv[4] == "1") {
		return f.smiPersistence(root, argv[2], argv[4] == "1")
	}
	if len(argv) != 4 || filepath.Base(argv[0]) != "nvidia-smi" || argv[1] != "--gpu-reset" || argv[2] != "-i" {
		return "", fmt.Errorf("devicestest: unexpected command %q", argv)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	uuids := strings.Split(argv[3], ",")
	var targets []int
	var refusals []string
	for _, u := range uuids {
		i := f.Index(u)
		if i < 0 || f.gpus[i].Removed || f.gpus[i].OffBus {
			f.calls = append(f.calls, "nvidia-smi --gpu-reset -i "+argv[3]+" refused")
			return "", fmt.Errorf("exit status 6: No devices were found matching %s", u)
		}
		targets = append(targets, i)
	}
	// Like nvidia-smi: any open file descriptor on the GPU's node counts.
	var holders []devices.Holder
	if f.devRoot != "" {
		var paths []string
		for _, i := range targets {
			paths = append(paths, filepath.Join(f.devRoot, fmt.Sprintf("nvidia%d", f.dev(i).Minor)))
		}
		scan, err := devices.FindHolders("", paths)
		if err != nil {
			return "", fmt.Errorf("devicestest: nvidia-smi double: %w", err)
		}
		holders = scan.Holders
	}
	for _, i := range targets {
		g := f.gpus[i]
		g.ResetAttempts++
		path := filepath.Join(f.devRoot, fmt.Sprintf("nvidia%d", f.dev(i).Minor))
		held := slices.ContainsFunc(holders, func(h devices.Holder) bool { return h.Device == path })
		switch {
		case g.FailReset, len(g.ComputePIDs) > 0, len(g.GraphicsPIDs) > 0, held:
			refusals = append(refusals, fmt.Sprintf("GPU %s: In use by another client", f.dev(i).PciBusID))
		case g.Persistence:
			refusals = append(refusals, fmt.Sprintf("GPU %s: persistence mode is enabled", f.dev(i).PciBusID))
		}
	}
	if len(refusals) > 0 {
		f.calls = append(f.calls, "nvidia-smi --gpu-reset -i "+argv[3]+" refused")
		return "", fmt.Errorf("exit status 255: The following GPUs could not be reset:\n  %s\n\n%d device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, graphics application such as an X server, or a monitoring application such as another instance of nvidia-smi). Please first kill all processes using this device and all compute applications running in the system",
			strings.Join(refusals, "\n  "), len(refusals))
	}
	f.calls = append(f.calls, "nvidia-smi --gpu-reset -i "+argv[3])
	var out []string
	for _, i := range targets {
		f.applyReset(i)
		out = append(out, fmt.Sprintf("GPU %s was successfully reset.", f.dev(i).PciBusID))
	}
	return strings.Join(out, "\n"), nil
}

// PersistencedSocket is where, under a root, nvidia-smi finds the
// persistence daemon (nvidia-persistenced's default socket path).
const PersistencedSocket = "var/run/nvidia-persistenced/socket"

// smiPersistence plays `nvidia-smi -i uuid -pm 0|1` inside root.
func (f *Fleet) smiPersistence(root, uuid string, on bool) (string, error) {
	f.mu.Lock()
	i := f.Index(uuid)
	if i < 0 || f.gpus[i].Removed || f.gpus[i].OffBus {
		f.mu.Unlock()
		return "", fmt.Errorf("exit status 6: No devices were found matching %s", uuid)
	}
	f.gpus[i].Persistence = on
	mode := "off"
	if on {
		mode = "on"
	}
	f.calls = append(f.calls, "nvidia-smi persistence "+uuid+" "+mode)
	node := filepath.Join(f.devRoot, fmt.Sprintf("nvidia%d", f.dev(i).Minor))
	bus := f.dev(i).PciBusID
	f.mu.Unlock()
	sock := filepath.Join(root, PersistencedSocket)
	if _, err := os.Stat(sock); err == nil {
		if err := askPersistenced(sock, on, node); err != nil {
			return "", fmt.Errorf("exit status 255: Failed to set persistence mode for GPU %s: %v", bus, err)
		}
	}
	word := "Disabled"
	if on {
		word = "Enabled"
	}
	return fmt.Sprintf("%s persistence mode for GPU %s.\nAll done.", word, bus), nil
}

// askPersistenced sends "pm 0|1 <node>" to the daemon at sock and waits
// for its "ok".
func askPersistenced(sock string, on bool, node string) error {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return fmt.Errorf("nvidia-persistenced does not answer: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	mode := "0"
	if on {
		mode = "1"
	}
	if _, err := fmt.Fprintf(c, "pm %s %s\n", mode, node); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("nvidia-persistenced: %w", err)
	}
	if strings.TrimSpace(line) != "ok" {
		return fmt.Errorf("nvidia-persistenced: %s", strings.TrimSpace(line))
	}
	return nil
}

// ServePersistenced plays the GPU Operator driver container's
// nvidia-persistenced in its own process: it holds every node of nodes
// open (persistence mode on), listens on socket, and on "pm 0 <node>"
// closes that node, on "pm 1 <node>" opens it again, answering "ok" — as
// the real daemon lets go of a GPU when nvidia-smi turns its persistence
// off. It returns when ctx ends.
func ServePersistenced(ctx context.Context, socket string, nodes []string) error {
	held := map[string]*os.File{}
	for _, n := range nodes {
		fh, err := os.Open(n)
		if err != nil {
			return err
		}
		held[n] = fh
	}
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return err
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); l.Close() }()
	var mu sync.Mutex
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			var mode, node string
			if _, err := fmt.Sscanf(line, "pm %s %s", &mode, &node); err != nil {
				fmt.Fprintf(c, "bad request %q\n", strings.TrimSpace(line))
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch fh := held[node]; {
			case mode == "0" && fh != nil:
				_ = fh.Close()
				held[node] = nil
			case mode == "1" && fh == nil:
				fh, err := os.Open(node)
				if err != nil {
					fmt.Fprintf(c, "%v\n", err)
					return
				}
				held[node] = fh
			}
			fmt.Fprintln(c, "ok")
		}()
	}
}

// InjectXID delivers a critical-XID event for GPU i to every live event
// set, as NVML does: a watcher started before the call sees it.
func (f *Fleet) InjectXID(i int, xid uint64) {
	f.deliver(nvml.EventData{Device: f.dev(i), EventType: uint64(nvml.EventTypeXidCriticalError), EventData: xid})
}

// InjectRecoveryAction delivers a GPU-recovery-action event for GPU i.
func (f *Fleet) InjectRecoveryAction(i int, a devices.RecoveryAction) {
	f.deliver(nvml.EventData{Device: f.dev(i), EventType: uint64(nvml.EventTypeGpuRecoveryAction), EventData: uint64(a)})
}

func (f *Fleet) deliver(e nvml.EventData) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range f.sets {
		select {
		case ch <- e:
		default: // a full queue drops, like an overrun NVML event buffer
		}
	}
}

// EventSets reports how many event sets are live (created, not freed) and
// how many were ever created: a test waits for a watcher to be in place
// before it injects events.
func (f *Fleet) EventSets() (live, created int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sets), f.setsCreated
}

// applyReset makes a reset of GPU i take effect. Call under f.mu.
func (f *Fleet) applyReset(i int) {
	g := f.gpus[i]
	g.Resets++
	g.Removed = false
	g.RetiredPagesPending = false
	g.RemappedRowsPending = false
	g.ECCVolatileUncorrected = 0
	g.RecoveryAction = devices.RecoveryActionNone
	g.ResetRequired = false
	if f.model == DGXH100 {
		g.fabricPending = g.FabricPollsAfterReset
		g.FabricState = devices.FabricInProgress
		if g.fabricPending == 0 {
			g.FabricState = devices.FabricCompleted
		}
	}
	f.calls = append(f.calls, "reset "+f.UUID(i))
	if f.resetLog != nil {
		session := "closed"
		if f.inits > 0 {
			session = "open"
		}
		fmt.Fprintf(f.resetLog, "reset %s session=%s eventsets=%d\n", f.UUID(i), session, len(f.sets))
	}
}

// SlowReset makes every nvidia-smi --gpu-reset through SMIRunner take d
// (a reset scrubs ECC: seconds per GPU), so that a test can act while it
// runs.
func (f *Fleet) SlowReset(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resetTakes = d
}

// LogResets makes every reset that takes effect write a line to w: "reset
// <uuid> session=<open|closed> eventsets=<n>", whether an NVML session was
// open and how many event sets were live at that moment (a test of the
// real binary reads it: the agent's monitor is paused during a reset).
func (f *Fleet) LogResets(w io.Writer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resetLog = w
}

func (f *Fleet) dev(i int) *server.Device { return f.srv.Devices[i].(*server.Device) }

// byBus finds the GPU a PciInfo names. Call under f.mu.
func (f *Fleet) byBus(p *nvml.PciInfo) (int, *GPU, bool) {
	bus := cString(p.BusId[:])
	for i := range f.srv.Devices {
		if f.dev(i).PciBusID == bus {
			return i, f.gpus[i], true
		}
	}
	return -1, nil, false
}

func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func (f *Fleet) wireServer() {
	s := f.srv
	s.DeviceModifyDrainStateFunc = func(p *nvml.PciInfo, st nvml.EnableState) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		i, g, ok := f.byBus(p)
		if !ok {
			return nvml.ERROR_NOT_FOUND
		}
		f.calls = append(f.calls, fmt.Sprintf("drain %s %s", f.UUID(i), onOff(st == nvml.FEATURE_ENABLED)))
		g.drained = st == nvml.FEATURE_ENABLED
		return nvml.SUCCESS
	}
	s.DeviceQueryDrainStateFunc = func(p *nvml.PciInfo) (nvml.EnableState, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, g, ok := f.byBus(p)
		if !ok {
			return 0, nvml.ERROR_NOT_FOUND
		}
		if g.drained {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	remove := func(p *nvml.PciInfo) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		i, g, ok := f.byBus(p)
		if !ok {
			return nvml.ERROR_NOT_FOUND
		}
		g.ResetAttempts++
		if g.FailReset || len(g.ComputePIDs) > 0 || len(g.GraphicsPIDs) > 0 || g.Persistence {
			f.calls = append(f.calls, "remove "+f.UUID(i)+" refused")
			return nvml.ERROR_IN_USE
		}
		f.calls = append(f.calls, "remove "+f.UUID(i))
		g.Removed = true
		return nvml.SUCCESS
	}
	s.DeviceRemoveGpu_v2Func = func(p *nvml.PciInfo, _ nvml.DetachGpuState, _ nvml.PcieLinkState) nvml.Return {
		return remove(p)
	}
	s.DeviceRemoveGpuFunc = remove
	s.DeviceDiscoverGpusFunc = func() (nvml.PciInfo, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.calls = append(f.calls, "discover")
		for i, g := range f.gpus {
			g.drained = false
			if g.Removed && !g.OffBus {
				f.applyReset(i)
			}
		}
		return nvml.PciInfo{}, nvml.SUCCESS
	}
	visible := func(i int) bool { return !f.gpus[i].Removed && !f.gpus[i].OffBus }
	s.DeviceGetCountFunc = func() (int, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.stale != nvml.SUCCESS {
			return 0, f.stale
		}
		n := 0
		for i := range f.gpus {
			if visible(i) {
				n++
			}
		}
		return n, nvml.SUCCESS
	}
	s.DeviceGetHandleByIndexFunc = func(index int) (nvml.Device, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.stale != nvml.SUCCESS {
			return nil, f.stale
		}
		for i := range f.gpus {
			if !visible(i) {
				continue
			}
			if index == 0 {
				return s.Devices[i], nvml.SUCCESS
			}
			index--
		}
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	s.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.stale != nvml.SUCCESS {
			return nil, f.stale
		}
		for i := range f.gpus {
			if f.dev(i).UUID == uuid {
				if !visible(i) {
					return nil, nvml.ERROR_NOT_FOUND
				}
				return s.Devices[i], nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	s.InitFunc = func() nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.initFail != nvml.SUCCESS {
			return f.initFail
		}
		f.inits++
		if f.inits == 1 && f.devRoot != "" {
			for i := range f.gpus {
				if !visible(i) {
					continue
				}
				fh, err := os.Open(filepath.Join(f.devRoot, fmt.Sprintf("nvidia%d", f.dev(i).Minor)))
				if err != nil {
					return nvml.ERROR_NO_PERMISSION
				}
				f.held = append(f.held, fh)
			}
		}
		return nvml.SUCCESS
	}
	s.ShutdownFunc = func() nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.inits == 0 {
			return nvml.ERROR_UNINITIALIZED
		}
		f.inits--
		if f.inits == 0 {
			f.stale = nvml.SUCCESS
			for _, fh := range f.held {
				_ = fh.Close()
			}
			f.held = nil
		}
		return nvml.SUCCESS
	}
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		ch := make(chan nvml.EventData, 64)
		f.mu.Lock()
		f.sets = append(f.sets, ch)
		f.setsCreated++
		f.mu.Unlock()
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				f.mu.Lock()
				stale := f.stale
				f.mu.Unlock()
				if stale != nvml.SUCCESS {
					return nvml.EventData{}, stale
				}
				// The mock driver's own time, not the logic's: bounded and short.
				t := time.NewTimer(min(time.Duration(ms)*time.Millisecond, 20*time.Millisecond))
				defer t.Stop()
				select {
				case e := <-ch:
					return e, nvml.SUCCESS
				case <-t.C:
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return {
				f.mu.Lock()
				defer f.mu.Unlock()
				f.sets = slices.DeleteFunc(f.sets, func(c chan nvml.EventData) bool { return c == ch })
				return nvml.SUCCESS
			},
		}, nvml.SUCCESS
	}
}

func (f *Fleet) wireDevice(i int) {
	d := f.dev(i)
	// read runs fn on GPU i's state under the lock; a lost GPU answers
	// ERROR_GPU_IS_LOST.
	read := func(fn func(g *GPU) nvml.Return) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.gpus[i].Lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		return fn(f.gpus[i])
	}
	// state is read for the GPU's state: a GPU that requires a reset
	// answers ERROR_RESET_REQUIRED.
	state := func(fn func(g *GPU) nvml.Return) nvml.Return {
		return read(func(g *GPU) nvml.Return {
			if g.ResetRequired {
				return nvml.ERROR_RESET_REQUIRED
			}
			return fn(g)
		})
	}
	d.GetUUIDFunc = func() (string, nvml.Return) {
		ret := read(func(*GPU) nvml.Return { return nvml.SUCCESS })
		if ret != nvml.SUCCESS {
			return "", ret
		}
		return d.UUID, nvml.SUCCESS
	}
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p := nvml.PciInfo{Bus: uint32(d.Index), PciDeviceId: d.Config.PciDeviceId}
		for j := 0; j < len(d.PciBusID) && j < len(p.BusId)-1; j++ {
			p.BusId[j] = int8(d.PciBusID[j])
		}
		return p, nvml.SUCCESS
	}
	d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) {
		var on bool
		ret := read(func(g *GPU) nvml.Return { on = g.Persistence; return nvml.SUCCESS })
		if on {
			return nvml.FEATURE_ENABLED, ret
		}
		return nvml.FEATURE_DISABLED, ret
	}
	d.SetPersistenceModeFunc = func(m nvml.EnableState) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		g := f.gpus[i]
		g.Persistence = m == nvml.FEATURE_ENABLED
		f.calls = append(f.calls, fmt.Sprintf("persistence %s %s", d.UUID, onOff(g.Persistence)))
		return nvml.SUCCESS
	}
	procs := func(graphics bool) ([]nvml.ProcessInfo, nvml.Return) {
		var out []nvml.ProcessInfo
		ret := state(func(g *GPU) nvml.Return {
			pids := g.ComputePIDs
			if graphics {
				pids = g.GraphicsPIDs
			}
			for _, p := range pids {
				out = append(out, nvml.ProcessInfo{Pid: p, UsedGpuMemory: 1 << 30})
			}
			return nvml.SUCCESS
		})
		return out, ret
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs(false) }
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs(true) }
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		mode := nvml.DEVICE_MIG_DISABLE
		ret := read(func(g *GPU) nvml.Return {
			if g.MIG {
				mode = nvml.DEVICE_MIG_ENABLE
			}
			return nvml.SUCCESS
		})
		return mode, mode, ret
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		st := nvml.FEATURE_DISABLED
		ret := state(func(g *GPU) nvml.Return {
			if g.RetiredPagesPending {
				st = nvml.FEATURE_ENABLED
			}
			return nvml.SUCCESS
		})
		return st, ret
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		var pending, failure bool
		ret := state(func(g *GPU) nvml.Return {
			if g.MIG {
				return nvml.ERROR_NOT_SUPPORTED // as on real GPUs
			}
			pending, failure = g.RemappedRowsPending, g.RemappedRowsFailure
			return nvml.SUCCESS
		})
		return 0, 0, pending, failure, ret
	}
	d.GetTotalEccErrorsFunc = func(et nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
		var n uint64
		ret := state(func(g *GPU) nvml.Return {
			if et == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
				n = g.ECCVolatileUncorrected
			}
			return nvml.SUCCESS
		})
		return n, ret
	}
	d.GetFieldValuesFunc = func(vals []nvml.FieldValue) nvml.Return {
		return read(func(g *GPU) nvml.Return {
			for k := range vals {
				if vals[k].FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
					vals[k].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
					continue
				}
				vals[k].NvmlReturn = uint32(nvml.SUCCESS)
				vals[k].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
				binary.NativeEndian.PutUint32(vals[k].Value[:], uint32(g.RecoveryAction))
			}
			return nvml.SUCCESS
		})
	}
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		if f.model != DGXH100 {
			return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		var fi nvml.GpuFabricInfo
		ret := read(func(g *GPU) nvml.Return {
			if g.fabricPending > 0 {
				g.fabricPending--
				fi.State = uint8(devices.FabricInProgress)
				if g.fabricPending == 0 {
					g.FabricState = devices.FabricCompleted
				}
				return nvml.SUCCESS
			}
			fi.State = uint8(g.FabricState)
			return nvml.SUCCESS
		})
		return fi, ret
	}
	links := 12 // A100: 12 NVLinks, all to NVSwitches
	if f.model == DGXH100 {
		links = 18
	}
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if link >= links {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		state := nvml.FEATURE_ENABLED
		ret := read(func(g *GPU) nvml.Return {
			if g.NVLinksDown {
				state = nvml.FEATURE_DISABLED
			}
			return nvml.SUCCESS
		})
		return state, ret
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
	}
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return uint64(nvml.EventTypeAll), nvml.SUCCESS
	}
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
}
