package devices

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
)

// TestNoNVML runs the real go-nvml against this host. On a host without
// libnvidia-ml.so.1 Init must report ErrNoNVML cleanly, never panic.
func TestNoNVML(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{name: "default library", cfg: Config{}},
		{name: "explicit nvml.New", cfg: Config{NVML: nvml.New()}},
		{name: "missing library path", cfg: Config{LibraryPath: filepath.Join(t.TempDir(), "libnvidia-ml.so.1")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Logger = testLogger(t)
			m, err := New(tc.cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			err = m.Init()
			if err == nil {
				_ = m.Shutdown()
				t.Skip("libnvidia-ml is present on this host")
			}
			if !errors.Is(err, ErrNoNVML) {
				t.Fatalf("Init error = %v, want ErrNoNVML", err)
			}
			if !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
				t.Errorf("Init error = %v, want it to match nvml.ERROR_LIBRARY_NOT_FOUND", err)
			}
			want := "devices: no NVML (Init: ERROR_LIBRARY_NOT_FOUND)"
			if tc.cfg.LibraryPath != "" {
				want = "devices: no NVML: loading " + tc.cfg.LibraryPath + " (Init: ERROR_LIBRARY_NOT_FOUND)"
			}
			if got := err.Error(); got != want {
				t.Errorf("Init error text = %q, want %q", got, want)
			}
			if _, err := m.Snapshot(); !errors.Is(err, ErrNotInitialized) {
				t.Errorf("Snapshot after failed Init = %v, want ErrNotInitialized", err)
			}
			if _, err := m.Health(); !errors.Is(err, ErrNotInitialized) {
				t.Errorf("Health after failed Init = %v, want ErrNotInitialized", err)
			}
			if err := m.Shutdown(); err != nil {
				t.Errorf("Shutdown after failed Init = %v, want nil (no-op)", err)
			}
		})
	}
}

func TestInitShutdownPaired(t *testing.T) {
	tests := []struct {
		name          string
		initRet       nvml.Return
		initCalls     int // Init calls on the Manager
		shutdownCalls int // Shutdown calls on the Manager
		wantErr       error
		wantLibInit   int
		wantLibShut   int
	}{
		{name: "init then shutdown twice", initRet: nvml.SUCCESS, initCalls: 1, shutdownCalls: 2, wantLibInit: 1, wantLibShut: 1},
		{name: "init twice is idempotent", initRet: nvml.SUCCESS, initCalls: 2, shutdownCalls: 1, wantLibInit: 1, wantLibShut: 1},
		{name: "shutdown without init", initRet: nvml.SUCCESS, initCalls: 0, shutdownCalls: 1, wantLibInit: 0, wantLibShut: 0},
		{name: "failed init is not shut down", initRet: nvml.ERROR_UNKNOWN, initCalls: 1, shutdownCalls: 1, wantErr: nvml.ERROR_UNKNOWN, wantLibInit: 1, wantLibShut: 0},
		{name: "driver not loaded is no NVML", initRet: nvml.ERROR_DRIVER_NOT_LOADED, initCalls: 1, shutdownCalls: 1, wantErr: ErrNoNVML, wantLibInit: 1, wantLibShut: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := dgxh100.New()
			var libInit, libShut int
			srv.InitFunc = func() nvml.Return { libInit++; return tc.initRet }
			srv.ShutdownFunc = func() nvml.Return { libShut++; return nvml.SUCCESS }
			m, err := New(Config{NVML: srv, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			for range tc.initCalls {
				err = m.Init()
			}
			if tc.wantErr == nil && err != nil {
				t.Fatalf("Init: %v", err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("Init error = %v, want %v", err, tc.wantErr)
			}
			for range tc.shutdownCalls {
				if err := m.Shutdown(); err != nil {
					t.Fatalf("Shutdown: %v", err)
				}
			}
			if libInit != tc.wantLibInit || libShut != tc.wantLibShut {
				t.Errorf("nvml Init/Shutdown calls = %d/%d, want %d/%d", libInit, libShut, tc.wantLibInit, tc.wantLibShut)
			}
		})
	}
}

func TestErrorConversion(t *testing.T) {
	tests := []struct {
		name    string
		err     error
		want    string
		matches []error
	}{
		{
			name:    "per GPU",
			err:     nvmlErr("GPU-1234", "GetRemappedRows", nvml.ERROR_NOT_SUPPORTED),
			want:    "devices: GPU-1234: GetRemappedRows: ERROR_NOT_SUPPORTED",
			matches: []error{nvml.ERROR_NOT_SUPPORTED, ErrNotSupported},
		},
		{
			name:    "in use",
			err:     nvmlErr("GPU-1", "DeviceRemoveGpu_v2", nvml.ERROR_IN_USE),
			want:    "devices: GPU-1: DeviceRemoveGpu_v2: ERROR_IN_USE",
			matches: []error{nvml.ERROR_IN_USE, ErrInUse},
		},
		{
			name:    "system level",
			err:     nvmlErr("", "DeviceGetCount", nvml.ERROR_GPU_IS_LOST),
			want:    "devices: DeviceGetCount: ERROR_GPU_IS_LOST",
			matches: []error{nvml.ERROR_GPU_IS_LOST, ErrGPULost},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error() = %q, want %q", got, tc.want)
			}
			for _, target := range tc.matches {
				if !errors.Is(tc.err, target) {
					t.Errorf("errors.Is(%v, %v) = false", tc.err, target)
				}
			}
			if errors.Is(tc.err, ErrNoPermission) {
				t.Errorf("errors.Is(%v, ErrNoPermission) = true", tc.err)
			}
		})
	}
	if err := nvmlErr("GPU-1", "GetName", nvml.SUCCESS); err != nil {
		t.Errorf("SUCCESS converted to %v", err)
	}
}
