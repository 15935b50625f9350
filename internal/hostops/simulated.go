package hostops

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
)

// Files of the simulated host, in SimulatedConfig.StateDir.
const (
	// SimulatedBootIDFile holds the simulated boot ID, a UUID. NewSimulated
	// creates it; Reboot replaces it. Writing a new UUID into it from
	// outside simulates a reboot by someone else (a provisioning pipeline
	// in os-upgrade's external mode).
	SimulatedBootIDFile = "simulated-boot-id"
	// SimulatedOSReleaseFile, when present, is read instead of
	// /etc/os-release: os-release(5) syntax, VERSION_ID gives the version,
	// and the non-standard KERNEL_RELEASE the kernel release. Absent (or
	// without KERNEL_RELEASE), the real host's facts are read.
	SimulatedOSReleaseFile = "simulated-os-release"
	// SimulatedRebootRequiredFile, when present, makes RebootRequired true;
	// a simulated reboot removes it, as a real one clears /run.
	SimulatedRebootRequiredFile = "simulated-reboot-required"
	// SimulatedKernelKey is the kernel release's key in
	// SimulatedOSReleaseFile.
	SimulatedKernelKey = "KERNEL_RELEASE"
	// SimulatedHostBootIDFile records the real host's boot ID the
	// simulated boot began in. NewSimulated finds another one there after
	// the machine really rebooted (an admin's reboot, a power cut): that
	// is a new boot for the simulated host too, so it gets a new simulated
	// boot ID. Without it a shutdown journaled before a real reboot looked
	// like one still under way, and its cordon was never lifted.
	SimulatedHostBootIDFile = "simulated-host-boot-id"

	// DefaultMaxActions bounds the actions a Simulated keeps in memory.
	DefaultMaxActions = 1000
)

// SimulatedConfig configures a Simulated (host.mode=simulate).
type SimulatedConfig struct {
	// StateDir holds the simulated host's files (see the Simulated*File
	// constants); created 0700 if missing. Required. The agent uses a
	// directory under its StateDirectory (/var/lib/lifecycle-agent).
	StateDir string
	// Paths are read for the real boot ID and boot time, and for
	// os-release and the kernel release when the simulated files do not
	// give them; the zero value reads the real host (read-only).
	Paths host.Paths
	// MaxActions bounds the recorded actions (the oldest go first). Zero:
	// DefaultMaxActions.
	MaxActions int
	// Logger receives one line per simulated action. Nil discards.
	Logger *slog.Logger
	// Clock stamps the recorded actions. Nil: the real clock.
	Clock clock.Clock
}

// Action is one host action a Simulated logged instead of performing.
type Action struct {
	At time.Time
	// Verb is reboot, run, run-transient, inhibit, release, stop-units or
	// start-units.
	Verb string
	// Unit is the transient unit's name (run-transient).
	Unit string
	// Args are the command line (run, run-transient), what and why
	// (inhibit, release) or the units (stop-units, start-units).
	Args []string
	Env  []string
}

// Simulated is the host under host.mode=simulate: every action is logged
// with slog and recorded, none is performed. Its boot ID lives in a file
// so that a simulated reboot changes it and the change survives an agent
// restart, as a real boot ID does. It is safe for concurrent use.
type Simulated struct {
	cfg        SimulatedConfig
	log        *slog.Logger
	clock      clock.Clock
	bootIDFile string

	mu      sync.Mutex
	bootID  string // last read or written
	lastErr string // last boot ID read error logged, to log each only once
	actions []Action
	btErr   sync.Once // the boot time's read error is logged once
}

var _ drivers.HostOps = (*Simulated)(nil)

