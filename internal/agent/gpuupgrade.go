package agent

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
)

// DriverUpgradeLabel is the GPU Operator's driver upgrade state on the
// Node (k8s-operator-libs' upgrade state machine, driver name "gpu"):
// upgrade-required, cordon-required, wait-for-jobs-required,
// pod-deletion-required, drain-required, pod-restart-required,
// validation-required, uncordon-required, upgrade-done, upgrade-failed.
const DriverUpgradeLabel = "nvidia.com/gpu-driver-upgrade-state"

// DriverUpgradeReleaseStates are the upgrade states in which the agent
// lets go of NVML: in pod-restart-required the operator deletes the driver
// pod and the new one's k8s-driver-manager unloads nvidia.ko, which it
// cannot while any process holds /dev/nvidia* — this agent's NVML session
// included. Once the state moves on (validation-required: the new driver
// runs) the agent opens a new session on the new driver.
var DriverUpgradeReleaseStates = []string{"pod-restart-required"}

// ReasonDriverUpgrade is GPUHealthy's reason (Unknown) while the GPU
// Operator replaces the driver.
const ReasonDriverUpgrade = "DriverUpgrade"

// Reasons the agent's hold on the GPUs is paused (gpuStack.hold).
const (
	holdGPUReset      = "gpu-reset"
	holdDriverUpgrade = "driver-upgrade"
)

// hold pauses the agent's hold on the GPUs for reason (the monitor, and
// NVML too when release): several reasons may overlap — a gpu-reset and
// the operator's driver upgrade — and the hold comes back only when the
// last one ends (unhold). A gpu-reset is refused while the driver is being
// replaced: it would reset GPUs under a driver that is going away.
func (g *gpuStack) hold(ctx context.Context, reason string, release bool) error {
	g.holdMu.Lock()
	defer g.holdMu.Unlock()
	if reason == holdGPUReset {
		if err := g.blockedLocked(); err != nil {
			return err
		}
	}
	if g.holds == nil {
		g.holds = map[string]bool{}
	}
	g.holds[reason] = g.holds[reason] || release
	return g.session().Pause(ctx, release)
}

// blocked says why no gpu-reset may start now (nil: it may).
func (g *gpuStack) blocked() error {
	g.holdMu.Lock()
	defer g.holdMu.Unlock()
	return g.blockedLocked()
}

func (g *gpuStack) blockedLocked() error {
	if g.upgrading != "" {
		return fmt.Errorf("the GPU Operator is replacing the NVIDIA driver on this node (%s=%s): retry the gpu-reset once the upgrade has moved on", DriverUpgradeLabel, g.upgrading)
	}
	return nil
}

// unhold ends reason's hold. When none is left the session resumes; with
// lenient (the driver upgrade) a new driver that does not answer yet is
// no error — the monitor then opens the session at its next evaluation.
func (g *gpuStack) unhold(ctx context.Context, reason string, lenient bool, log *slog.Logger) error {
	g.holdMu.Lock()
	defer g.holdMu.Unlock()
	delete(g.holds, reason)
	if len(g.holds) > 0 {
		if !slices.Contains(slices.Collect(maps.Values(g.holds)), true) {
			return g.mgr.Init() // the others pause the monitor only
		}
		return nil
	}
	if !lenient {
		return g.session().Resume(ctx)
	}
	if err := g.mgr.Init(); err != nil {
		log.Warn("NVML does not answer yet after the driver upgrade; the GPU monitor retries at each evaluation", "err", err)
	}
	if m := g.monitor.Load(); m != nil {
		m.Resume()
	}
	return nil
}

// followDriverUpgrades watches this Node's DriverUpgradeLabel until ctx
// ends, releasing NVML in DriverUpgradeReleaseStates and taking it back
// after. An agent started during the upgrade releases at once (the first
// list). The health monitor is paused meanwhile and GPUHealthy is Unknown,
// reason DriverUpgrade, until the first reading after it.
// WatchNodeLabel calls notify one call at a time (apiclient).
func (g *gpuStack) followDriverUpgrades(ctx context.Context, api labelWatcher, log *slog.Logger) {
	err := api.WatchNodeLabel(ctx, DriverUpgradeLabel, func(state string) {
		release := slices.Contains(DriverUpgradeReleaseStates, state)
		g.holdMu.Lock()
		was := g.upgrading
		if release {
			g.upgrading = state
		} else {
			g.upgrading = ""
		}
		g.holdMu.Unlock()
		switch {
		case release && was == "":
			log.Info("the GPU Operator is replacing the NVIDIA driver: releasing NVML so that the module can unload", "label", DriverUpgradeLabel, "state", state)
			if err := g.hold(ctx, holdDriverUpgrade, true); err != nil {
				log.Error("releasing NVML for the driver upgrade failed", "err", err)
			}
			if m := g.monitor.Load(); m != nil {
				m.Unknown(ctx, ReasonDriverUpgrade, fmt.Sprintf("the GPU Operator is replacing the NVIDIA driver (%s=%s): the GPUs are read again once it runs", DriverUpgradeLabel, state))
			}
		case !release && was != "":
			log.Info("the GPU Operator's driver upgrade moved on: opening NVML on the new driver", "label", DriverUpgradeLabel, "state", state)
			if err := g.unhold(ctx, holdDriverUpgrade, true, log); err != nil {
				log.Error("taking NVML back after the driver upgrade failed", "err", err)
			}
		}
	})
	if err != nil {
		log.Error("not following the GPU Operator's driver upgrades", "err", err)
	}
}

// labelWatcher is what followDriverUpgrades needs of the API client.
type labelWatcher interface {
	WatchNodeLabel(ctx context.Context, key string, notify func(value string)) error
}
