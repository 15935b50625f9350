package devices_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
)

// TestNVSwitchFromDeviceList: with every NVLink down and the fabric
// NOT_STARTED (before Fabric Manager ran), NVML alone shows no NVSwitch:
// a single SXM GPU is such a host, and it is healthy. With the
// nvidia-nvswitch driver listing a switch, the host is an NVSwitch system
// whatever the links say, and a GPU whose fabric has not registered is not
// healthy (FabricNotCompleted): the links hid the switches before.
func TestNVSwitchFromDeviceList(t *testing.T) {
	withSwitch := t.TempDir()
	if err := os.WriteFile(filepath.Join(withSwitch, "0000:05:00.0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, list string
		nvswitch   bool
	}{
		{name: "no nvswitch module: single SXM, healthy", list: "", nvswitch: false},
		{name: "empty device list: no switch", list: t.TempDir(), nvswitch: false},
		{name: "a switch listed: NVSwitch system, fabric not registered", list: withSwitch, nvswitch: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := devicestest.New(devicestest.DGXH100)
			f.SetAll(func(g *devicestest.GPU) {
				g.NVLinksDown = true
				g.FabricState = devices.FabricNotStarted
			})
			m, err := f.Manager(devicestest.Options{NVSwitchDevices: tc.list})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Shutdown()
			s, err := m.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if s.NVSwitch != tc.nvswitch {
				t.Fatalf("NVSwitch = %v, want %v", s.NVSwitch, tc.nvswitch)
			}
			g := devices.Evaluate(s).GPUs[0]
			notReg := slices.Contains(g.Reasons, "FabricNotCompleted")
			if g.Healthy == tc.nvswitch || notReg != tc.nvswitch {
				t.Errorf("GPU 0 healthy=%v reasons=%q; want healthy=%v", g.Healthy, g.Reasons, !tc.nvswitch)
			}
		})
	}
}
