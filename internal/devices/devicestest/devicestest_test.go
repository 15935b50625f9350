package devicestest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

func manager(t *testing.T, f *Fleet) *devices.Manager {
	t.Helper()
	m, err := f.Manager(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Shutdown(); err != nil {
			t.Error(err)
		}
	})
	return m
}

func TestModels(t *testing.T) {
	tests := []struct {
		name      string
		model     Model
		wantGroup int
		fabric    bool
	}{
		{name: "dgxh100", model: DGXH100, wantGroup: 1, fabric: true},
		{name: "dgxa100", model: DGXA100, wantGroup: 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := New(tc.model)
			m := manager(t, f)
			s, err := m.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if len(s.GPUs) != 8 || !s.NVSwitch {
				t.Fatalf("%d GPUs, NVSwitch %v", len(s.GPUs), s.NVSwitch)
			}
			rep := devices.Evaluate(s)
			if len(rep.Unhealthy()) != 0 || rep.Condition.Reason != devices.ReasonAllHealthy {
				t.Errorf("a new fleet is not healthy: %+v", rep.Condition)
			}
			if s.GPUs[0].Fabric.Known != tc.fabric {
				t.Errorf("fabric known %v, want %v", s.GPUs[0].Fabric.Known, tc.fabric)
			}
			g, err := m.ResetGroup(f.UUIDs(0))
			if err != nil || len(g.UUIDs) != tc.wantGroup {
				t.Errorf("ResetGroup: %d GPUs, %v; want %d", len(g.UUIDs), err, tc.wantGroup)
			}
		})
	}
}

