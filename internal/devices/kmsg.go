package devices

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// DefaultKernelLog is the kernel's log device: one record per read, from the
// oldest the ring buffer still holds (this boot's), never blocking when
// opened O_NONBLOCK.
const DefaultKernelLog = "/dev/kmsg"

// KernelXID is an XID the NVIDIA kernel module logged:
//
//	NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
type KernelXID struct {
	Seq  uint64 // the kernel log record's sequence number
	Bus  string // BusKey form: "0000:3b:00"
	XID  uint64
	Text string // the record's message
}

// KernelLog reads XIDs from the kernel log (/dev/kmsg, or a file of the
// same record format for tests). It keeps the file open, so each Read
// returns only what was logged since the one before. Not safe for
// concurrent use.
type KernelLog struct {
	path  string
	fd    int
	carry []byte // a partial line (a regular file read mid-line)
	buf   []byte
}

// OpenKernelLog opens path read-only and non-blocking.
func OpenKernelLog(path string) (*KernelLog, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("devices: opening the kernel log %s: %w", path, err)
	}
	// /dev/kmsg refuses a read shorter than its record (EINVAL); records
	// are at most 8 KiB with their dictionary.
	return &KernelLog{path: path, fd: fd, buf: make([]byte, 16<<10)}, nil
}

// Close closes the file.
func (k *KernelLog) Close() error {
	if k == nil || k.fd < 0 {
		return nil
	}
	err := syscall.Close(k.fd)
	k.fd = -1
	return err
}

// KernelRecord is one record of the kernel log: its syslog facility and
// level, sequence number and message (dictionary lines dropped).
type KernelRecord struct {
	Facility, Level int
	Seq             uint64
	Message         string
}

// Records returns every record logged since the last call (the first call:
// the whole buffer). lost is true when the kernel overwrote records before
// they were read (EPIPE: the ring buffer wrapped).
func (k *KernelLog) Records() (recs []KernelRecord, lost bool, err error) {
	if k.fd < 0 {
		return nil, false, errors.New("devices: kernel log closed")
	}
	for {
		n, err := syscall.Read(k.fd, k.buf)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			return recs, lost, nil // nothing more logged
		case errors.Is(err, syscall.EPIPE):
			lost = true // overwritten; the next read returns the oldest left
			continue
		case err != nil:
			return recs, lost, fmt.Errorf("devices: reading the kernel log %s: %w", k.path, err)
		case n == 0:
			return recs, lost, nil // end of a regular file
		}
		data := append(k.carry, k.buf[:n]...)
		last := bytes.LastIndexByte(data, '\n')
		if last < 0 {
			k.carry = data
			continue
		}
		for _, line := range bytes.Split(data[:last], []byte{'\n'}) {
			if r, ok := parseKernelRecord(line); ok {
				recs = append(recs, r)
			}
		}
		k.carry = append([]byte(nil), data[last+1:]...)
	}
}

// parseKernelRecord reads "prefix,seq,usec,flags[,…];message" (the
// /dev/kmsg format, Documentation/ABI/testing/dev-kmsg). Dictionary lines
// (" KEY=value") and anything malformed are not records.
func parseKernelRecord(line []byte) (KernelRecord, bool) {
	head, msg, ok := bytes.Cut(line, []byte{';'})
	if !ok || len(line) == 0 || line[0] == ' ' {
		return KernelRecord{}, false
	}
	f := strings.Split(string(head), ",")
	if len(f) < 4 {
		return KernelRecord{}, false
	}
	prefix, err1 := strconv.Atoi(f[0])
	seq, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil || prefix < 0 {
		return KernelRecord{}, false
	}
	return KernelRecord{Facility: prefix >> 3, Level: prefix & 7, Seq: seq, Message: string(msg)}, true
}

// xidPattern matches the NVIDIA module's XID line; older drivers omit "PCI:".
var xidPattern = regexp.MustCompile(`^NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.[0-7])?\): (\d+)\b`)

// KernelXIDOf returns the XID a record reports. Only records of the kernel
// facility (0) count: a process writing to /dev/kmsg gets LOG_USER or
// another facility from the kernel, so it cannot forge an XID.
func KernelXIDOf(r KernelRecord) (KernelXID, bool) {
	if r.Facility != 0 {
		return KernelXID{}, false
	}
	m := xidPattern.FindStringSubmatch(r.Message)
	if m == nil {
		return KernelXID{}, false
	}
	xid, err := strconv.ParseUint(m[4], 10, 64)
	if err != nil {
		return KernelXID{}, false
	}
	return KernelXID{Seq: r.Seq, Bus: busKey(m[1], m[2], m[3]), XID: xid, Text: r.Message}, true
}

// BusKey turns NVML's PCI bus ID ("00000000:3B:00.0") into the form the
// kernel log's XID lines use ("0000:3b:00"), so the two can be compared.
// "" when the ID is not domain:bus:device[.function].
func BusKey(pciBusID string) string {
	dev, _, _ := strings.Cut(pciBusID, ".")
	p := strings.Split(dev, ":")
	if len(p) != 3 {
		return ""
	}
	return busKey(p[0], p[1], p[2])
}

// AtBus returns the GPU of s at the kernel log's PCI address (BusKey form).
func (s Snapshot) AtBus(bus string) (GPUInfo, bool) {
	for _, g := range s.GPUs {
		if BusKey(g.PCIBusID) == bus {
			return g, true
		}
	}
	return GPUInfo{}, false
}

func busKey(domain, bus, device string) string {
	d, err1 := strconv.ParseUint(domain, 16, 32)
	b, err2 := strconv.ParseUint(bus, 16, 8)
	v, err3 := strconv.ParseUint(device, 16, 8)
	if err1 != nil || err2 != nil || err3 != nil {
		return ""
	}
	return fmt.Sprintf("%04x:%02x:%02x", d, b, v)
}
