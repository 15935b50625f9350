package devices

import (
	"fmt"
	"strconv"
	"strings"
)

// ParamGPUs is the gpu-reset parameter parsed by SelectGPUs.
const ParamGPUs = "gpus"

// SelectGPUs resolves the `gpus` parameter against an inventory (List or
// Snapshot().GPUs) and returns UUIDs in index order, duplicates removed.
//
// Accepted forms, never mixed in one value:
//
//	all                     every GPU
//	GPU-<uuid>[,GPU-<uuid>] UUIDs as NVML prints them (case-insensitive)
//	<n>[,<n>]               NVML indices (decimal)
//
// UUIDs and indices may not be mixed: indices change when a GPU falls off
// the bus, so a value that mixes them is ambiguous about intent. MIG device
// UUIDs are refused (MIG instances are not reset on their own). Errors wrap
// ErrInvalidSelection and name the parameter and the offending value.
// "all" means every GPU whose UUID NVML can read. Indices are resolved once,
// here: store and act on the returned UUIDs, since indices change when GPUs
// are removed and rediscovered.
func SelectGPUs(param string, inventory []GPUInfo) ([]string, error) {
	bad := func(value, why string, args ...any) error {
		return fmt.Errorf("%w: parameter %q: value %q: %s", ErrInvalidSelection, ParamGPUs, value, fmt.Sprintf(why, args...))
	}
	raw := strings.TrimSpace(param)
	if raw == "" {
		return nil, bad(param, "empty; want %q, a comma list of GPU UUIDs or a comma list of indices", "all")
	}
	if strings.EqualFold(raw, "all") {
		var out []string
		for _, g := range inventory {
			if g.UUID != "" {
				out = append(out, g.UUID)
			}
		}
		if len(out) == 0 {
			return nil, bad(param, "no GPUs found")
		}
		return out, nil
	}

	want := map[string]bool{}
	var sawUUID, sawIndex bool
	for _, item := range strings.Split(raw, ",") {
		item = strings.TrimSpace(item)
		switch {
		case item == "":
			return nil, bad(param, "empty element")
		case strings.EqualFold(item, "all"):
			return nil, bad(param, "%q cannot be combined with other values", "all")
		case hasPrefixFold(item, "MIG-"):
			return nil, bad(item, "MIG devices cannot be reset on their own; name the parent GPU")
		case hasPrefixFold(item, "GPU-"):
			sawUUID = true
			g, ok := findUUID(inventory, item)
			if !ok {
				return nil, bad(item, "no such GPU on this node")
			}
			want[g.UUID] = true
		default:
			n, err := strconv.ParseUint(item, 10, 31)
			if err != nil {
				return nil, bad(item, "not a GPU UUID (GPU-…) or index")
			}
			sawIndex = true
			g, ok := findIndex(inventory, int(n))
			if !ok {
				return nil, bad(item, "no GPU with index %d (this node has %d)", n, len(inventory))
			}
			if g.UUID == "" {
				return nil, bad(item, "GPU at index %d has no readable UUID", n)
			}
			want[g.UUID] = true
		}
		if sawUUID && sawIndex {
			return nil, bad(param, "mixes UUIDs and indices; use one form")
		}
	}
	var out []string
	for _, g := range inventory {
		if want[g.UUID] {
			out = append(out, g.UUID)
		}
	}
	return out, nil
}

// SelectGPUs resolves the `gpus` parameter against the current inventory.
func (m *Manager) SelectGPUs(param string) ([]string, error) {
	inv, err := m.List()
	if err != nil {
		return nil, err
	}
	return SelectGPUs(param, inv)
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func findUUID(inv []GPUInfo, uuid string) (GPUInfo, bool) {
	for _, g := range inv {
		if g.UUID != "" && strings.EqualFold(g.UUID, uuid) {
			return g, true
		}
	}
	return GPUInfo{}, false
}

func findIndex(inv []GPUInfo, i int) (GPUInfo, bool) {
	for _, g := range inv {
		if g.Index == i {
			return g, true
		}
	}
	return GPUInfo{}, false
}
