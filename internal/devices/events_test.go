package devices

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

const testTimeout = 5 * time.Second

func recv(t *testing.T, ch <-chan Event) (Event, bool) {
	t.Helper()
	select {
	case ev, ok := <-ch:
		return ev, ok
	case <-time.After(testTimeout):
		t.Fatal("no event within timeout")
		return Event{}, false
	}
}

func TestWatchEvents(t *testing.T) {
	tests := []struct {
		name     string
		send     []func(f *fleet) nvml.EventData
		want     []Event // UUID as index placeholder via wantGPU
		wantGPU  []int
		latched  map[int][]uint64
		ignoreCf []uint64 // Config.IgnoredXIDs (nil: default)
	}{
		{
			name: "critical XID delivered, XID 13 ignored",
			send: []func(f *fleet) nvml.EventData{
				xidOn(2, 13),
				xidOn(3, 79),
			},
			want:    []Event{{Kind: EventXID, XID: 79, XIDClass: XIDNeedsReboot, Data: 79}},
			wantGPU: []int{3},
			latched: map[int][]uint64{3: {79}},
		},
		{
			name: "double-bit ECC and recovery action",
			send: []func(f *fleet) nvml.EventData{
				func(f *fleet) nvml.EventData {
					return nvml.EventData{Device: f.dev(1), EventType: nvml.EventTypeDoubleBitEccError}
				},
				func(f *fleet) nvml.EventData {
					return nvml.EventData{Device: f.dev(6), EventType: nvml.EventTypeGpuRecoveryAction, EventData: uint64(nvml.GPU_RECOVERY_ACTION_GPU_RESET)}
				},
			},
			want: []Event{
				{Kind: EventDoubleBitECC},
				{Kind: EventRecoveryAction, RecoveryAction: RecoveryActionGPUReset, Data: 1},
			},
			wantGPU: []int{1, 6},
		},
		{
			name: "custom ignore list",
			send: []func(f *fleet) nvml.EventData{
				xidOn(0, 79),
				xidOn(0, 13),
			},
			want:     []Event{{Kind: EventXID, XID: 13, XIDClass: XIDNeedsReset, Data: 13}},
			wantGPU:  []int{0},
			latched:  map[int][]uint64{0: {13}},
			ignoreCf: []uint64{79},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, archH100)
			fe := f.withEvents()
			m, clk := newTestManager(t, f, func(c *Config) { c.IgnoredXIDs = tc.ignoreCf })
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			ch, err := m.WatchEvents(ctx, nil)
			if err != nil {
				t.Fatalf("WatchEvents: %v", err)
			}
			wantMask := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeGpuRecoveryAction)
			for i := range f.gpus {
				f.mu.Lock()
				got := f.gpus[i].registeredEvts
				f.mu.Unlock()
				if got != wantMask {
					t.Errorf("GPU %d registered mask %#x, want %#x", i, got, wantMask)
				}
			}
			for _, s := range tc.send {
				fe.ch <- s(f)
			}
			for i, want := range tc.want {
				ev, ok := recv(t, ch)
				if !ok {
					t.Fatal("channel closed early")
				}
				want.UUID = f.uuid(tc.wantGPU[i])
				want.At = clk.Now()
				if ev != want {
					t.Errorf("event %d = %+v, want %+v", i, ev, want)
				}
			}
			s, err := m.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			for i, g := range s.GPUs {
				if !slices.Equal(g.CriticalXIDs, tc.latched[i]) {
					t.Errorf("GPU %d latched XIDs = %v, want %v", i, g.CriticalXIDs, tc.latched[i])
				}
			}
			cancel()
			if _, ok := recv(t, ch); ok {
				t.Error("channel not closed after cancel")
			}
			if fe.freedCount() != 1 {
				t.Errorf("EventSet freed %d times, want 1", fe.freedCount())
			}
		})
	}
}

func xidOn(gpu int, xid uint64) func(f *fleet) nvml.EventData {
	return func(f *fleet) nvml.EventData {
		return nvml.EventData{Device: f.dev(gpu), EventType: nvml.EventTypeXidCriticalError, EventData: xid,
			GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	}
}

func TestWatchEventsUnnamedGPULatchesAll(t *testing.T) {
	f := newFleet(t, archH100)
	fe := f.withEvents()
	m, _ := newTestManager(t, f)
	ch, err := m.WatchEvents(t.Context(), f.uuids(1, 2))
	if err != nil {
		t.Fatal(err)
	}
	fe.ch <- nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 48}
	ev, _ := recv(t, ch)
	if ev.UUID != "" || ev.XID != 48 {
		t.Errorf("event = %+v", ev)
	}
	s, _ := m.Snapshot()
	for i, g := range s.GPUs {
		want := []uint64(nil)
		if i == 1 || i == 2 {
			want = []uint64{48}
		}
		if !slices.Equal(g.CriticalXIDs, want) {
			t.Errorf("GPU %d latched %v, want %v", i, g.CriticalXIDs, want)
		}
	}
	m.ClearXIDs(f.uuid(1))
	if got := m.latchedXIDs(f.uuid(1)); got != nil {
		t.Errorf("after ClearXIDs latched = %v", got)
	}
}

func TestWatchEventsStoppedByShutdown(t *testing.T) {
	f := newFleet(t, archA100)
	fe := f.withEvents()
	m, _ := newTestManager(t, f)
	ch, err := m.WatchEvents(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// An event nobody reads must not keep Shutdown waiting.
	fe.ch <- xidOn(0, 79)(f)
	if err := m.Shutdown(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, ok := recv(t, ch); ok {
		t.Error("channel not closed by Shutdown")
	}
	if fe.freedCount() != 1 {
		t.Errorf("EventSet freed %d times, want 1", fe.freedCount())
	}
	if _, err := m.WatchEvents(t.Context(), nil); err == nil {
		t.Error("WatchEvents after Shutdown: want error")
	}
}

func TestWatchEventsRegistration(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*gpuState)
		wantErr bool
	}{
		{name: "XID events unsupported on every GPU", mod: func(g *gpuState) { g.supportedEvts = uint64(nvml.EventTypeDoubleBitEccError) }, wantErr: true},
		{name: "old driver without recovery action events", mod: func(g *gpuState) {
			g.supportedEvts = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, archH100)
			fe := f.withEvents()
			f.each(tc.mod)
			m, _ := newTestManager(t, f)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			ch, err := m.WatchEvents(ctx, nil)
			if tc.wantErr {
				if err == nil {
					t.Fatal("want error")
				}
				if fe.freedCount() != 1 {
					t.Errorf("EventSet freed %d times, want 1", fe.freedCount())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			got := f.gpus[0].registeredEvts
			f.mu.Unlock()
			if got != uint64(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError) {
				t.Errorf("registered %#x", got)
			}
			cancel()
			recv(t, ch)
		})
	}
}
