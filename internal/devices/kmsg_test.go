package devices

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// A kernel log in /dev/kmsg's record format, as a file.
const kmsgFile = `6,100,1000,-;Linux version 6.1.0
4,101,2000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
 SUBSYSTEM=pci
 DEVICE=+pci:0000:3b:00.0
4,102,2100,-;NVRM: Xid (0000:86:00): 48, pid=1234, name=python, An uncorrectable double bit error
4,103,2200,c,caller=T42;NVRM: Xid (PCI:0001:0A:1f.0): 13, Graphics SM Warp Exception
12,104,2300,-;NVRM: Xid (PCI:0000:07:00): 79, injected by a process (facility 1: LOG_USER)
4,105,2400,-;nvidia-modeset: NVRM: Xid (PCI:0000:07:00): 79, not at the start of the message
garbage without a header
4,106,2500,-;NVRM: Xid (PCI:0000:07:00): 94, pid=1, Contained ECC error
`

func writeKmsg(t *testing.T, dir, text string) string {
	t.Helper()
	p := filepath.Join(dir, "kmsg")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func kernelXIDs(t *testing.T, k *KernelLog) []KernelXID {
	t.Helper()
	recs, _, err := k.Records()
	if err != nil {
		t.Fatal(err)
	}
	var out []KernelXID
	for _, r := range recs {
		if x, ok := KernelXIDOf(r); ok {
			out = append(out, x)
		}
	}
	return out
}

func TestKernelLogXIDs(t *testing.T) {
	p := writeKmsg(t, t.TempDir(), kmsgFile)
	k, err := OpenKernelLog(p)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	got := kernelXIDs(t, k)
	want := []KernelXID{
		{Seq: 101, Bus: "0000:3b:00", XID: 79},
		{Seq: 102, Bus: "0000:86:00", XID: 48},
		{Seq: 103, Bus: "0001:0a:1f", XID: 13},
		{Seq: 106, Bus: "0000:07:00", XID: 94},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d XIDs %+v, want %d (the LOG_USER line, the one not at the start and the garbage are not XIDs)", len(got), got, len(want))
	}
	for i := range want {
		if got[i].Seq != want[i].Seq || got[i].Bus != want[i].Bus || got[i].XID != want[i].XID || !strings.HasPrefix(got[i].Text, "NVRM: Xid") {
			t.Errorf("XID %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// Kept open: a second read returns only what was appended since,
	// including a line whose first half was there before.
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(kernelXIDs(t, k)) != 0 {
		t.Fatal("nothing appended, yet a second read returned XIDs")
	}
	if _, err := f.WriteString("3,107,2600,-;NVRM: Xid (PCI:0000:3b:00): 6"); err != nil {
		t.Fatal(err)
	}
	if got := kernelXIDs(t, k); len(got) != 0 {
		t.Fatalf("a line without its newline was read as %+v", got)
	}
	if _, err := f.WriteString("4, pid=7, Ch 00000010\n"); err != nil {
		t.Fatal(err)
	}
	got = kernelXIDs(t, k)
	if len(got) != 1 || got[0].Seq != 107 || got[0].XID != 64 || got[0].Bus != "0000:3b:00" {
		t.Fatalf("appended XID read as %+v, want seq 107 XID 64 on 0000:3b:00", got)
	}
}

func TestBusKey(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00",
		"0000:3b:00.0":     "0000:3b:00",
		"00000001:0A:1F.0": "0001:0a:1f",
		"00000000:07:00":   "0000:07:00",
		"":                 "",
		"3b:00.0":          "",
		"0000:zz:00.0":     "",
	} {
		if got := BusKey(in); got != want {
			t.Errorf("BusKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestKernelLogDevice reads the real /dev/kmsg: a record written to it
// (neutral text, no "NVRM") comes back with its sequence number and the
// facility the kernel gives a process (LOG_USER, so never an XID), and the
// non-blocking read ends at the end of the buffer instead of waiting.
func TestKernelLogDevice(t *testing.T) {
	w, err := os.OpenFile(DefaultKernelLog, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("this test reads and writes the real %s and needs root (make test runs as root in CI): %v", DefaultKernelLog, err)
	}
	defer w.Close()
	k, err := OpenKernelLog(DefaultKernelLog)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if _, _, err := k.Records(); err != nil { // the buffer so far
		t.Fatal(err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	marker := "lifecycle-agent devices test marker " + hex.EncodeToString(b)
	// "<6>" asks for facility 0 (the kernel's), level info: the kernel
	// gives a process LOG_USER instead, so it cannot forge an XID.
	if _, err := w.WriteString("<6>" + marker + "\n"); err != nil {
		t.Fatalf("writing to %s: %v", DefaultKernelLog, err)
	}
	recs, _, err := k.Records()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(recs, func(r KernelRecord) bool { return r.Message == marker })
	if i < 0 {
		t.Fatalf("the record written was not read back (%d records read)", len(recs))
	}
	if r := recs[i]; r.Facility != 1 || r.Level != 6 || r.Seq == 0 {
		t.Fatalf("record %+v: a process's record must not have the kernel's facility 0", r)
	}
}

// TestXIDTableDocumented: docs/gpu.md's XID table lists exactly the codes
// and classes of XIDTable, so the page an operator reads is what runs.
func TestXIDTableDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "gpu.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^\| (\d+) \| (\w+) \|`)
	doc := map[uint64]string{}
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		x, _ := strconv.ParseUint(m[1], 10, 64)
		if _, dup := doc[x]; dup {
			t.Errorf("docs/gpu.md lists XID %d twice", x)
		}
		doc[x] = m[2]
	}
	table := XIDTable()
	for x, c := range table {
		if doc[x] != c.String() {
			t.Errorf("XID %d: docs/gpu.md says %q, the code %q", x, doc[x], c)
		}
	}
	for x := range doc {
		if _, ok := table[x]; !ok {
			t.Errorf("docs/gpu.md lists XID %d, which the code's table does not have", x)
		}
	}
}
