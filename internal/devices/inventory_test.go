package devices

import (
	"fmt"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestSnapshotInventory(t *testing.T) {
	tests := []struct {
		name      string
		arch      arch
		wantName  string
		wantArch  string
		wantLinks int
		wantFab   Fabric
	}{
		{name: "dgxh100", arch: archH100, wantName: "NVIDIA H100 80GB HBM3", wantArch: "Hopper", wantLinks: 18,
			wantFab: Fabric{Known: true, State: FabricCompleted, Status: "SUCCESS"}},
		{name: "dgxa100", arch: archA100, wantName: "Mock NVIDIA A100-SXM4-40GB", wantArch: "Ampere", wantLinks: 12,
			wantFab: Fabric{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.arch)
			f.set(2, func(g *gpuState) {
				g.persistence = nvml.FEATURE_ENABLED
				g.compute = []uint32{4242, 17}
				g.graphics = []uint32{99}
				g.migCurrent = nvml.DEVICE_MIG_ENABLE
				g.remapCorr, g.remapUnc = 3, 1
				g.eccCor, g.eccUnc = 12, 0
				g.recovery = uint32(nvml.GPU_RECOVERY_ACTION_GPU_RESET)
			})
			m, clk := newTestManager(t, f)
			s, err := m.Snapshot()
			if err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			if !s.At.Equal(clk.Now()) || s.DriverVersion != "550.54.15" || !s.NVSwitch {
				t.Errorf("snapshot header = at %v driver %q nvswitch %v", s.At, s.DriverVersion, s.NVSwitch)
			}
			if len(s.GPUs) != 8 {
				t.Fatalf("got %d GPUs, want 8", len(s.GPUs))
			}
			for i, g := range s.GPUs {
				if g.Index != i || g.UUID != f.uuid(i) || g.Name != tc.wantName || g.Architecture != tc.wantArch {
					t.Errorf("GPU %d identity = %d %q %q %q", i, g.Index, g.UUID, g.Name, g.Architecture)
				}
				if want := fmt.Sprintf("0000:%02x:00.0", i); g.PCIBusID != want {
					t.Errorf("GPU %d PCI bus ID = %q, want %q", i, g.PCIBusID, want)
				}
				if g.NVLinksActive != tc.wantLinks || g.NVSwitchLinks != tc.wantLinks {
					t.Errorf("GPU %d links = %d/%d, want %d", i, g.NVLinksActive, g.NVSwitchLinks, tc.wantLinks)
				}
				if g.Fabric != tc.wantFab {
					t.Errorf("GPU %d fabric = %+v, want %+v", i, g.Fabric, tc.wantFab)
				}
				if len(g.ReadErrors) > 0 || g.Lost {
					t.Errorf("GPU %d read errors %v lost %v", i, g.ReadErrors, g.Lost)
				}
			}
			g := s.GPUs[2]
			if g.Persistence != TriTrue || g.MIGCurrent != TriTrue || g.MIGPending != TriTrue {
				t.Errorf("persistence/MIG = %v/%v/%v, want true", g.Persistence, g.MIGCurrent, g.MIGPending)
			}
			if !g.ProcessesKnown || !slices.Equal(g.ComputePIDs, []uint32{17, 4242}) || !slices.Equal(g.GraphicsPIDs, []uint32{99}) {
				t.Errorf("processes = %v %v %v", g.ProcessesKnown, g.ComputePIDs, g.GraphicsPIDs)
			}
			if g.RetiredPagesPending != TriFalse {
				t.Errorf("retired pages pending = %v, want false", g.RetiredPagesPending)
			}
			if want := (RemappedRows{Known: true, Correctable: 3, Uncorrectable: 1}); g.RemappedRows != want {
				t.Errorf("remapped rows = %+v, want %+v", g.RemappedRows, want)
			}
			if want := (ECCErrors{Known: true, VolatileCorrected: 12}); g.ECC != want {
				t.Errorf("ECC = %+v, want %+v", g.ECC, want)
			}
			if g.RecoveryAction != RecoveryActionGPUReset {
				t.Errorf("recovery action = %v, want GPU_RESET", g.RecoveryAction)
			}
			if s.GPUs[0].Persistence != TriFalse || s.GPUs[0].MIGCurrent != TriFalse || s.GPUs[0].RecoveryAction != RecoveryActionNone {
				t.Errorf("GPU 0 = %+v", s.GPUs[0])
			}

			list, err := m.List()
			if err != nil || len(list) != 8 || list[5].UUID != f.uuid(5) || list[5].PCIBusID != "0000:05:00.0" {
				t.Errorf("List = %v, %v", list, err)
			}
		})
	}
}

func TestSnapshotUnknownSignals(t *testing.T) {
	tests := []struct {
		name  string
		mod   func(*gpuState)
		check func(t *testing.T, g GPUInfo)
	}{
		{
			name: "not supported is unknown, not an error",
			mod: func(g *gpuState) {
				g.remapRet, g.eccRet, g.retiredRet = nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
				g.recoveryRet = nvml.ERROR_NOT_SUPPORTED
			},
			check: func(t *testing.T, g GPUInfo) {
				if g.RemappedRows.Known || g.ECC.Known || g.RetiredPagesPending != TriUnknown || g.RecoveryAction != RecoveryActionUnknown {
					t.Errorf("want all unknown, got %+v", g)
				}
				if len(g.ReadErrors) != 0 {
					t.Errorf("read errors = %v, want none", g.ReadErrors)
				}
			},
		},
		{
			name: "other errors are recorded",
			mod:  func(g *gpuState) { g.remapRet = nvml.ERROR_UNKNOWN },
			check: func(t *testing.T, g GPUInfo) {
				if !slices.Equal(g.ReadErrors, []string{"GetRemappedRows: ERROR_UNKNOWN"}) {
					t.Errorf("read errors = %v", g.ReadErrors)
				}
			},
		},
		{
			name: "GPU lost",
			mod:  func(g *gpuState) { g.lostUUID = true },
			check: func(t *testing.T, g GPUInfo) {
				if !g.Lost || g.UUID != "" || g.Index != 4 {
					t.Errorf("lost GPU = %+v", g)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, archH100)
			f.set(4, tc.mod)
			m, _ := newTestManager(t, f)
			s, err := m.Snapshot()
			if err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			tc.check(t, s.GPUs[4])
		})
	}
}

func TestOptionalSymbolsSkipped(t *testing.T) {
	f := newFleet(t, archH100)
	f.srv.LookupSymbolFunc = func(string) error { return fmt.Errorf("not in this driver") }
	for i := range f.srv.Devices {
		d := f.dev(i)
		d.GetRemappedRowsFunc = nil // would panic if called
		d.GetGpuFabricInfoFunc = nil
		d.GetNvLinkRemoteDeviceTypeFunc = nil
	}
	m, _ := newTestManager(t, f)
	s, err := m.Snapshot()
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	g := s.GPUs[0]
	if g.RemappedRows.Known || g.Fabric.Known || g.NVSwitchLinks != 0 || g.NVLinksActive != 18 {
		t.Errorf("GPU 0 = %+v", g)
	}
}
