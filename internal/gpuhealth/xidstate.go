package gpuhealth

import (
	"slices"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// recall latches into the manager, and adds to s, the XIDs that NVML's
// event watcher cannot know: at the first good reading those saved in
// State before a restart, then at every reading those the NVIDIA module
// logged to the kernel log since the last one (at start: since the
// position saved, or since boot). Call under m.mu.
func (m *Monitor) recall(s *devices.Snapshot) {
	if !m.restored {
		m.restored = true
		m.restore(s)
	}
	m.readKernelLog(s, true)
}

// restore reads State. In the same boot every saved XID is latched again
// and the kernel log is read on from the saved position. After a reboot
// only the XIDs that ask for the GPU to be replaced are: the reboot reset
// every GPU, which is what the others asked for, and the kernel log is
// this boot's, read from its start.
func (m *Monitor) restore(s *devices.Snapshot) {
	if m.cfg.State == nil {
		return
	}
	st, ok, err := m.cfg.State.GPUHealth()
	if err != nil {
		m.log.Warn("GPU health state unreadable; starting from what NVML and the kernel log say now", "err", err)
		return
	}
	if !ok {
		return
	}
	same := st.Boot == m.cfg.BootID
	if same {
		m.klogSeq = st.KernelLogSeq
	}
	kept, dropped := 0, 0
	for uuid, xids := range st.XIDs {
		for _, x := range xids {
			if !same && devices.ClassifyXID(x, nil) != devices.XIDNeedsReplace {
				dropped++
				continue
			}
			if !m.cfg.Devices.LatchXID(uuid, x).Unhealthy() {
				continue // a code configured ignorable since
			}
			kept++
			if !addXID(s, uuid, x) && !listed(*s, uuid) {
				m.absent[uuid] = append(m.absent[uuid], x)
			}
		}
	}
	m.saved = &st
	if kept+dropped > 0 {
		m.log.Info("GPU XIDs restored from the journal", "kept", kept, "clearedByReboot", dropped,
			"sameBoot", same, "kernelLogSeq", m.klogSeq)
	}
}

// readKernelLog reads the kernel log records logged since the last read
// and, when latch is true, latches the XIDs among them on the GPU at that
// PCI address (adding them to s); when false it only moves past them (the
// XIDs a reset itself logs). It returns how many XIDs it latched or
// skipped.
func (m *Monitor) readKernelLog(s *devices.Snapshot, latch bool) int {
	if m.cfg.KernelLog == "" {
		return 0
	}
	if m.klog == nil {
		k, err := devices.OpenKernelLog(m.cfg.KernelLog)
		if err != nil {
			m.warn("kernellog", "kernel log not readable: XIDs logged while the agent was down are not seen", "err", err)
			return 0
		}
		m.klog = k
	}
	recs, lost, err := m.klog.Records()
	if err != nil {
		m.warn("kernellog", "reading the kernel log failed; reopening it at the next evaluation", "err", err)
		_ = m.klog.Close()
		m.klog = nil
	}
	gap := lost
	n := 0
	for _, r := range recs {
		if r.Seq <= m.klogSeq {
			continue // read before a restart
		}
		if m.klogSeq > 0 && r.Seq != m.klogSeq+1 {
			gap = true
		}
		m.klogSeq = r.Seq
		x, ok := devices.KernelXIDOf(r)
		if !ok {
			continue
		}
		n++
		if !latch {
			m.log.Info("XID logged during a GPU reset not latched", "pci", x.Bus, "xid", x.XID, "seq", x.Seq)
			continue
		}
		g, _ := s.AtBus(x.Bus)
		uuid := g.UUID
		if uuid == "" {
			m.log.Warn("XID in the kernel log for a PCI address NVML does not list", "pci", x.Bus, "xid", x.XID, "seq", x.Seq, "text", x.Text)
			continue
		}
		class := m.cfg.Devices.LatchXID(uuid, x.XID)
		if class.Unhealthy() && addXID(s, uuid, x.XID) {
			m.log.Warn("GPU XID in the kernel log", "gpu", uuid, "xid", x.XID, "needs", class.String(), "seq", x.Seq, "text", x.Text)
		}
	}
	if gap && m.klogSeq > 0 {
		m.warn("kernellog-gap", "kernel log records were overwritten before the agent read them: XIDs among them are not seen", "lastSeq", m.klogSeq)
	}
	return n
}

// beforeReset latches what the kernel log holds before a GPU reset and
// saves the state, so a crash during the reset loses nothing. Under m.mu.
func (m *Monitor) beforeReset() {
	if m.restored {
		m.readKernelLog(&m.snap, true)
		m.saveState(m.snap)
	}
}

// afterReset moves past what the kernel log got during the reset: the
// reset cleared the GPUs' latched XIDs (devices.ResetAndVerify), and the
// XIDs a reset logs (a GPU gone and back) are not faults to latch after
// it. Then it saves the state as NVML reads it now (NVML is initialized
// again before Resume), so a crash right after the reset does not bring
// the cleared XIDs back; if NVML cannot be read, the next evaluation
// saves it. Under m.mu.
func (m *Monitor) afterReset() {
	if !m.restored {
		return
	}
	m.readKernelLog(&m.snap, false)
	if s, err := m.cfg.Devices.Snapshot(); err == nil {
		m.snap = s
		m.saveState(s)
	}
}

// saveState writes the latched XIDs and the kernel log position to State
// when they changed; a failed write is retried at the next evaluation.
func (m *Monitor) saveState(s devices.Snapshot) {
	if m.cfg.State == nil {
		return
	}
	st := journal.GPUHealthState{Boot: m.cfg.BootID, KernelLogSeq: m.klogSeq, XIDs: map[string][]uint64{}}
	for _, g := range s.GPUs {
		if g.UUID == "" {
			continue
		}
		delete(m.absent, g.UUID) // listed again: the manager's latch is the truth
		if len(g.CriticalXIDs) > 0 {
			st.XIDs[g.UUID] = sorted(g.CriticalXIDs)
		}
	}
	for uuid, x := range m.absent {
		st.XIDs[uuid] = sorted(x)
	}
	if m.saved != nil && m.saved.Equal(st) {
		return
	}
	if err := m.cfg.State.PutGPUHealth(st); err != nil {
		m.warn("state", "saving the GPU health state failed; retrying at the next evaluation", "err", err)
		return
	}
	m.saved = &st
}

// addXID adds xid to the GPU of uuid in s; false when s does not list the
// GPU. Adding one already there changes nothing and returns false too.
func addXID(s *devices.Snapshot, uuid string, xid uint64) bool {
	for i := range s.GPUs {
		if g := &s.GPUs[i]; g.UUID == uuid {
			if slices.Contains(g.CriticalXIDs, xid) {
				return false
			}
			g.CriticalXIDs = append(g.CriticalXIDs, xid)
			return true
		}
	}
	return false
}

func listed(s devices.Snapshot, uuid string) bool {
	return slices.ContainsFunc(s.GPUs, func(g devices.GPUInfo) bool { return g.UUID == uuid })
}

func sorted(x []uint64) []uint64 {
	x = slices.Clone(x)
	slices.Sort(x)
	return slices.Compact(x)
}
