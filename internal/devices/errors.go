package devices

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Sentinel errors. Match them with errors.Is; callers outside this package
// never need to import go-nvml to classify an error.
var (
	// ErrNoNVML: libnvidia-ml.so.1 could not be loaded (ERROR_LIBRARY_NOT_FOUND)
	// or the kernel driver is not running (ERROR_DRIVER_NOT_LOADED). Callers
	// treat it as "this host has no usable GPUs": gpu-reset is not published.
	ErrNoNVML = errors.New("devices: no NVML")
	// ErrNotInitialized: a call was made before Init succeeded or after Shutdown.
	ErrNotInitialized = errors.New("devices: NVML not initialized")
	// ErrUnknownGPU: no GPU with that UUID is visible to NVML.
	ErrUnknownGPU = errors.New("devices: unknown GPU")
	// ErrInvalidSelection: the `gpus` parameter could not be resolved.
	ErrInvalidSelection = errors.New("devices: invalid GPU selection")
	// ErrPreconditions: a reset was refused because a precondition failed.
	ErrPreconditions = errors.New("devices: reset preconditions not met")
	// ErrUnhealthy: VerifyHealthy found at least one unhealthy GPU.
	ErrUnhealthy = errors.New("devices: GPU unhealthy")
	// ErrNoResetRoute: gpu.resetMethod auto found no nvidia-smi; the NVML
	// route is never chosen silently.
	ErrNoResetRoute = errors.New("devices: no GPU reset route")
	// ErrFabricTimeout: the GPU did not reach GPU_FABRIC_STATE_COMPLETED in time.
	ErrFabricTimeout = errors.New("devices: timed out waiting for fabric registration")
	// ErrFabricFailed: fabric registration completed with an error status.
	ErrFabricFailed = errors.New("devices: fabric registration failed")

	// ErrNotSupported matches an *Error whose Return is ERROR_NOT_SUPPORTED.
	ErrNotSupported = errors.New("devices: not supported")
	// ErrInUse matches an *Error whose Return is ERROR_IN_USE.
	ErrInUse = errors.New("devices: GPU in use")
	// ErrGPULost matches an *Error whose Return is ERROR_GPU_IS_LOST.
	ErrGPULost = errors.New("devices: GPU is lost")
	// ErrNoPermission matches an *Error whose Return is ERROR_NO_PERMISSION.
	ErrNoPermission = errors.New("devices: no permission")
	// ErrDriverGone matches an *Error whose Return says the session no
	// longer talks to a driver it can use — ERROR_DRIVER_NOT_LOADED (the
	// module was unloaded), ERROR_LIB_RM_VERSION_MISMATCH (a driver of
	// another version was loaded under the library), ERROR_UNINITIALIZED
	// (the library lost its session) — and ErrNotInitialized: a new
	// session (Manager.Reinit) is the only way back.
	ErrDriverGone = errors.New("devices: NVML session lost its driver")
)

// Error is an nvml.Return converted to an error at the package edge. It names
// the NVML operation and, for per-GPU operations, the GPU UUID:
//
//	devices: GPU-5b1c…: GetRemappedRows: ERROR_NOT_SUPPORTED
//
// errors.Is(err, nvml.ERROR_NOT_SUPPORTED) works (Unwrap returns the Return),
// and so does errors.Is(err, ErrNotSupported) for callers without go-nvml.
type Error struct {
	// GPU is the UUID, empty for system-level operations (Init, DeviceGetCount…).
	GPU string
	// Op is the NVML operation, without the nvml/Device prefix where the
	// method is a Device method (GetRemappedRows, DeviceRemoveGpu_v2…).
	Op string
	// Return is the raw NVML return code.
	Return nvml.Return
}

func (e *Error) Error() string {
	if e.GPU != "" {
		return "devices: " + e.GPU + ": " + e.Op + ": " + ReturnName(e.Return)
	}
	return "devices: " + e.Op + ": " + ReturnName(e.Return)
}

// Unwrap exposes the nvml.Return (which implements error) to errors.Is/As.
func (e *Error) Unwrap() error { return e.Return }

// Is maps the exported sentinels onto return codes.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNotSupported:
		return e.Return == nvml.ERROR_NOT_SUPPORTED
	case ErrInUse:
		return e.Return == nvml.ERROR_IN_USE
	case ErrGPULost:
		return e.Return == nvml.ERROR_GPU_IS_LOST
	case ErrNoPermission:
		return e.Return == nvml.ERROR_NO_PERMISSION
	case ErrDriverGone:
		return driverGone(e.Return)
	}
	return false
}

