package devices

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// GPUPreconditions is what a reset needs to know about one selected GPU.
type GPUPreconditions struct {
	UUID         string
	Index        int
	PCIBusID     string
	Architecture string
	// ProcessesKnown is false when a process list could not be read; the
	// reset is then refused (fail closed), unless ProcessesResetRequired:
	// the lists answered only ERROR_RESET_REQUIRED, the state the reset is
	// for (see Preconditions).
	ProcessesKnown         bool
	ProcessesResetRequired bool
	ComputePIDs            []uint32
	GraphicsPIDs           []uint32
	MIGCurrent             Tri
	MIGPending             Tri
	// Persistence "true" is not a blocker: ResetAndVerify turns it off and
	// restores it. Journal it before acting so a replay can restore it.
	Persistence Tri
}

// PreconditionReport answers "may these GPUs be reset now?".
type PreconditionReport struct {
	// NVSwitch: the host has NVSwitch-attached GPUs.
	NVSwitch bool
	// WholeSet: the architecture requires resetting every GPU together
	// (see ResetGroup); WholeSetReason says why.
	WholeSet       bool
	WholeSetReason string
	GPUs           []GPUPreconditions
	// Blockers are human-readable refusals, each naming the GPU.
	Blockers []string
	// Notes are what the caller should know but does not refuse the
	// reset, each naming the GPU: a process list a GPU that requires a
	// reset could not answer.
	Notes []string
}

// Err is nil when there are no blockers, else an error wrapping
// ErrPreconditions that names every blocker.
func (r PreconditionReport) Err() error {
	if len(r.Blockers) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrPreconditions, strings.Join(r.Blockers, "; "))
}

// Preconditions reads, for each selected GPU: running compute and graphics
// processes, MIG mode, persistence mode, and for the host whether it is an
// NVSwitch system and whether the selection must be the whole set. It returns
// an error only when NVML itself fails or a UUID is unknown; refusals are in
// the report (see Err).
//
// A process list unreadable because the GPU answers ERROR_RESET_REQUIRED
// is a note, not a blocker: NVML names that state "the GPU requires a
// reset before it can be used again", so refusing would leave the GPU the
// reset is for unusable for good. nvidia-smi itself decides "in use" by the
// device node's open file descriptors, and so does the caller's reset step
// (the gpu-reset driver scans the node's holders and refuses on any).
//
// Blockers: processes running; process list unreadable; MIG currently
// enabled (a reset destroys GPU instances that belong to the workload);
// MIG or persistence mode unreadable; GPU lost; a whole-set system with a
// partial selection.
func (m *Manager) Preconditions(uuids []string) (PreconditionReport, error) {
	if len(uuids) == 0 {
		return PreconditionReport{}, errors.New("devices: Preconditions: no GPUs given")
	}
	lib, release, err := m.acquire()
	if err != nil {
		return PreconditionReport{}, err
	}
	defer release()
	s, err := m.snapshot(lib)
	if err != nil {
		return PreconditionReport{}, err
	}
	rep := PreconditionReport{NVSwitch: s.NVSwitch}
	rep.WholeSet, rep.WholeSetReason = wholeSetRule(s)
	block := func(g GPUInfo, format string, args ...any) {
		rep.Blockers = append(rep.Blockers, gpuLabel(g.UUID, g.Index)+": "+fmt.Sprintf(format, args...))
	}
	uuids = dedupe(uuids)
	for _, uuid := range uuids {
		g, ok := s.GPU(uuid)
		if !ok {
			return PreconditionReport{}, fmt.Errorf("%w %s", ErrUnknownGPU, uuid)
		}
		rep.GPUs = append(rep.GPUs, GPUPreconditions{
			UUID: g.UUID, Index: g.Index, PCIBusID: g.PCIBusID, Architecture: g.Architecture,
			ProcessesKnown: g.ProcessesKnown, ProcessesResetRequired: g.ProcessesResetRequired,
			ComputePIDs: g.ComputePIDs, GraphicsPIDs: g.GraphicsPIDs,
			MIGCurrent: g.MIGCurrent, MIGPending: g.MIGPending, Persistence: g.Persistence,
		})
		if g.Lost {
			block(g, "GPU is lost (ERROR_GPU_IS_LOST); a reset cannot be prepared, reboot the node")
		}
		if len(g.ComputePIDs) > 0 || len(g.GraphicsPIDs) > 0 {
			// Known even when the other list was not read.
			block(g, "processes running (%s)", pidList(g.ComputePIDs, g.GraphicsPIDs))
		}
		switch {
		case g.ProcessesKnown:
		case g.Lost:
			// Blocked above: a lost GPU answers nothing.
		case g.ProcessesResetRequired:
			rep.Notes = append(rep.Notes, gpuLabel(g.UUID, g.Index)+
				": process list unreadable: the GPU requires a reset (ERROR_RESET_REQUIRED); no process may hold its device node at the reset")
		default:
			block(g, "process list unavailable%s", readErrSuffix(g, "GetComputeRunningProcesses", "GetGraphicsRunningProcesses"))
		}
		if g.MIGCurrent == TriTrue {
			block(g, "MIG enabled; destroy its GPU instances and disable MIG first")
		} else if g.failed("GetMigMode") {
			block(g, "MIG mode unreadable%s", readErrSuffix(g, "GetMigMode"))
		}
		if g.failed("GetPersistenceMode") {
			block(g, "persistence mode unreadable%s", readErrSuffix(g, "GetPersistenceMode"))
		}
	}
	if rep.WholeSet && len(uuids) < countUUIDs(s) {
		rep.Blockers = append(rep.Blockers, fmt.Sprintf(
			"selection has %d of %d GPUs but %s; select all GPUs (ResetGroup)", len(uuids), countUUIDs(s), rep.WholeSetReason))
	}
	return rep, nil
}

