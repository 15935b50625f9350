package devices

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// gpuState is the mutable truth behind one mock GPU. Every mock func the
// package calls reads it under fleet.mu; tests change it with fleet.set.
type gpuState struct {
	persistence    nvml.EnableState
	persistenceRet nvml.Return
	compute        []uint32
	graphics       []uint32
	procRet        nvml.Return
	graphicsRet    nvml.Return // the graphics list's alone, when procRet is SUCCESS
	migCurrent     int
	retiredPending nvml.EnableState
	retiredRet     nvml.Return
	remapPending   bool
	remapFailure   bool
	remapCorr      int
	remapUnc       int
	remapRet       nvml.Return
	eccUnc         uint64
	eccCor         uint64
	eccRet         nvml.Return
	recovery       uint32
	recoveryRet    nvml.Return // per-field NvmlReturn
	fabricState    uint8
	fabricStatus   nvml.Return
	fabricRet      nvml.Return
	fabricCalls    int
	links          int
	linkType       nvml.IntNvLinkDeviceType
	drained        bool
	removeRet      nvml.Return
	lostUUID       bool // GetUUID returns ERROR_GPU_IS_LOST
	supportedEvts  uint64
	registeredEvts uint64
}

// fleet wraps a go-nvml mock server (dgxh100/dgxa100) and sets every XxxFunc
// the package uses: an unset one panics.
type fleet struct {
	t    *testing.T
	srv  *server.Server
	mu   sync.Mutex
	gpus []*gpuState
	// calls records mutating calls in order: "drain GPU-…=1", "query GPU-…",
	// "remove_v2 GPU-…", "discover", "persistence GPU-…=0".
	calls     []string
	discovers int
}

type arch string

const (
	archH100 arch = "dgxh100"
	archA100 arch = "dgxa100"
)

func newFleet(t *testing.T, a arch) *fleet {
	t.Helper()
	var srv *server.Server
	switch a {
	case archH100:
		srv = dgxh100.New()
	case archA100:
		srv = dgxa100.New()
	default:
		t.Fatalf("unknown arch %q", a)
	}
	f := &fleet{t: t, srv: srv}
	for i := range srv.Devices {
		st := &gpuState{
			persistence:    nvml.FEATURE_DISABLED,
			retiredPending: nvml.FEATURE_DISABLED,
			recovery:       uint32(nvml.GPU_RECOVERY_ACTION_NONE),
			linkType:       nvml.NVLINK_DEVICE_TYPE_SWITCH,
			supportedEvts:  uint64(nvml.EventTypeAll),
			removeRet:      nvml.SUCCESS,
		}
		switch a {
		case archH100:
			st.links = 18
			st.fabricState = nvml.GPU_FABRIC_STATE_COMPLETED
		case archA100:
			st.links = 12
			st.fabricRet = nvml.ERROR_NOT_SUPPORTED // pre-Hopper: no fabric info
		}
		f.gpus = append(f.gpus, st)
		f.wireDevice(i)
	}
	f.wireServer()
	return f
}

func (f *fleet) dev(i int) *server.Device { return f.srv.Devices[i].(*server.Device) }
func (f *fleet) uuid(i int) string        { return f.dev(i).UUID }

func (f *fleet) uuids(idx ...int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, f.uuid(i))
	}
	return out
}

func (f *fleet) allUUIDs() []string {
	var out []string
	for i := range f.srv.Devices {
		out = append(out, f.uuid(i))
	}
	return out
}

// set mutates GPU i's state under the lock.
func (f *fleet) set(i int, fn func(*gpuState)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.gpus[i])
}

func (f *fleet) each(fn func(*gpuState)) {
	for i := range f.gpus {
		f.set(i, fn)
	}
}

func (f *fleet) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fleet) recorded() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fleet) byBus(p *nvml.PciInfo) (int, *gpuState) {
	bus := busID(*p)
	for i := range f.srv.Devices {
		if f.dev(i).PciBusID == bus {
			return i, f.gpus[i]
		}
	}
	f.t.Errorf("no GPU at PCI %q", bus)
	return -1, &gpuState{}
}

func (f *fleet) wireServer() {
	s := f.srv
	s.DeviceModifyDrainStateFunc = func(p *nvml.PciInfo, st nvml.EnableState) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		i, g := f.byBus(p)
		f.record("drain %s=%d", f.uuid(i), st)
		g.drained = st == nvml.FEATURE_ENABLED
		return nvml.SUCCESS
	}
	s.DeviceQueryDrainStateFunc = func(p *nvml.PciInfo) (nvml.EnableState, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		i, g := f.byBus(p)
		f.record("query %s", f.uuid(i))
		if g.drained {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	s.DeviceRemoveGpu_v2Func = func(p *nvml.PciInfo, ds nvml.DetachGpuState, ls nvml.PcieLinkState) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		i, g := f.byBus(p)
		f.record("remove_v2 %s detach=%d link=%d", f.uuid(i), ds, ls)
		return g.removeRet
	}
	s.DeviceRemoveGpuFunc = func(p *nvml.PciInfo) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		i, g := f.byBus(p)
		f.record("remove %s", f.uuid(i))
		return g.removeRet
	}
	s.DeviceDiscoverGpusFunc = func() (nvml.PciInfo, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.record("discover")
		f.discovers++
		// A rediscovered GPU comes back undrained.
		for _, g := range f.gpus {
			g.drained = false
		}
		return nvml.PciInfo{}, nvml.SUCCESS
	}
}

