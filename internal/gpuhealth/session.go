package gpuhealth

import (
	"context"
	"errors"
	"fmt"
)

// NVMLSession is the process's NVML session; *devices.Manager implements
// it (Shutdown closes every device node NVML opened; Init opens them again).
type NVMLSession interface {
	Init() error
	Shutdown() error
}

// Session is the agent's whole hold on the GPUs — the health monitor and
// the NVML session under it — as the gpu-reset driver pauses it
// (drivers.GPUSession). nvidia-smi refuses a reset while any process holds
// the GPU's device node, this agent's NVML session included.
type Session struct {
	Monitor *Monitor    // nil: no monitor running
	NVML    NVMLSession // required
}

// Pause pauses the monitor (watcher stopped, event set freed, no reads)
// and, when release is true, shuts NVML down in this process. Idempotent.
func (s Session) Pause(ctx context.Context, release bool) error {
	if s.NVML == nil {
		return errors.New("gpuhealth: Session without NVML")
	}
	if s.Monitor != nil {
		if err := s.Monitor.Pause(ctx); err != nil {
			return err
		}
	}
	if release {
		if err := s.NVML.Shutdown(); err != nil {
			return fmt.Errorf("gpuhealth: releasing the NVML session: %w", err)
		}
	}
	return nil
}

// Resume initializes NVML again (a no-op when it is initialized) and
// resumes the monitor. Idempotent.
func (s Session) Resume(context.Context) error {
	if s.NVML == nil {
		return errors.New("gpuhealth: Session without NVML")
	}
	if err := s.NVML.Init(); err != nil {
		return fmt.Errorf("gpuhealth: re-initializing NVML after the reset: %w", err)
	}
	if s.Monitor != nil {
		s.Monitor.Resume()
	}
	return nil
}
