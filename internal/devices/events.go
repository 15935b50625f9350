package devices

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// EventKind classifies a watcher Event. Explicit values (STYLE 5).
type EventKind int

const (
	EventXID            EventKind = 1 // EventTypeXidCriticalError, XID not ignored
	EventDoubleBitECC   EventKind = 2 // EventTypeDoubleBitEccError
	EventRecoveryAction EventKind = 3 // EventTypeGpuRecoveryAction
)

func (k EventKind) String() string {
	switch k {
	case EventXID:
		return "XID"
	case EventDoubleBitECC:
		return "DoubleBitECC"
	case EventRecoveryAction:
		return "RecoveryAction"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one NVML event delivered by WatchEvents.
type Event struct {
	At   time.Time
	Kind EventKind
	// UUID of the GPU; empty when NVML could not name it, in which case the
	// XID is latched on every watched GPU (fail closed).
	UUID string
	// XID and its class (ClassifyXID) for EventXID.
	XID      uint64
	XIDClass XIDClass
	// RecoveryAction for EventRecoveryAction.
	RecoveryAction RecoveryAction
	// Data is the raw EventData.
	Data uint64
}

// watchMask is what WatchEvents asks for, intersected per GPU with
// GetSupportedEventTypes.
const watchMask = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeGpuRecoveryAction)

// WatchEvents creates an EventSet, registers the given GPUs (all GPUs when
// uuids is empty) for critical XIDs, double-bit ECC errors and recovery
// actions, and delivers events on the returned channel until ctx is done or
// Shutdown runs; the channel is then closed and the set freed.
//
// Ignored (application) XIDs are dropped. Critical XIDs are also latched on
// the Manager (see GPUInfo.CriticalXIDs) until ClearXIDs. A GPU that cannot
// be registered is logged and skipped; an error is returned when none could
// be. Delivery blocks: a slow reader delays the next Wait, it loses nothing.
//
// Registrations die with the device handles when a GPU is removed and
// rediscovered: after a reset, cancel the watcher and call WatchEvents again.
func (m *Manager) WatchEvents(ctx context.Context, uuids []string) (<-chan Event, error) {
	lib, release, err := m.acquire()
	if err != nil {
		return nil, err
	}
	defer release()

	if len(uuids) == 0 {
		devs, err := m.enumerate(lib)
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			if d.info.UUID != "" {
				uuids = append(uuids, d.info.UUID)
			}
		}
	}
	set, ret := lib.EventSetCreate()
	if err := nvmlErr("", "EventSetCreate", ret); err != nil {
		return nil, err
	}
	var watched []string
	var errs []error
	for _, uuid := range uuids {
		if err := registerGPU(lib, set, uuid); err != nil {
			m.log.Warn("GPU not watched for XIDs", "gpu", uuid, "err", err)
			errs = append(errs, err)
			continue
		}
		watched = append(watched, uuid)
	}
	if len(watched) == 0 {
		if ret := set.Free(); ret != nvml.SUCCESS {
			m.log.Warn("EventSet.Free failed", "err", nvmlErr("", "EventSetFree", ret))
		}
		return nil, fmt.Errorf("devices: no GPU could be watched: %w", errors.Join(errs...))
	}

	ch := make(chan Event)
	m.watchers.Add(1) // under the read lock: happens before Shutdown's Wait
	go m.watch(ctx, set, watched, m.stop, ch)
	m.log.Info("watching GPU events", "gpus", len(watched))
	return ch, nil
}

func registerGPU(lib nvml.Interface, set nvml.EventSet, uuid string) error {
	dev, err := deviceByUUID(lib, uuid)
	if err != nil {
		return err
	}
	supported, ret := dev.GetSupportedEventTypes()
	if err := nvmlErr(uuid, "GetSupportedEventTypes", ret); err != nil {
		return err
	}
	mask := watchMask & supported
	if mask&uint64(nvml.EventTypeXidCriticalError) == 0 {
		return fmt.Errorf("devices: %s: XID events not supported (supported mask %#x)", uuid, supported)
	}
	return nvmlErr(uuid, "RegisterEvents", dev.RegisterEvents(mask, set))
}