func pidList(compute, graphics []uint32) string {
	join := func(p []uint32) string {
		s := make([]string, len(p))
		for i, v := range p {
			s[i] = fmt.Sprint(v)
		}
		return strings.Join(s, ", ")
	}
	var parts []string
	if len(compute) > 0 {
		parts = append(parts, "compute PIDs "+join(compute))
	}
	if len(graphics) > 0 {
		parts = append(parts, "graphics PIDs "+join(graphics))
	}
	return strings.Join(parts, "; ")
}

func readErrSuffix(g GPUInfo, prefixes ...string) string {
	var errs []string
	for _, e := range g.ReadErrors {
		for _, p := range prefixes {
			if strings.HasPrefix(e, p) {
				errs = append(errs, e)
			}
		}
	}
	if len(errs) == 0 {
		return ""
	}
	return " (" + strings.Join(errs, "; ") + ")"
}

// dedupe drops repeated UUIDs, keeping the first occurrence's order.
func dedupe(ss []string) []string {
	seen := make(map[string]bool, len(ss))
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func uniq(ss []string) map[string]bool {
	m := make(map[string]bool, len(ss))
	for _, s := range ss {
		m[s] = true
	}
	return m
}

func countUUIDs(s Snapshot) int {
	n := 0
	for _, g := range s.GPUs {
		if g.UUID != "" {
			n++
		}
	}
	return n
}

// Group is a reset selection after ResetGroup.
type Group struct {
	Requested []string
	UUIDs     []string // what must be reset together, in index order
	Expanded  bool
	Reason    string
}

// ResetGroup expands a selection to the set the hardware resets together.
//
// Decision (NVSentinel design 019, NVIDIA reset docs):
//   - NVSwitch system with any pre-Hopper GPU (DGX/HGX A100): GPUs and
//     NVSwitches are reset together with Fabric Manager stopped, so the
//     selection becomes every GPU on the host.
//   - Hopper and later on NVSwitch (HGX H100/H200, B200): individual GPU reset
//     is allowed; the selection is unchanged. Wait for the fabric afterwards
//     (WaitFabricCompleted).
//   - Pre-Ampere GPUs with active NVLinks (no NVSwitch): the NVLink group is
//     reset together; the selection becomes every GPU.
//   - Otherwise (PCIe, Ampere+ NVLink bridges): unchanged.
//
// An unknown architecture on an NVSwitch system counts as pre-Hopper (fail
// closed: reset more rather than leave a fabric half-reset).
func (m *Manager) ResetGroup(uuids []string) (Group, error) {
	if len(uuids) == 0 {
		return Group{}, errors.New("devices: ResetGroup: no GPUs given")
	}
	lib, release, err := m.acquire()
	if err != nil {
		return Group{}, err
	}
	defer release()
	s, err := m.snapshot(lib)
	if err != nil {
		return Group{}, err
	}
	want := uniq(uuids)
	for u := range want {
		if _, ok := s.GPU(u); !ok {
			return Group{}, fmt.Errorf("%w %s", ErrUnknownGPU, u)
		}
	}
	g := Group{Requested: append([]string(nil), uuids...)}
	whole, reason := wholeSetRule(s)
	for _, gpu := range s.GPUs {
		if gpu.UUID != "" && (whole || want[gpu.UUID]) {
			g.UUIDs = append(g.UUIDs, gpu.UUID)
		}
	}
	if whole && len(g.UUIDs) > len(want) {
		g.Expanded, g.Reason = true, reason
		m.log.Info("reset selection expanded to the whole set", "requested", len(want), "gpus", len(g.UUIDs), "reason", reason)
	}
	return g, nil
}

func wholeSetRule(s Snapshot) (bool, string) {
	// A GPU whose architecture could not be read (lost, read error) does not
	// decide the rule; one that reads as DEVICE_ARCH_UNKNOWN does (fail closed).
	known := func(g GPUInfo) bool { return !g.Lost && g.UUID != "" && !g.failed("GetArchitecture") }
	if s.NVSwitch {
		for _, g := range s.GPUs {
			if known(g) && (g.arch < nvml.DEVICE_ARCH_HOPPER || g.arch == nvml.DEVICE_ARCH_UNKNOWN) {
				return true, fmt.Sprintf("pre-Hopper NVSwitch system (%s): GPUs and NVSwitches reset together with Fabric Manager stopped", g.Architecture)
			}
		}
		return false, ""
	}
	for _, g := range s.GPUs {
		if known(g) && g.NVLinksActive > 0 && (g.arch < nvml.DEVICE_ARCH_AMPERE || g.arch == nvml.DEVICE_ARCH_UNKNOWN) {
			return true, fmt.Sprintf("pre-Ampere NVLink system (%s): the NVLink group resets together", g.Architecture)
		}
	}
	return false, ""
}

// SetPersistenceMode turns persistence mode on or off for one GPU.
func (m *Manager) SetPersistenceMode(uuid string, on bool) error {
	lib, release, err := m.acquire()
	if err != nil {
		return err
	}
	defer release()
	dev, err := deviceByUUID(lib, uuid)
	if err != nil {
		return err
	}
	mode := nvml.FEATURE_DISABLED
	if on {
		mode = nvml.FEATURE_ENABLED
	}
	if err := nvmlErr(uuid, "SetPersistenceMode", dev.SetPersistenceMode(mode)); err != nil {
		return err
	}
	m.log.Info("persistence mode set", "gpu", uuid, "on", on)
	return nil
}

// ResolveByUUID re-resolves a GPU after a reset: indices, handles and even
// PCI enumeration order may have changed; the UUID is the only stable key.
func (m *Manager) ResolveByUUID(uuid string) (GPUInfo, error) {
	lib, release, err := m.acquire()
	if err != nil {
		return GPUInfo{}, err
	}
	defer release()
	dev, err := deviceByUUID(lib, uuid)
	if err != nil {
		return GPUInfo{}, err
	}
	g := newGPUInfo(-1)
	readIdentity(dev, &g)
	if len(g.ReadErrors) > 0 || g.Lost {
		return g, fmt.Errorf("devices: %s: identity unreadable after resolve: %s", uuid, strings.Join(g.ReadErrors, "; "))
	}
	return g, nil
}

// WaitFabricCompleted polls GetGpuFabricInfo every FabricPollInterval on the
// injected clock until the GPU reports GPU_FABRIC_STATE_COMPLETED with a
// SUCCESS status, ctx is done, or FabricTimeout elapses on the clock
// (ErrFabricTimeout). A GPU without fabric support returns nil at once. A
// COMPLETED state with an error status returns ErrFabricFailed. Lookup errors
// (the GPU still re-enumerating after a reset) keep polling.
func (m *Manager) WaitFabricCompleted(ctx context.Context, uuid string) error {
	start := m.clk.Now()
	deadline := start.Add(m.fabricTimeout)
	last := "no reading yet"
	for polls := 1; ; polls++ {
		state, status, err := m.fabricOnce(uuid)
		switch {
		case errors.Is(err, ErrNotInitialized):
			return err
		case errors.Is(err, ErrNotSupported), err == nil && state == FabricNotSupported:
			m.log.Debug("no fabric on this GPU; not waiting", "gpu", uuid)
			return nil
		case err != nil:
			last = err.Error()
		case state == FabricCompleted && status == nvml.SUCCESS:
			m.log.Info("fabric registration completed", "gpu", uuid, "polls", polls, "waited", m.clk.Since(start))
			return nil
		case state == FabricCompleted:
			return fmt.Errorf("%w: %s: status %s", ErrFabricFailed, uuid, ReturnName(status))
		default:
			last = "state " + state.String()
		}
		now := m.clk.Now()
		if !now.Before(deadline) {
			return fmt.Errorf("%w: %s after %s (%d polls, last %s)", ErrFabricTimeout, uuid, m.fabricTimeout, polls, last)
		}
		t := m.clk.NewTimer(min(m.fabricPoll, deadline.Sub(now)))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("devices: %s: waiting for fabric registration (last %s): %w", uuid, last, ctx.Err())
		case <-t.C():
		}
	}
}