// NewSimulated creates StateDir if needed and reads the simulated boot ID,
// making one on first use and a new one when the real host has rebooted
// since (SimulatedHostBootIDFile). A boot ID file that does not hold a
// UUID is an error.
func NewSimulated(cfg SimulatedConfig) (*Simulated, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("hostops: SimulatedConfig.StateDir is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.MaxActions <= 0 {
		cfg.MaxActions = DefaultMaxActions
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("hostops: simulated state directory: %w", err)
	}
	s := &Simulated{cfg: cfg, log: cfg.Logger.With("mode", "simulate"), clock: cfg.Clock,
		bootIDFile: filepath.Join(cfg.StateDir, SimulatedBootIDFile)}
	id, err := host.Paths{BootIDFile: s.bootIDFile}.BootID()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if id, err = s.newBoot(); err != nil {
			return nil, err
		}
		s.log.Info("simulated boot ID created", "boot_id", id, "path", s.bootIDFile)
	case err != nil:
		return nil, fmt.Errorf("hostops: simulated boot ID: %w", err)
	}
	// The real host rebooted since the simulated boot began: so did the
	// simulated host.
	hostFile := filepath.Join(cfg.StateDir, SimulatedHostBootIDFile)
	real, rerr := cfg.Paths.BootID()
	was, werr := host.Paths{BootIDFile: hostFile}.BootID()
	rebooted := false
	switch {
	case rerr != nil:
		s.log.Warn("the real boot ID cannot be read: a real reboot will not start a new simulated boot", "err", rerr)
	case werr == nil:
		rebooted = was != real
	case errors.Is(werr, fs.ErrNotExist):
		// Kept by an agent that did not record the real boot (an upgrade):
		// a simulated boot ID written before the machine's boot time
		// dates from an earlier boot.
		if fi, err := os.Stat(s.bootIDFile); err == nil {
			if bt, err := cfg.Paths.BootTime(); err == nil && fi.ModTime().Before(bt) {
				rebooted = true
			}
		}
	default:
		// Only a hint: said, and written anew.
		s.log.Warn("the recorded real boot ID cannot be read; recording it again", "path", hostFile, "err", werr)
	}
	if rebooted {
		before := id
		if id, err = s.newBoot(); err != nil {
			return nil, err
		}
		s.log.Info("the machine rebooted since the simulated boot began: a new simulated boot", "from", before, "to", id, "host_boot_id", real)
	}
	if rerr == nil && (werr != nil || was != real) {
		if err := host.WriteFileAtomic(hostFile, []byte(real+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("hostops: simulated boot ID: %w", err)
		}
	}
	s.bootID = id
	return s, nil
}

// newBoot writes a new simulated boot ID and returns it.
func (s *Simulated) newBoot() (string, error) {
	id, err := newUUID()
	if err != nil {
		return "", fmt.Errorf("hostops: simulated boot ID: %w", err)
	}
	if err := host.WriteFileAtomic(s.bootIDFile, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("hostops: simulated boot ID: %w", err)
	}
	return id, nil
}

// Simulated is true.
func (s *Simulated) Simulated() bool { return true }

// BootID reads the simulated boot ID file (so that a reboot simulated from
// outside shows); when it cannot be read it returns the last known ID and
// logs the error once.
func (s *Simulated) BootID() string {
	id, err := host.Paths{BootIDFile: s.bootIDFile}.BootID()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if msg := err.Error(); msg != s.lastErr {
			s.lastErr = msg
			s.log.Error("reading the simulated boot ID failed; using the last one", "boot_id", s.bootID, "err", err)
		}
		return s.bootID
	}
	s.lastErr = ""
	s.bootID = id
	return id
}

// BootTime is the real host's (/proc/stat btime through SimulatedConfig.Paths;
// the zero time when it cannot be read): a simulated reboot restarts no
// pod, so every status the kubelet posted is this real boot's and none is
// left over from the boot before the simulated reboot.
func (s *Simulated) BootTime() time.Time {
	bt, err := s.cfg.Paths.BootTime()
	if err != nil {
		s.btErr.Do(func() {
			s.log.Warn("reading the real host's boot time failed; pods' Ready taken as they read", "err", err)
		})
		return time.Time{}
	}
	return bt
}

