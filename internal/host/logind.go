package host

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/godbus/dbus/v5"
	"k8s.io/utils/clock"
)

// Inhibit modes understood by logind.
const (
	// ModeDelay delays shutdown until the lock is released or
	// InhibitDelayMaxSec passes.
	ModeDelay = "delay"
	// ModeBlock blocks shutdown while the lock is held. Root's
	// Reboot(false) and PowerOff(false) ignore block locks.
	ModeBlock = "block"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultCallTimeout   = 25 * time.Second
	DefaultReconnectMin  = 500 * time.Millisecond
	DefaultReconnectMax  = 30 * time.Second
	DefaultLogindConfDir = "/etc/systemd/logind.conf.d"
)

const (
	logindUnit            = "systemd-logind.service"
	dropInName            = "99-lifecycle-agent.conf" // sorts after the kubelet's
	kubeletDropInName     = "99-kubelet.conf"
	prepareForShutdownSig = login1Manager + ".PrepareForShutdown"
)

// Config configures a Logind. The zero value talks to the system bus with a
// real clock and discards logs.
type Config struct {
	// Address is the D-Bus address of the system bus. Empty means
	// $DBUS_SYSTEM_BUS_ADDRESS, else DefaultSystemBusAddress.
	Address string
	// Logger receives the client's logs. Nil discards them.
	Logger *slog.Logger
	// Clock times reconnect backoff. Nil means the real clock.
	Clock clock.Clock
	// CallTimeout bounds a D-Bus call whose context has no deadline.
	// Zero means DefaultCallTimeout.
	CallTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the exponential backoff between
	// reconnect attempts of a signal subscription. Zero means
	// DefaultReconnectMin and DefaultReconnectMax.
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	// LogindConfDir is the drop-in directory written by EnsureInhibitDelay.
	// Empty means DefaultLogindConfDir.
	LogindConfDir string
}

// Logind is a client of systemd-logind (and, for the drop-in reload, of the
// systemd manager) over D-Bus. It is safe for concurrent use.
//
// Method calls share one connection, dialled on first use and re-dialled
// after it is lost. Each WatchPrepareForShutdown subscription has its own
// connection, which it re-establishes on loss.
type Logind struct {
	cfg    Config
	log    *slog.Logger
	clock  clock.Clock
	dial   dialFunc
	closed chan struct{}

	mu       sync.Mutex
	conn     transport // nil until first use or after loss
	isClosed bool
	watchers sync.WaitGroup // running watch loops; Add under mu
}

// New returns a Logind for cfg. It does not connect: the first call does,
// so a missing bus shows up as that call's error.
func New(cfg Config) (*Logind, error) {
	if cfg.Address == "" {
		cfg.Address = systemBusAddress()
	}
	return newLogind(cfg, dialBus(cfg.Address))
}

// newLogind is New with the transport seam exposed, for unit tests.
func newLogind(cfg Config, dial dialFunc) (*Logind, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = DefaultReconnectMin
	}
	if cfg.ReconnectMax <= 0 {
		cfg.ReconnectMax = DefaultReconnectMax
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		return nil, fmt.Errorf("%w: ReconnectMax %s below ReconnectMin %s", ErrInvalidArgument, cfg.ReconnectMax, cfg.ReconnectMin)
	}
	if cfg.LogindConfDir == "" {
		cfg.LogindConfDir = DefaultLogindConfDir
	}
	return &Logind{
		cfg:    cfg,
		log:    cfg.Logger,
		clock:  cfg.Clock,
		dial:   dial,
		closed: make(chan struct{}),
	}, nil
}

// Close closes the shared connection, ends every subscription (closing
// its channel) and waits for their goroutines. Locks already taken stay
// held until released: they do not depend on the bus connection.
func (l *Logind) Close() error {
	l.mu.Lock()
	if l.isClosed {
		l.mu.Unlock()
		return nil
	}
	l.isClosed = true
	close(l.closed)
	var err error
	if l.conn != nil {
		if cerr := l.conn.close(); cerr != nil {
			err = fmt.Errorf("host: close bus connection: %w", cerr)
		}
		l.conn = nil
	}
	l.mu.Unlock()
	l.watchers.Wait()
	return err
}

