package gpuhealth

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// openJournal opens the real bbolt journal at path, closed at the end.
func openJournal(t *testing.T, path string) *journal.Journal {
	t.Helper()
	j, _, err := journal.Open(context.Background(), path, journal.Options{
		Checker: func(_ context.Context, p string) error { return journal.CheckFile(p, time.Second) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	return j
}

// lastHealth is the last GPUHealthy written.
func (e *env) lastHealth(t *testing.T) (corev1.ConditionStatus, string) {
	t.Helper()
	all := e.sink.all()
	if len(all) == 0 {
		t.Fatal("no GPUHealthy written")
	}
	return all[len(all)-1].Status, all[len(all)-1].Reason
}

// TestXIDsKeptAcrossRestart: latched XIDs are journaled and latched again
// when the agent restarts in the same boot; after a reboot only the XID
// that asks for the GPU's replacement is; a reset's clearing is journaled
// too, so a restart does not bring cleared XIDs back.
func TestXIDsKeptAcrossRestart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openJournal(t, path)
	withState := func(boot string) func(*Config) {
		return func(c *Config) { c.State, c.BootID = j, boot }
	}
	e := newEnv(t, devicestest.DGXH100, withState(testBoot))
	e.mon.Check(ctx)
	if st, r := e.lastHealth(t); st != corev1.ConditionTrue {
		t.Fatalf("at start: %s/%s, want True", st, r)
	}
	// What the XID watcher latches: a reboot-, a reset- and a replace-class XID.
	for i, x := range map[int]uint64{1: 79, 3: 48, 5: 64} {
		e.devs.LatchXID(e.fleet.UUID(i), x)
	}
	e.clk.Step(time.Minute)
	e.mon.Check(ctx)
	const all = "GPU1:XID79,GPU3:XID48,GPU5:XID64"
	if st, r := e.lastHealth(t); st != corev1.ConditionFalse || r != all {
		t.Fatalf("with three XIDs: %s/%s, want False/%s", st, r, all)
	}
	st, ok, err := j.GPUHealth()
	if err != nil || !ok || st.Boot != testBoot || len(st.XIDs) != 3 || st.XIDs[e.fleet.UUID(5)][0] != 64 {
		t.Fatalf("journaled state %+v, %v, %v; want the three XIDs in boot %s", st, ok, err, testBoot)
	}

	// The agent restarts (a new NVML session latches nothing by itself).
	e2 := newEnv(t, devicestest.DGXH100, withState(testBoot))
	e2.mon.Check(ctx)
	if st, r := e2.lastHealth(t); st != corev1.ConditionFalse || r != all {
		t.Fatalf("after a restart in the same boot: %s/%s, want False/%s", st, r, all)
	}

	// After a reboot: the reboot reset the GPUs; the failing one stays.
	const boot2 = "6f5e4d3c-2b1a-4098-8e7d-6c5b4a3f2e1d"
	e3 := newEnv(t, devicestest.DGXH100, withState(boot2))
	e3.mon.Check(ctx)
	if st, r := e3.lastHealth(t); st != corev1.ConditionFalse || r != "GPU5:XID64" {
		t.Fatalf("after a reboot: %s/%s, want False/GPU5:XID64 only", st, r)
	}
	if st, _, _ := j.GPUHealth(); st.Boot != boot2 || len(st.XIDs) != 1 {
		t.Fatalf("journaled after the reboot: %+v; want boot %s and GPU 5's XID only", st, boot2)
	}

	// The GPU is replaced or reset (ClearXIDs), then the agent restarts.
	e3.devs.ClearXIDs(e3.fleet.UUID(5))
	e3.clk.Step(time.Minute)
	e3.mon.Check(ctx)
	if st, r := e3.lastHealth(t); st != corev1.ConditionTrue {
		t.Fatalf("after clearing: %s/%s, want True", st, r)
	}
	e4 := newEnv(t, devicestest.DGXH100, withState(boot2))
	e4.mon.Check(ctx)
	if st, r := e4.lastHealth(t); st != corev1.ConditionTrue {
		t.Fatalf("restart after clearing: %s/%s, want True (the clearing was journaled)", st, r)
	}
}

// kmsgLine is a kernel log record of the kernel facility (prefix 4:
// facility 0, level warning) or, with prefix 12, of a process (LOG_USER).
func kmsgLine(prefix int, seq uint64, bus string, xid uint64) string {
	return fmt.Sprintf("%d,%d,%d,-;NVRM: Xid (PCI:%s): %d, pid=1234, name=python, test\n", prefix, seq, seq*1000, devices.BusKey(bus), xid)
}

func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

// TestKernelLogXIDs: XIDs the NVIDIA module logged while the agent was
// down are read from the kernel log at start and latched on the GPU at
// that PCI address (a process's forged line, an ignorable XID and an
// unknown address are not); those logged while it runs are read at the
// next evaluation; those logged during a reset are not latched after it;
// and a restart reads on from the journaled position, so what a reset
// cleared does not come back.
func TestKernelLogXIDs(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	klog := filepath.Join(dir, "kmsg")
	j := openJournal(t, filepath.Join(dir, "journal.db"))
	withLog := func(c *Config) { c.State, c.KernelLog = j, klog }
	bus := devicestest.New(devicestest.DGXH100).PCIBusID
	appendFile(t, klog, "6,1,1000,-;Linux version 6.1.0\n"+
		kmsgLine(4, 10, bus(2), 79)+ // logged before the agent started
		kmsgLine(12, 11, bus(4), 48)+ // written by a process: not the kernel's
		kmsgLine(4, 12, bus(6), 13)+ // an application XID: ignorable
		kmsgLine(4, 13, "00000000:EE:00.0", 79)) // no GPU there

	e := newEnv(t, devicestest.DGXH100, withLog)
	e.mon.Check(ctx)
	if st, r := e.lastHealth(t); st != corev1.ConditionFalse || r != "GPU2:XID79" {
		t.Fatalf("at start: %s/%s, want False/GPU2:XID79 (from the kernel log)", st, r)
	}
	if st, _, _ := j.GPUHealth(); st.KernelLogSeq != 13 {
		t.Fatalf("journaled kernel log position %d, want 13", st.KernelLogSeq)
	}
	// Logged while the agent runs.
	appendFile(t, klog, kmsgLine(4, 14, bus(4), 48))
	e.clk.Step(time.Minute)
	e.mon.Check(ctx)
	if st, r := e.lastHealth(t); st != corev1.ConditionFalse || r != "GPU2:XID79,GPU4:XID48" {
		t.Fatalf("after a new kernel log line: %s/%s, want False/GPU2:XID79,GPU4:XID48", st, r)
	}

	// A reset of both: paused, the reset logs an XID, clears the latch.
	if err := e.mon.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	appendFile(t, klog, kmsgLine(4, 15, bus(4), 79))
	e.devs.ClearXIDs(e.fleet.UUID(2), e.fleet.UUID(4))
	e.mon.Resume()
	e.clk.Step(time.Minute)
	e.mon.Check(ctx)
	if st, r := e.lastHealth(t); st != corev1.ConditionTrue {
		t.Fatalf("after the reset: %s/%s, want True (the reset's own XID is not latched)", st, r)
	}

	// Stopped; an XID is logged while it is down; started again.
	appendFile(t, klog, kmsgLine(4, 16, bus(7), 48))
	e2 := newEnv(t, devicestest.DGXH100, withLog)
	e2.mon.Check(ctx)
	if st, r := e2.lastHealth(t); st != corev1.ConditionFalse || r != "GPU7:XID48" {
		t.Fatalf("after a restart: %s/%s, want False/GPU7:XID48 only (records up to 15 were read before)", st, r)
	}
}
