package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
)

const xidLog = `6,1,100,-;Linux version 6.1.0
4,2,200,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=train, GPU has fallen off the bus.
12,3,300,-;NVRM: Xid (PCI:0000:3b:00): 48, written by a process (LOG_USER): not an XID
4,4,400,-;NVRM: Xid (PCI:0000:86:00): 13, Graphics SM Warp Exception
`

// TestGPUXIDsCommand: `gpu xids` lists the kernel-facility XIDs of the log
// with their classes (the forged LOG_USER line is not one), as a table and
// as JSON, exit 0; an unreadable log exits 1 with one line naming it.
func TestGPUXIDsCommand(t *testing.T) {
	p := filepath.Join(t.TempDir(), "kmsg")
	if err := os.WriteFile(p, []byte(xidLog), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runGPU(t, "gpu", "xids", "--kernel-log", p)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SEQ") ||
		!strings.Contains(lines[1], "0000:3b:00") || !strings.Contains(lines[1], "79") || !strings.Contains(lines[1], "reboot") ||
		!strings.Contains(lines[2], "0000:86:00") || !strings.Contains(lines[2], "ignorable") {
		t.Fatalf("table:\n%s", stdout)
	}
	code, stdout, _ = runGPU(t, "gpu", "xids", "--kernel-log", p, "-o", "json")
	var doc struct {
		XIDs []xidJSON `json:"xids"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &doc) != nil || len(doc.XIDs) != 2 ||
		doc.XIDs[0].XID != 79 || doc.XIDs[0].Class != "reboot" || doc.XIDs[1].Class != "ignorable" {
		t.Fatalf("json (exit %d):\n%s", code, stdout)
	}
	missing := filepath.Join(t.TempDir(), "no-such-kmsg")
	code, stdout, stderr = runGPU(t, "gpu", "xids", "--kernel-log", missing)
	if code != 1 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, missing) {
		t.Fatalf("unreadable log: exit %d, stdout %q, stderr %q; want 1 and one line naming it", code, stdout, stderr)
	}
}

// TestWriteXIDsNamesGPU: with NVML's GPUs, each XID names the GPU at its
// PCI address.
func TestWriteXIDsNamesGPU(t *testing.T) {
	_, m := mockGPUs(t, devicestest.DGXH100)
	s, err := m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	g := s.GPUs[3]
	x := devices.KernelXID{Seq: 9, Bus: devices.BusKey(g.PCIBusID), XID: 64, Text: "NVRM: Xid (PCI:…): 64"}
	var out bytes.Buffer
	if err := writeXIDs(&out, []devices.KernelXID{x}, s, true, gpuXIDsOptions{Output: outText}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "3 "+g.UUID) || !strings.Contains(out.String(), "replace") || !strings.Contains(out.String(), "overwritten") {
		t.Fatalf("output does not name GPU 3 (%s), the class and the lost records:\n%s", g.UUID, out.String())
	}
}