// transport returns the shared connection, dialling a new one when there is
// none or the previous one was lost.
func (l *Logind) transport(ctx context.Context) (transport, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isClosed {
		return nil, ErrClosed
	}
	if l.conn != nil {
		select {
		case <-l.conn.done():
			l.log.Warn("bus connection lost; redialling", "address", l.cfg.Address)
			_ = l.conn.close()
			l.conn = nil
		default:
			return l.conn, nil
		}
	}
	t, err := l.dial(ctx)
	if err != nil {
		return nil, err
	}
	l.conn = t
	return t, nil
}

// withTimeout applies CallTimeout to a context without a deadline.
func (l *Logind) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, l.cfg.CallTimeout)
}

// call runs one method call on the shared connection.
func (l *Logind) call(ctx context.Context, dest string, path dbus.ObjectPath, method string, args ...any) ([]any, error) {
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	t, err := l.transport(ctx)
	if err != nil {
		return nil, err
	}
	return t.call(ctx, dest, path, method, args...)
}

// InhibitLock is a logind inhibitor lock: an open file descriptor that
// logind watches. The lock is held exactly as long as the descriptor is
// open, in this process or any process it leaked to.
//
// Keep the *InhibitLock reachable until Release: the descriptor is owned by
// an *os.File, which the runtime closes when it is garbage collected, and
// that silently releases the lock.
type InhibitLock struct {
	What string
	Who  string
	Why  string
	Mode string

	mu       sync.Mutex
	file     *os.File // live reference; nil after Release
	released *atomic.Bool
}

// Release closes the lock's descriptor, releasing the lock. It is safe to
// call more than once and from several goroutines; only the first call
// closes.
func (k *InhibitLock) Release() error {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.file == nil {
		return nil
	}
	f := k.file
	k.file = nil
	k.released.Store(true)
	if err := f.Close(); err != nil {
		return fmt.Errorf("host: release %s lock on %q: %w", k.Mode, k.What, err)
	}
	return nil
}