func (m *Manager) fabricOnce(uuid string) (FabricState, nvml.Return, error) {
	lib, release, err := m.acquire()
	if err != nil {
		return 0, 0, err
	}
	defer release()
	if !m.has(symGpuFabricInfo) {
		return FabricNotSupported, nvml.SUCCESS, nil
	}
	dev, err := deviceByUUID(lib, uuid)
	if err != nil {
		return 0, 0, err
	}
	fi, ret := dev.GetGpuFabricInfo()
	if err := nvmlErr(uuid, "GetGpuFabricInfo", ret); err != nil {
		return 0, 0, err
	}
	return FabricState(fi.State), nvml.Return(fi.Status), nil
}

// VerifyHealthy re-reads the given GPUs and returns nil when every one is
// present and healthy (Evaluate), else an error wrapping ErrUnhealthy (or
// ErrUnknownGPU) that names each GPU and its reasons.
func (m *Manager) VerifyHealthy(uuids []string) error {
	s, err := m.Snapshot()
	if err != nil {
		return err
	}
	var missing, bad []string
	for _, u := range uuids {
		g, ok := s.GPU(u)
		if !ok {
			missing = append(missing, u)
			continue
		}
		h := evaluateGPU(g, s.NVSwitch)
		if !h.Healthy {
			msg := gpuLabel(g.UUID, g.Index) + ": " + strings.Join(h.Reasons, ", ")
			if len(h.Details) > 0 {
				msg += " (" + strings.Join(h.Details, "; ") + ")"
			}
			bad = append(bad, msg)
		}
	}
	var errs []error
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s not visible to NVML", ErrUnknownGPU, strings.Join(missing, ", ")))
	}
	if len(bad) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s", ErrUnhealthy, strings.Join(bad, "; ")))
	}
	return errors.Join(errs...)
}