func TestResetRoutes(t *testing.T) {
	tests := []struct {
		name      string
		method    devices.ResetMethod
		busy      bool
		wantCalls []string // with %0 for GPU 0's UUID
		wantErr   string
	}{
		{name: "nvml", method: devices.ResetMethodNVML,
			wantCalls: []string{"drain %0 on", "remove %0", "discover", "reset %0"}},
		{name: "nvml busy", method: devices.ResetMethodNVML, busy: true, wantErr: "ERROR_IN_USE",
			wantCalls: []string{"drain %0 on", "remove %0 refused", "drain %0 off"}},
		{name: "nvidia-smi", method: devices.ResetMethodSMI,
			wantCalls: []string{"nvidia-smi --gpu-reset -i %0", "reset %0"}},
		{name: "nvidia-smi busy", method: devices.ResetMethodSMI, busy: true, wantErr: "In use by another client",
			wantCalls: []string{"nvidia-smi --gpu-reset -i %0 refused"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := New(DGXH100)
			m := manager(t, f)
			f.Set(0, func(g *GPU) {
				g.RetiredPagesPending = true
				g.FabricPollsAfterReset = 2
				if tc.busy {
					g.ComputePIDs = []uint32{7}
				}
			})
			r, err := m.NewResetter(devices.ResetterConfig{Method: tc.method, Runner: f.SMIRunner()})
			if err != nil {
				t.Fatal(err)
			}
			err = r.Reset(context.Background(), f.UUIDs(0))
			var want []string
			for _, c := range tc.wantCalls {
				want = append(want, strings.ReplaceAll(c, "%0", f.UUID(0)))
			}
			if got := f.Calls(); !slices.Equal(got, want) {
				t.Errorf("calls %q, want %q", got, want)
			}
			resets := 1
			if tc.wantErr != "" {
				resets = 0
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("Reset: %v, want %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Reset: %v", err)
			}
			if got := f.Resets()[f.UUID(0)]; got != resets {
				t.Errorf("%d resets, want %d", got, resets)
			}
			if tc.wantErr != "" {
				return
			}
			g := f.GPU(0)
			if g.RetiredPagesPending || g.FabricState != devices.FabricInProgress {
				t.Errorf("after reset: %+v", g)
			}
			for range 2 {
				if _, err := m.Snapshot(); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.WaitFabricCompleted(context.Background(), f.UUID(0)); err != nil {
				t.Errorf("fabric after 2 reads: %v", err)
			}
		})
	}
}

func TestLost(t *testing.T) {
	f := New(DGXA100)
	m := manager(t, f)
	f.Set(3, func(g *GPU) { g.Lost = true })
	err := m.VerifyHealthy(f.UUIDs())
	if err == nil || !errors.Is(err, devices.ErrUnknownGPU) && !errors.Is(err, devices.ErrUnhealthy) {
		t.Errorf("VerifyHealthy with a lost GPU: %v", err)
	}
}

// TestStrictDoubles: the nvidia-smi double refuses while this process's
// NVML session holds the device node, like the real tool; a GPU removed
// from the bus is invisible until DeviceDiscoverGpus.
func TestStrictDoubles(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, f *Fleet, m *devices.Manager)
	}{
		{name: "nvidia-smi refuses while our NVML session is open, resets after Shutdown", run: func(t *testing.T, f *Fleet, m *devices.Manager) {
			u := f.UUID(2)
			_, err := f.RunSMI([]string{"nvidia-smi", "--gpu-reset", "-i", u})
			if err == nil || !strings.Contains(err.Error(), "In use by another client") {
				t.Fatalf("reset with the session open: %v, want In use by another client", err)
			}
			scan, err := devices.FindHolders("", []string{f.DevicePath(2)})
			if err != nil || len(scan.Holders) != 1 {
				t.Fatalf("holders of %s: %+v, %v", f.DevicePath(2), scan, err)
			}
			if err := m.Shutdown(); err != nil {
				t.Fatal(err)
			}
			if f.SessionOpen() {
				t.Fatal("session still open after Shutdown")
			}
			if _, err := f.RunSMI([]string{"nvidia-smi", "--gpu-reset", "-i", u}); err != nil {
				t.Fatalf("reset after Shutdown: %v", err)
			}
			if err := m.Init(); err != nil {
				t.Fatal(err)
			}
			if f.Resets()[u] != 1 {
				t.Errorf("resets = %v", f.Resets())
			}
		}},
		{name: "a removed GPU disappears until rediscovery", run: func(t *testing.T, f *Fleet, m *devices.Manager) {
			u := f.UUID(5)
			r := m.NVMLResetter()
			var seen []string
			r.BeforeRemove = func(uuid string) error {
				seen = append(seen, uuid)
				return errors.New("crash before the removal")
			}
			if err := r.Reset(t.Context(), []string{u}); err == nil {
				t.Fatal("BeforeRemove error did not stop the reset")
			}
			if f.GPU(5).Removed || !slices.Equal(seen, []string{u}) {
				t.Fatalf("removed %v, BeforeRemove saw %v", f.GPU(5).Removed, seen)
			}
			f.Set(5, func(g *GPU) { g.Removed = true }) // a crash after the removal
			if l, _ := m.List(); len(l) != 7 {
				t.Fatalf("List after removal: %d GPUs, want 7", len(l))
			}
			if _, err := m.ResolveByUUID(u); !errors.Is(err, devices.ErrUnknownGPU) {
				t.Fatalf("ResolveByUUID of a removed GPU: %v", err)
			}
			if err := m.Rediscover([]string{u}); err != nil {
				t.Fatal(err)
			}
			if l, _ := m.List(); len(l) != 8 {
				t.Fatalf("List after rediscovery: %d GPUs, want 8", len(l))
			}
			f.Set(5, func(g *GPU) { g.OffBus = true })
			if err := m.Rediscover([]string{u}); !errors.Is(err, devices.ErrUnknownGPU) {
				t.Fatalf("Rediscover of a GPU off the bus: %v, want ErrUnknownGPU", err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := New(DGXH100)
			if _, err := f.DeviceNodes(t.TempDir()); err != nil {
				t.Fatal(err)
			}
			tc.run(t, f, manager(t, f))
		})
	}
}

func TestStableUUIDs(t *testing.T) {
	a, b := New(DGXH100), New(DGXH100)
	a.StableUUIDs()
	b.StableUUIDs()
	for i := 0; i < a.Len(); i++ {
		if a.UUID(i) != b.UUID(i) {
			t.Fatalf("GPU %d: %s and %s across two fleets", i, a.UUID(i), b.UUID(i))
		}
		if a.Index(a.UUID(i)) != i {
			t.Fatalf("GPU %d: Index(%s) = %d", i, a.UUID(i), a.Index(a.UUID(i)))
		}
	}
	m, err := a.Manager(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
}

// TestDriverReload: a session whose driver was replaced answers
// ERROR_LIB_RM_VERSION_MISMATCH to every read until it is closed, as the
// real library does; Reinit opens a new one — refused with ErrNoNVML while
// the driver is not loaded, working once it is — and the device nodes are
// held again.
func TestDriverReload(t *testing.T) {
	f := New(DGXH100)
	if _, err := f.DeviceNodes(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	m := manager(t, f)
	f.DriverReload(nvml.ERROR_LIB_RM_VERSION_MISMATCH)
	_, err := m.Snapshot()
	if !errors.Is(err, devices.ErrDriverGone) || !devices.DriverGone(err) || !strings.Contains(err.Error(), "ERROR_LIB_RM_VERSION_MISMATCH") {
		t.Fatalf("Snapshot on the old session: %v, want ErrDriverGone naming ERROR_LIB_RM_VERSION_MISMATCH", err)
	}
	if _, err := m.Snapshot(); !errors.Is(err, devices.ErrDriverGone) {
		t.Fatalf("the old session recovered by itself: %v", err)
	}
	f.FailInit(nvml.ERROR_DRIVER_NOT_LOADED) // the new driver is not loaded yet
	if err := m.Reinit(); !errors.Is(err, devices.ErrNoNVML) {
		t.Fatalf("Reinit before the driver is back: %v, want ErrNoNVML", err)
	}
	if f.SessionOpen() {
		t.Fatal("a session is open although Init failed")
	}
	if _, err := m.Snapshot(); !devices.DriverGone(err) {
		t.Fatalf("Snapshot without a session: %v, want DriverGone", err)
	}
	f.FailInit(nvml.SUCCESS)
	if err := m.Reinit(); err != nil {
		t.Fatalf("Reinit with the driver back: %v", err)
	}
	s, err := m.Snapshot()
	if err != nil || len(s.GPUs) != f.Len() {
		t.Fatalf("Snapshot after Reinit: %d GPUs, %v; want %d", len(s.GPUs), err, f.Len())
	}
	if !f.SessionOpen() {
		t.Error("no session open after Reinit")
	}
}
