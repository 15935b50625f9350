package gpuhealth

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

// BaselineVersion is the format version of the baseline file.
const BaselineVersion = 1

// SignalGPUsMissing is the GPUHealthy reason part for GPUs of the baseline
// that NVML no longer lists (they have no index to name).
const SignalGPUsMissing = "GPUsMissing"

// Baseline is every GPU the agent has seen on this node since it first
// saw any: a GPU that falls off the bus disappears from NVML's list, and
// only a comparison with an earlier list notices it. It lives next to the
// journal (Config.BaselinePath) and survives restarts and reboots.
type Baseline struct {
	V         int       `json:"v"`
	FirstSeen time.Time `json:"firstSeen"`
	UUIDs     []string  `json:"uuids"` // sorted
}

// LoadBaseline reads the baseline file; absent: nil, nil.
func LoadBaseline(path string) (*Baseline, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var bl Baseline
	if err := json.Unmarshal(b, &bl); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if bl.V != BaselineVersion || bl.FirstSeen.IsZero() {
		return nil, fmt.Errorf("%s: version %d, first seen %v: want version %d with a time", path, bl.V, bl.FirstSeen, BaselineVersion)
	}
	slices.Sort(bl.UUIDs)
	return &bl, nil
}

// Save writes the baseline atomically (a temporary file, fsync, rename,
// fsync of the directory), mode 0600.
func (b *Baseline) Save(path string) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".gpu-baseline-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err = f.Write(append(data, '\n')); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// present is the UUIDs of a snapshot, sorted (GPUs NVML cannot name are
// left out: they are reported as lost).
func present(s devices.Snapshot) []string {
	var out []string
	for _, g := range s.GPUs {
		if g.UUID != "" {
			out = append(out, g.UUID)
		}
	}
	slices.Sort(out)
	return out
}

// missing is the baseline's UUIDs that are not in have (sorted).
func (b *Baseline) missing(have []string) []string {
	var out []string
	for _, u := range b.UUIDs {
		if _, found := slices.BinarySearch(have, u); !found {
			out = append(out, u)
		}
	}
	return out
}

// add puts the UUIDs of have that the baseline lacks into it; it reports
// whether it changed.
func (b *Baseline) add(have []string) bool {
	changed := false
	for _, u := range have {
		if _, found := slices.BinarySearch(b.UUIDs, u); !found {
			b.UUIDs = append(b.UUIDs, u)
			slices.Sort(b.UUIDs)
			changed = true
		}
	}
	return changed
}

// missingMessage says which GPUs of the baseline are gone.
func (b *Baseline) missingMessage(gone []string) string {
	return fmt.Sprintf("%d of the %d GPUs seen since %s missing (fallen off the bus?): %s",
		len(gone), len(b.UUIDs), b.FirstSeen.UTC().Format(time.RFC3339), strings.Join(gone, ", "))
}