// Held reports whether Release has not yet been called.
func (k *InhibitLock) Held() bool {
	if k == nil {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.file != nil
}

// Inhibit takes a logind inhibitor lock. what is a colon-separated list
// ("shutdown", "shutdown:sleep"), mode is ModeDelay or ModeBlock.
func (l *Logind) Inhibit(ctx context.Context, what, who, why, mode string) (*InhibitLock, error) {
	if mode != ModeDelay && mode != ModeBlock {
		return nil, fmt.Errorf("host: inhibit %q: %w %q (want %q or %q)", what, ErrInvalidInhibitMode, mode, ModeDelay, ModeBlock)
	}
	if what == "" || who == "" || why == "" {
		return nil, fmt.Errorf("host: inhibit: %w: what, who and why must be set", ErrInvalidArgument)
	}
	body, err := l.call(ctx, login1Dest, login1Path, login1Manager+".Inhibit", what, who, why, mode)
	if err != nil {
		return nil, fmt.Errorf("host: inhibit %s %q: %w", mode, what, err)
	}
	if len(body) != 1 {
		closeUnixFDs(body)
		return nil, fmt.Errorf("host: inhibit %s %q: %w", mode, what, ErrNoInhibitFD)
	}
	fd, ok := body[0].(dbus.UnixFD)
	if !ok {
		return nil, fmt.Errorf("host: inhibit %s %q: %w (got %T)", mode, what, ErrNoInhibitFD, body[0])
	}
	// Go receives descriptors with MSG_CMSG_CLOEXEC; set it again so that a
	// command we exec can never inherit, and so keep, our lock.
	syscall.CloseOnExec(int(fd))
	lock := &InhibitLock{
		What:     what,
		Who:      who,
		Why:      why,
		Mode:     mode,
		file:     os.NewFile(uintptr(fd), "logind-inhibit-"+strings.ReplaceAll(what, ":", "-")),
		released: new(atomic.Bool),
	}
	// Diagnose the lost-reference bug: the lock was collected while held.
	log := l.log
	runtime.AddCleanup(lock, func(released *atomic.Bool) {
		if !released.Load() {
			log.Error("inhibitor lock garbage-collected without Release; logind sees it released", "what", what, "mode", mode)
		}
	}, lock.released)
	l.log.Info("inhibitor lock taken", "what", what, "mode", mode, "who", who)
	return lock, nil
}

// Reboot asks logind to reboot now (Manager.Reboot(interactive=false)) and
// returns logind's error, if any.
//
// Logind lets root's non-interactive Reboot through block inhibitors, and
// waits out delay inhibitors. Release this process's own delay and block
// locks before calling (after the journal records the reboot intent), so
// logind does not wait InhibitDelayMaxSec on us. Nothing here relies on
// logind refusing a reboot because of inhibitors (--check-inhibitors
// semantics).
func (l *Logind) Reboot(ctx context.Context) error {
	if _, err := l.call(ctx, login1Dest, login1Path, login1Manager+".Reboot", false); err != nil {
		return fmt.Errorf("host: logind reboot: %w", err)
	}
	l.log.Info("reboot requested from logind")
	return nil
}

// PowerOff is Reboot's twin for Manager.PowerOff(false); the same rules on
// our own locks apply.
func (l *Logind) PowerOff(ctx context.Context) error {
	if _, err := l.call(ctx, login1Dest, login1Path, login1Manager+".PowerOff", false); err != nil {
		return fmt.Errorf("host: logind power off: %w", err)
	}
	l.log.Info("power-off requested from logind")
	return nil
}

// InhibitDelayMax reads logind's InhibitDelayMaxUSec: how long a delay lock
// can hold up a shutdown. An infinite value is returned as the largest
// time.Duration.
func (l *Logind) InhibitDelayMax(ctx context.Context) (time.Duration, error) {
	d, err := l.inhibitDelayMax(ctx)
	if err != nil {
		return 0, fmt.Errorf("host: %w", err)
	}
	return d, nil
}

func (l *Logind) inhibitDelayMax(ctx context.Context) (time.Duration, error) {
	v, err := l.property(ctx, "InhibitDelayMaxUSec")
	if err != nil {
		return 0, fmt.Errorf("read InhibitDelayMaxUSec: %w", err)
	}
	usec, ok := v.Value().(uint64)
	if !ok {
		return 0, fmt.Errorf("read InhibitDelayMaxUSec: %w: type %s", ErrUnexpectedReply, v.Signature())
	}
	return usecToDuration(usec), nil
}

// PreparingForShutdown reads logind's PreparingForShutdown property: true
// between PrepareForShutdown(true) and the shutdown or its cancellation.
func (l *Logind) PreparingForShutdown(ctx context.Context) (bool, error) {
	v, err := l.property(ctx, "PreparingForShutdown")
	if err != nil {
		return false, fmt.Errorf("host: read PreparingForShutdown: %w", err)
	}
	b, ok := v.Value().(bool)
	if !ok {
		return false, fmt.Errorf("host: read PreparingForShutdown: %w: type %s", ErrUnexpectedReply, v.Signature())
	}
	return b, nil
}

func (l *Logind) property(ctx context.Context, name string) (dbus.Variant, error) {
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	t, err := l.transport(ctx)
	if err != nil {
		return dbus.Variant{}, err
	}
	return t.getProperty(ctx, login1Dest, login1Path, login1Manager, name)
}

// Inhibitor is one entry of logind's ListInhibitors.
type Inhibitor struct {
	What string
	Who  string
	Why  string
	Mode string
	UID  uint32
	PID  uint32
}

// ListInhibitors returns the inhibitor locks logind currently knows of.
func (l *Logind) ListInhibitors(ctx context.Context) ([]Inhibitor, error) {
	body, err := l.call(ctx, login1Dest, login1Path, login1Manager+".ListInhibitors")
	if err != nil {
		return nil, fmt.Errorf("host: list inhibitors: %w", err)
	}
	var out []Inhibitor
	if err := dbus.Store(body, &out); err != nil {
		return nil, fmt.Errorf("host: list inhibitors: %w: %w", ErrUnexpectedReply, err)
	}
	return out, nil
}

// usecToDuration converts a systemd usec_t, saturating; UINT64_MAX is
// systemd's infinity.
func usecToDuration(usec uint64) time.Duration {
	if usec > uint64(math.MaxInt64/int64(time.Microsecond)) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(usec) * time.Microsecond
}