func (m *Manager) watch(ctx context.Context, set nvml.EventSet, watched []string, stop <-chan struct{}, ch chan<- Event) {
	defer m.watchers.Done()
	defer close(ch)
	defer func() {
		// Shutdown waits for this goroutine before unloading NVML, so the
		// library is still loaded here even when initialized is false.
		m.mu.RLock()
		ret := set.Free()
		m.mu.RUnlock()
		if ret != nvml.SUCCESS {
			m.log.Warn("EventSet.Free failed", "err", nvmlErr("", "EventSetFree", ret))
		}
	}()
	ms := uint32(min(m.eventWait.Milliseconds(), int64(^uint32(0))))
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		default:
		}
		m.mu.RLock()
		data, ret := set.Wait(ms)
		uuid := ""
		if ret == nvml.SUCCESS && data.Device != nil {
			if u, r := data.Device.GetUUID(); r == nvml.SUCCESS {
				uuid = u
			}
		}
		m.mu.RUnlock()

		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		default:
			if m.limit.allow("EventSet.Wait") {
				m.log.Warn("EventSet.Wait failed; retrying", "err", nvmlErr("", "EventSetWait", ret))
			}
			// Back off one EventWait on the injected clock; never spin.
			t := m.clk.NewTimer(m.eventWait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-stop:
				t.Stop()
				return
			case <-t.C():
			}
			continue
		}

		ev, ok := m.classify(data, uuid, watched)
		if !ok {
			continue
		}
		select {
		case ch <- ev:
		case <-ctx.Done():
			return
		case <-stop:
			return
		}
	}
}

// classify turns EventData into an Event, latching critical XIDs.
func (m *Manager) classify(data nvml.EventData, uuid string, watched []string) (Event, bool) {
	ev := Event{At: m.clk.Now(), UUID: uuid, Data: data.EventData}
	switch data.EventType {
	case uint64(nvml.EventTypeXidCriticalError):
		class := ClassifyXID(data.EventData, m.ignoredCfg)
		if class == XIDIgnorable {
			m.log.Debug("ignoring application XID", "gpu", uuid, "xid", data.EventData)
			return Event{}, false
		}
		ev.Kind, ev.XID, ev.XIDClass = EventXID, data.EventData, class
		if class.Unhealthy() {
			targets := []string{uuid}
			if uuid == "" {
				targets = watched
			}
			for _, u := range targets {
				m.latchXID(u, data.EventData)
			}
		}
		if m.limit.allow(fmt.Sprintf("xid/%s/%d", uuid, data.EventData)) {
			m.log.Warn("XID", "gpu", uuid, "xid", data.EventData, "needs", class.String())
		}
	case uint64(nvml.EventTypeDoubleBitEccError):
		ev.Kind = EventDoubleBitECC
		m.log.Warn("double-bit ECC error", "gpu", uuid)
	case uint64(nvml.EventTypeGpuRecoveryAction):
		ev.Kind = EventRecoveryAction
		ev.RecoveryAction = RecoveryAction(int32(data.EventData))
		m.log.Warn("GPU recovery action", "gpu", uuid, "action", ev.RecoveryAction.String())
	default:
		return Event{}, false
	}
	return ev, true
}

func (m *Manager) latchXID(uuid string, xid uint64) {
	m.xmu.Lock()
	defer m.xmu.Unlock()
	if !slices.Contains(m.xids[uuid], xid) {
		m.xids[uuid] = append(m.xids[uuid], xid)
	}
}

func (m *Manager) latchedXIDs(uuid string) []uint64 {
	m.xmu.Lock()
	defer m.xmu.Unlock()
	return slices.Clone(m.xids[uuid])
}

// LatchXID records an XID seen outside the watcher (the kernel log read at
// start, the health state kept across restarts) exactly as the watcher
// would: ignorable and informational ones are not latched. It returns the
// class.
func (m *Manager) LatchXID(uuid string, xid uint64) XIDClass {
	class := ClassifyXID(xid, m.ignoredCfg)
	if class.Unhealthy() && uuid != "" {
		m.latchXID(uuid, xid)
	}
	return class
}

// ClearXIDs forgets latched XIDs for the given GPUs (after a successful reset).
func (m *Manager) ClearXIDs(uuids ...string) {
	m.xmu.Lock()
	defer m.xmu.Unlock()
	for _, u := range uuids {
		delete(m.xids, u)
	}
}
