package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCompare: an inventory that matches nvidia-smi -q -x (the v12 schema
// of an H100, and an older driver's names: double_bit, pending_blacklist,
// the PCI ID only as the gpu element's id) has no difference; each field
// changed on one side is a difference naming the field.
func TestCompare(t *testing.T) {
	for _, tc := range []struct{ inv, smi string }{{"inventory-h100.json", "smi-h100.xml"}, {"inventory-old.json", "smi-old.xml"}} {
		var out bytes.Buffer
		n, err := Compare(read(t, tc.inv), read(t, tc.smi), &out)
		if err != nil || n != 0 {
			t.Errorf("%s vs %s: %d differences, %v:\n%s", tc.inv, tc.smi, n, err, out.String())
		}
		if strings.Contains(out.String(), "info") {
			t.Errorf("%s vs %s: a field read differently:\n%s", tc.inv, tc.smi, out.String())
		}
	}
	inv, smi := string(read(t, "inventory-h100.json")), string(read(t, "smi-h100.xml"))
	for _, tc := range []struct {
		name, field string
		inv, smi    string
	}{
		{"persistence", "persistence mode", inv, strings.Replace(smi, "<persistence_mode>Enabled", "<persistence_mode>Disabled", 1)},
		{"MIG", "MIG mode", strings.Replace(inv, `"mig": "false"`, `"mig": "true"`, 1), smi},
		{"remap pending", "row remap pending", strings.Replace(inv, `"pending": true`, `"pending": false`, 1), smi},
		{"remap failure", "row remap failure", inv, strings.Replace(smi, "<remapped_row_failure>No", "<remapped_row_failure>Yes", 1)},
		{"fabric", "fabric state", inv, strings.Replace(smi, "<state>Completed", "<state>In Progress", 1)},
		{"recovery action", "recovery action", strings.Replace(inv, `"DRAIN_AND_RESET"`, `"NONE"`, 1), smi},
		{"PCI", "PCI bus ID", strings.Replace(inv, "00000000:18:00.0", "00000000:19:00.0", 1), smi},
		{"GPU gone", "GPU count", inv, smi[:strings.Index(smi, `<gpu id="00000000:2A`)] + "</nvidia_smi_log>"},
		{"retired pages", "retired pages pending", strings.Replace(inv, `"retiredPagesPending": "unknown"`, `"retiredPagesPending": "false"`, 1), smi},
	} {
		var out bytes.Buffer
		n, err := Compare([]byte(tc.inv), []byte(tc.smi), &out)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 || !strings.Contains(out.String(), "DIFF") || !regexpLine(out.String(), "DIFF", tc.field) {
			t.Errorf("%s: %d differences, want one on %q:\n%s", tc.name, n, tc.field, out.String())
		}
	}
	var out bytes.Buffer
	if n, _ := Compare([]byte(strings.Replace(inv, `"uncorrected": 2`, `"uncorrected": 7`, 1)), []byte(smi), &out); n != 0 || !regexpLine(out.String(), "info", "ECC volatile uncorrected") {
		t.Errorf("an ECC count that differs is reported as info, not counted: %d\n%s", n, out.String())
	}
	if _, err := Compare([]byte("{"), []byte(smi), &out); err == nil {
		t.Error("broken inventory JSON accepted")
	}
	if _, err := Compare([]byte(inv), []byte("<nvidia_smi_log><gpu>"), &out); err == nil {
		t.Error("broken nvidia-smi XML accepted")
	}
}

// regexpLine reports whether a line starts with tag and names field.
func regexpLine(out, tag, field string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, tag) && strings.Contains(l, field) {
			return true
		}
	}
	return false
}

// TestRun: usage errors exit 2, a difference exits 1, a match exits 0;
// time without NVML exits 3 (this host has none; with a GPU it times it).
func TestRun(t *testing.T) {
	var o, e bytes.Buffer
	if c := run(nil, &o, &e); c != 2 {
		t.Errorf("no arguments: exit %d, want 2", c)
	}
	if c := run([]string{"frobnicate"}, &o, &e); c != 2 || !strings.Contains(e.String(), `unknown subcommand "frobnicate"`) {
		t.Errorf("unknown subcommand: exit %d, %q", c, e.String())
	}
	if c := run([]string{"compare", "testdata/inventory-h100.json", "testdata/smi-h100.xml"}, &o, &e); c != 0 || !strings.Contains(o.String(), "0 difference(s)") {
		t.Errorf("compare of a match: exit %d\n%s", c, o.String())
	}
	if c := run([]string{"compare", "testdata/inventory-old.json", "testdata/smi-h100.xml"}, &o, &e); c != 1 {
		t.Errorf("compare of different machines: exit %d, want 1", c)
	}
	e.Reset()
	switch c := run([]string{"time", "-sweeps", "1"}, &o, &e); c {
	case 3: // no NVML here
		if !strings.Contains(e.String(), "NVML init") {
			t.Errorf("time without NVML: %q, want the NVML init error", e.String())
		}
	case 0: // a host with a GPU
	default:
		t.Errorf("time: exit %d\n%s%s", c, o.String(), e.String())
	}
	if c := run([]string{"time", "-sweeps", "0"}, &o, &e); c != 2 {
		t.Errorf("time -sweeps 0: exit %d, want 2", c)
	}
	if c := run([]string{"holders"}, &o, &e); c != 0 || !strings.Contains(o.String(), "holder(s)") {
		t.Errorf("holders: exit %d\n%s%s", c, o.String(), e.String())
	}
}