// ResetOptions tune ResetAndVerify.
type ResetOptions struct {
	// DryRun logs every step (persistence changes, the reset plan, fabric
	// wait, verification) and changes nothing.
	DryRun bool
}

// ResetReport says what ResetAndVerify did.
type ResetReport struct {
	Preconditions PreconditionReport
	// PersistenceOff lists GPUs whose persistence mode was turned off;
	// PersistenceRestored those turned back on afterwards.
	PersistenceOff      []string
	PersistenceRestored []string
}

// ResetAndVerify is the whole reset for one selection:
//
//	Preconditions (refuse on any blocker, and on any note: it scans no
//	holders) → persistence off where on →
//	Resetter.Reset → ClearXIDs → persistence restored (always attempted,
//	also after a failed reset) → WaitFabricCompleted on NVSwitch systems →
//	VerifyHealthy.
//
// The gpu-reset driver may call the verbs itself instead, to journal each
// step; it should then journal Preconditions().GPUs[].Persistence first so a
// replay can restore persistence mode.
func (m *Manager) ResetAndVerify(ctx context.Context, r Resetter, uuids []string, opts ResetOptions) (ResetReport, error) {
	var rep ResetReport
	uuids = dedupe(uuids)
	pre, err := m.Preconditions(uuids)
	if err != nil {
		return rep, err
	}
	rep.Preconditions = pre
	if err := pre.Err(); err != nil {
		return rep, err
	}
	if len(pre.Notes) > 0 {
		// It scans no holders: what a note leaves to the caller refuses here.
		return rep, fmt.Errorf("%w: %s", ErrPreconditions, strings.Join(pre.Notes, "; "))
	}
	if opts.DryRun {
		r = m.dryRun(r)
	}

	for _, g := range pre.GPUs {
		if g.Persistence != TriTrue {
			continue
		}
		if opts.DryRun {
			m.log.Info("dry run: would turn persistence mode off", "gpu", g.UUID)
			continue
		}
		if err := m.SetPersistenceMode(g.UUID, false); err != nil {
			return rep, errors.Join(err, m.restorePersistence(&rep))
		}
		rep.PersistenceOff = append(rep.PersistenceOff, g.UUID)
	}

	resetErr := r.Reset(ctx, uuids)
	if resetErr == nil && !opts.DryRun {
		m.ClearXIDs(uuids...)
	}
	if err := errors.Join(resetErr, m.restorePersistence(&rep)); err != nil {
		return rep, err
	}
	if opts.DryRun {
		m.log.Info("dry run: would wait for fabric registration and verify health", "gpus", len(uuids), "nvswitch", pre.NVSwitch)
		return rep, nil
	}
	if pre.NVSwitch {
		for _, u := range uuids {
			if err := m.WaitFabricCompleted(ctx, u); err != nil {
				return rep, err
			}
		}
	}
	if err := m.VerifyHealthy(uuids); err != nil {
		return rep, err
	}
	m.log.Info("GPU reset verified healthy", "gpus", len(uuids))
	return rep, nil
}

func (m *Manager) restorePersistence(rep *ResetReport) error {
	var errs []error
	for _, u := range rep.PersistenceOff {
		if err := m.SetPersistenceMode(u, true); err != nil {
			errs = append(errs, fmt.Errorf("devices: %s: restoring persistence mode: %w", u, err))
			continue
		}
		rep.PersistenceRestored = append(rep.PersistenceRestored, u)
	}
	return errors.Join(errs...)
}