func (f *fleet) wireDevice(i int) {
	d := f.dev(i)
	st := func() *gpuState { return f.gpus[i] }
	lock := func() func() { f.mu.Lock(); return f.mu.Unlock }

	d.GetUUIDFunc = func() (string, nvml.Return) {
		defer lock()()
		if st().lostUUID {
			return "", nvml.ERROR_GPU_IS_LOST
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
		defer lock()()
		return st().persistence, st().persistenceRet
	}
	d.SetPersistenceModeFunc = func(m nvml.EnableState) nvml.Return {
		defer lock()()
		f.record("persistence %s=%d", d.UUID, m)
		st().persistence = m
		return nvml.SUCCESS
	}
	procs := func(pids []uint32) ([]nvml.ProcessInfo, nvml.Return) {
		defer lock()()
		if st().procRet != nvml.SUCCESS {
			return nil, st().procRet
		}
		var out []nvml.ProcessInfo
		for _, p := range pids {
			out = append(out, nvml.ProcessInfo{Pid: p, UsedGpuMemory: 1 << 30})
		}
		return out, nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		f.mu.Lock()
		p := st().compute
		f.mu.Unlock()
		return procs(p)
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		f.mu.Lock()
		p, ret := st().graphics, st().graphicsRet
		f.mu.Unlock()
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return procs(p)
	}
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		defer lock()()
		return st().migCurrent, st().migCurrent, nvml.SUCCESS
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		defer lock()()
		return st().retiredPending, st().retiredRet
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		defer lock()()
		s := st()
		return s.remapCorr, s.remapUnc, s.remapPending, s.remapFailure, s.remapRet
	}
	d.GetTotalEccErrorsFunc = func(et nvml.MemoryErrorType, ct nvml.EccCounterType) (uint64, nvml.Return) {
		defer lock()()
		if ct != nvml.VOLATILE_ECC {
			f.t.Errorf("GetTotalEccErrors counter type %d, want VOLATILE", ct)
		}
		if et == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
			return st().eccUnc, st().eccRet
		}
		return st().eccCor, st().eccRet
	}
	d.GetFieldValuesFunc = func(vals []nvml.FieldValue) nvml.Return {
		defer lock()()
		for k := range vals {
			if vals[k].FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
				vals[k].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
				continue
			}
			vals[k].NvmlReturn = uint32(st().recoveryRet)
			vals[k].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
			binary.NativeEndian.PutUint32(vals[k].Value[:], st().recovery)
		}
		return nvml.SUCCESS
	}
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		defer lock()()
		s := st()
		s.fabricCalls++
		return nvml.GpuFabricInfo{State: s.fabricState, Status: uint32(s.fabricStatus)}, s.fabricRet
	}
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		defer lock()()
		if st().links == 0 {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		if link >= st().links {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		defer lock()()
		return st().linkType, nvml.SUCCESS
	}
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		defer lock()()
		return st().supportedEvts, nvml.SUCCESS
	}
	d.RegisterEventsFunc = func(mask uint64, _ nvml.EventSet) nvml.Return {
		defer lock()()
		st().registeredEvts = mask
		return nvml.SUCCESS
	}
}

// fakeEvents is a mock EventSet fed by a channel.
type fakeEvents struct {
	ch    chan nvml.EventData
	mu    sync.Mutex
	freed int
	waits int
}

func (f *fleet) withEvents() *fakeEvents {
	fe := &fakeEvents{ch: make(chan nvml.EventData, 16)}
	f.srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				fe.mu.Lock()
				fe.waits++
				fe.mu.Unlock()
				// Real time here is the fake driver's, not the logic's.
				select {
				case e := <-fe.ch:
					return e, nvml.SUCCESS
				case <-time.After(min(time.Duration(ms)*time.Millisecond, 20*time.Millisecond)):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return {
				fe.mu.Lock()
				defer fe.mu.Unlock()
				fe.freed++
				return nvml.SUCCESS
			},
		}, nvml.SUCCESS
	}
	return fe
}

func (fe *fakeEvents) freedCount() int {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	return fe.freed
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// newTestManager builds and initializes a Manager over f with a fake clock.
func newTestManager(t *testing.T, f *fleet, mods ...func(*Config)) (*Manager, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	cfg := Config{NVML: f.srv, Logger: testLogger(t), Clock: clock.Clock(clk)}
	for _, mod := range mods {
		mod(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := m.Init(); err != nil {
		t.Fatalf("Init: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return m, clk
}

func containsAll(t *testing.T, what, s string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(s, p) {
			t.Errorf("%s %q does not contain %q", what, s, p)
		}
	}
}
