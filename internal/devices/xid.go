package devices

import (
	"fmt"
	"slices"
	"strconv"
)

// XIDClass is what an XID asks of the operator. Values are stored (the
// health state file): explicit numbers, never iota.
type XIDClass uint8

const (
	// XIDNeedsReset is also what an XID missing from the table gets: an
	// unknown error fails closed.
	XIDNeedsReset XIDClass = 1
	// XIDIgnorable: an application fault (the workload's bug, not the GPU's);
	// never unhealthy, not latched.
	XIDIgnorable XIDClass = 2
	// XIDInformational: recorded and logged, not unhealthy (the driver has
	// handled it, or another signal — pending row remap, recovery action —
	// carries the consequence).
	XIDInformational XIDClass = 3
	// XIDNeedsReboot: a GPU reset does not recover; the node must reboot.
	XIDNeedsReboot XIDClass = 4
	// XIDNeedsReplace: the GPU is failing; drain it and open an RMA.
	XIDNeedsReplace XIDClass = 5
)

func (c XIDClass) String() string {
	switch c {
	case XIDNeedsReset:
		return "reset"
	case XIDIgnorable:
		return "ignorable"
	case XIDInformational:
		return "informational"
	case XIDNeedsReboot:
		return "reboot"
	case XIDNeedsReplace:
		return "replace"
	}
	return "class" + strconv.Itoa(int(c))
}

// Unhealthy reports whether an XID of this class makes the GPU unhealthy.
func (c XIDClass) Unhealthy() bool {
	return c == XIDNeedsReset || c == XIDNeedsReboot || c == XIDNeedsReplace
}

// xidTable is the agent's reading of NVIDIA's XID catalogue
// (docs.nvidia.com/deploy/xid-errors, "Resolution" column) for the codes a
// datacenter fleet meets. The ignorable set is the NVIDIA device plugin's
// (internal/rm/health.go): 13 graphics engine exception, 31 GPU memory page
// fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video
// processor exception, 109 context-switch timeout. A code not listed needs
// a reset (fail closed).
var xidTable = map[uint64]XIDClass{
	13: XIDIgnorable, 31: XIDIgnorable, 43: XIDIgnorable, 45: XIDIgnorable, 68: XIDIgnorable, 109: XIDIgnorable,

	63:  XIDInformational, // ECC page retirement / row remap recorded (pending remap is its own signal)
	92:  XIDInformational, // high single-bit ECC error rate
	94:  XIDInformational, // contained ECC error: the application was stopped, the GPU is fine
	154: XIDInformational, // GPU recovery action changed (read as its own signal, field 230)

	48:  XIDNeedsReset, // double-bit ECC error
	74:  XIDNeedsReset, // NVLink error
	95:  XIDNeedsReset, // uncontained ECC error
	119: XIDNeedsReset, // GSP RPC timeout
	120: XIDNeedsReset, // GSP error
	140: XIDNeedsReset, // unrecovered ECC error

	79: XIDNeedsReboot, // GPU has fallen off the bus
	62: XIDNeedsReboot, // internal micro-controller halt

	64: XIDNeedsReplace, // ECC page retirement or row remapper recording failure
}

// ClassifyXID returns the class of an XID under the given ignored set
// (Config.IgnoredXIDs): a code in ignored is XIDIgnorable whatever the
// table says; otherwise the table decides; unknown codes need a reset.
func ClassifyXID(xid uint64, ignored []uint64) XIDClass {
	if ignored != nil {
		if slices.Contains(ignored, xid) {
			return XIDIgnorable
		}
		if c := xidTable[xid]; c == XIDIgnorable {
			return XIDNeedsReset // the operator un-ignored it
		}
	}
	if c, ok := xidTable[xid]; ok {
		return c
	}
	return XIDNeedsReset
}

// XIDTable returns the table as code → class, for documentation and the
// `gpu` commands.
func XIDTable() map[uint64]XIDClass {
	out := make(map[uint64]XIDClass, len(xidTable))
	for k, v := range xidTable {
		out[k] = v
	}
	return out
}

// xidSignal is the health signal of a latched XID: "XID 79" (the class
// goes into the details).
func xidSignal(x uint64) string { return "XID " + strconv.FormatUint(x, 10) }

func xidDetail(x uint64, c XIDClass) string { return fmt.Sprintf("XID %d: needs %s", x, c) }