// Reboot simulates a reboot: it writes a new boot ID (temp file, fsync,
// rename, fsync of the directory) and removes SimulatedRebootRequiredFile.
func (s *Simulated) Reboot(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	before := s.BootID()
	id, err := newUUID()
	if err != nil {
		return fmt.Errorf("hostops: simulated reboot: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := host.WriteFileAtomic(s.bootIDFile, []byte(id+"\n"), 0o600); err != nil {
		return fmt.Errorf("hostops: simulated reboot: %w", err)
	}
	s.bootID = id
	if err := os.Remove(filepath.Join(s.cfg.StateDir, SimulatedRebootRequiredFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("simulated reboot: removing the reboot-required flag failed", "err", err)
	}
	s.recordLocked(Action{Verb: "reboot"})
	s.log.Info("simulated reboot (nothing rebooted)", "from", before, "to", id)
	return nil
}

// OSRelease reads SimulatedOSReleaseFile when present, else the host's.
func (s *Simulated) OSRelease() (string, string, error) {
	path := filepath.Join(s.cfg.StateDir, SimulatedOSReleaseFile)
	rel, err := host.Paths{OSReleaseFile: path}.OSRelease()
	if errors.Is(err, fs.ErrNotExist) {
		rel, err = s.cfg.Paths.OSRelease()
	}
	if err != nil {
		return "", "", fmt.Errorf("hostops: simulated os-release: %w", err)
	}
	kernel := rel.Fields[SimulatedKernelKey]
	if kernel == "" {
		if kernel, err = s.cfg.Paths.KernelRelease(); err != nil {
			return "", "", fmt.Errorf("hostops: simulated kernel release: %w", err)
		}
	}
	return rel.VersionID, kernel, nil
}

// RebootRequired reports whether SimulatedRebootRequiredFile exists.
func (s *Simulated) RebootRequired() bool {
	_, err := os.Stat(filepath.Join(s.cfg.StateDir, SimulatedRebootRequiredFile))
	return err == nil
}

// RunTransient records the unit and succeeds.
func (s *Simulated) RunTransient(ctx context.Context, unit string, argv, env []string, timeout time.Duration) error {
	if len(argv) == 0 {
		return fmt.Errorf("hostops: transient unit %s: empty command", unit)
	}
	s.record(Action{Verb: "run-transient", Unit: unit, Args: argv, Env: env})
	s.log.Info("simulated transient unit (nothing run)", "unit", unit, "cmd", strings.Join(argv, " "), "timeout", timeout)
	return ctx.Err()
}

// Run records the command and succeeds with no output.
func (s *Simulated) Run(ctx context.Context, argv, env []string, timeout time.Duration) (string, error) {
	if len(argv) == 0 {
		return "", errors.New("hostops: run: empty command")
	}
	s.record(Action{Verb: "run", Args: argv, Env: env})
	s.log.Info("simulated command (nothing run)", "cmd", strings.Join(argv, " "), "timeout", timeout)
	return "", ctx.Err()
}

// Inhibit records the lock and returns a release that records its release.
func (s *Simulated) Inhibit(ctx context.Context, what, why string) (func(), error) {
	s.record(Action{Verb: "inhibit", Args: []string{what, why}})
	s.log.Info("simulated block lock (none taken)", "what", what, "why", why)
	var once sync.Once
	return func() {
		once.Do(func() {
			s.record(Action{Verb: "release", Args: []string{what, why}})
			s.log.Info("simulated block lock released", "what", what)
		})
	}, nil
}

// StopUnits records the units.
// UnitActive: a simulated transient unit ends with its RunTransient call.
func (s *Simulated) UnitActive(ctx context.Context, unit string) (bool, error) { return false, nil }

func (s *Simulated) StopUnits(ctx context.Context, units ...string) error {
	s.record(Action{Verb: "stop-units", Args: units})
	s.log.Info("simulated systemctl stop (nothing stopped)", "units", strings.Join(units, " "))
	return ctx.Err()
}

// StartUnits records the units.
func (s *Simulated) StartUnits(ctx context.Context, units ...string) error {
	s.record(Action{Verb: "start-units", Args: units})
	s.log.Info("simulated systemctl start (nothing started)", "units", strings.Join(units, " "))
	return ctx.Err()
}

// Actions returns the recorded actions, oldest first.
func (s *Simulated) Actions() []Action {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.actions)
}

func (s *Simulated) record(a Action) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recordLocked(a)
}

func (s *Simulated) recordLocked(a Action) {
	a.At = s.clock.Now()
	a.Args, a.Env = slices.Clone(a.Args), slices.Clone(a.Env)
	s.actions = append(s.actions, a)
	if over := len(s.actions) - s.cfg.MaxActions; over > 0 {
		s.actions = slices.Delete(s.actions, 0, over)
	}
}

// newUUID returns a random (version 4) UUID in the boot ID's form.
func newUUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