func driverGone(r nvml.Return) bool {
	return r == nvml.ERROR_DRIVER_NOT_LOADED || r == nvml.ERROR_LIB_RM_VERSION_MISMATCH || r == nvml.ERROR_UNINITIALIZED
}

// DriverGone reports whether err means the NVML session must be opened
// again (ErrDriverGone, or no session: ErrNotInitialized).
func DriverGone(err error) bool {
	return errors.Is(err, ErrDriverGone) || errors.Is(err, ErrNotInitialized)
}

// nvmlErr converts ret to an error; SUCCESS gives nil.
func nvmlErr(gpu, op string, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &Error{GPU: gpu, Op: op, Return: ret}
}

// codeError renders a Return by its symbolic name and unwraps to it. Used
// where the operation is already named by the surrounding message.
type codeError struct{ r nvml.Return }

func (c codeError) Error() string { return ReturnName(c.r) }
func (c codeError) Unwrap() error { return c.r }

// ReturnName gives the stable symbolic name of an NVML return code
// (ERROR_NOT_SUPPORTED), independent of whether libnvidia-ml is loaded
// (nvml.Return.Error() switches to the driver's prose once it is).
func ReturnName(r nvml.Return) string {
	switch r {
	case nvml.SUCCESS:
		return "SUCCESS"
	case nvml.ERROR_UNINITIALIZED:
		return "ERROR_UNINITIALIZED"
	case nvml.ERROR_INVALID_ARGUMENT:
		return "ERROR_INVALID_ARGUMENT"
	case nvml.ERROR_NOT_SUPPORTED:
		return "ERROR_NOT_SUPPORTED"
	case nvml.ERROR_NO_PERMISSION:
		return "ERROR_NO_PERMISSION"
	case nvml.ERROR_ALREADY_INITIALIZED:
		return "ERROR_ALREADY_INITIALIZED"
	case nvml.ERROR_NOT_FOUND:
		return "ERROR_NOT_FOUND"
	case nvml.ERROR_INSUFFICIENT_SIZE:
		return "ERROR_INSUFFICIENT_SIZE"
	case nvml.ERROR_INSUFFICIENT_POWER:
		return "ERROR_INSUFFICIENT_POWER"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "ERROR_DRIVER_NOT_LOADED"
	case nvml.ERROR_TIMEOUT:
		return "ERROR_TIMEOUT"
	case nvml.ERROR_IRQ_ISSUE:
		return "ERROR_IRQ_ISSUE"
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "ERROR_LIBRARY_NOT_FOUND"
	case nvml.ERROR_FUNCTION_NOT_FOUND:
		return "ERROR_FUNCTION_NOT_FOUND"
	case nvml.ERROR_CORRUPTED_INFOROM:
		return "ERROR_CORRUPTED_INFOROM"
	case nvml.ERROR_GPU_IS_LOST:
		return "ERROR_GPU_IS_LOST"
	case nvml.ERROR_RESET_REQUIRED:
		return "ERROR_RESET_REQUIRED"
	case nvml.ERROR_OPERATING_SYSTEM:
		return "ERROR_OPERATING_SYSTEM"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "ERROR_LIB_RM_VERSION_MISMATCH"
	case nvml.ERROR_IN_USE:
		return "ERROR_IN_USE"
	case nvml.ERROR_MEMORY:
		return "ERROR_MEMORY"
	case nvml.ERROR_NO_DATA:
		return "ERROR_NO_DATA"
	case nvml.ERROR_VGPU_ECC_NOT_SUPPORTED:
		return "ERROR_VGPU_ECC_NOT_SUPPORTED"
	case nvml.ERROR_INSUFFICIENT_RESOURCES:
		return "ERROR_INSUFFICIENT_RESOURCES"
	case nvml.ERROR_FREQ_NOT_SUPPORTED:
		return "ERROR_FREQ_NOT_SUPPORTED"
	case nvml.ERROR_ARGUMENT_VERSION_MISMATCH:
		return "ERROR_ARGUMENT_VERSION_MISMATCH"
	case nvml.ERROR_DEPRECATED:
		return "ERROR_DEPRECATED"
	case nvml.ERROR_NOT_READY:
		return "ERROR_NOT_READY"
	case nvml.ERROR_GPU_NOT_FOUND:
		return "ERROR_GPU_NOT_FOUND"
	case nvml.ERROR_INVALID_STATE:
		return "ERROR_INVALID_STATE"
	case nvml.ERROR_RESET_TYPE_NOT_SUPPORTED:
		return "ERROR_RESET_TYPE_NOT_SUPPORTED"
	case nvml.ERROR_UNKNOWN:
		return "ERROR_UNKNOWN"
	}
	return fmt.Sprintf("NVML_RETURN_%d", int32(r))
}
