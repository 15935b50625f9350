package logindtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/introspect"
	"github.com/godbus/dbus/v5/prop"
)

// D-Bus names served by the fake.
const (
	Login1Name      = "org.freedesktop.login1"
	Login1Path      = dbus.ObjectPath("/org/freedesktop/login1")
	Login1Manager   = "org.freedesktop.login1.Manager"
	Systemd1Name    = "org.freedesktop.systemd1"
	Systemd1Path    = dbus.ObjectPath("/org/freedesktop/systemd1")
	Systemd1Manager = "org.freedesktop.systemd1.Manager"

	// DefaultInhibitDelayMax is logind's built-in default.
	DefaultInhibitDelayMax = 5 * time.Second

	startTimeout = 10 * time.Second
	maxSocketLen = 100 // sun_path is 108 bytes
)

// ErrNoDBusDaemon is returned by New when dbus-daemon is not installed.
var ErrNoDBusDaemon = errors.New("logindtest: dbus-daemon not found: install the Debian package dbus (apt-get install -y dbus)")

// Options configures a Server. The zero value is usable.
type Options struct {
	// InhibitDelayMax is the initial InhibitDelayMaxUSec; zero means
	// DefaultInhibitDelayMax.
	InhibitDelayMax time.Duration
	// ConfDir, when set, is read on KillUnit("systemd-logind.service",
	// "all", SIGHUP): the last InhibitDelayMaxSec of its *.conf files, in
	// name order, becomes InhibitDelayMaxUSec.
	ConfDir string
	// DBusDaemon is the dbus-daemon binary; empty means looked up in PATH.
	DBusDaemon string
}

// Inhibitor is one lock handed out by the fake.
type Inhibitor struct {
	ID     int // 0, 1, ... in order of Inhibit calls
	What   string
	Who    string
	Why    string
	Mode   string
	Sender string // the caller's unique bus name
	// Released is set when the fake read EOF on the lock's pipe.
	Released bool
}

// KillUnitCall is one recorded systemd1 Manager.KillUnit.
type KillUnitCall struct {
	Unit   string
	Mode   string
	Signal int32
}

type inhibitor struct {
	Inhibitor
	r    *os.File      // read end, owned by the watching goroutine
	done chan struct{} // closed when the watcher returned
}

// Server is a fake logind on a private bus. Its methods are safe for
// concurrent use.
type Server struct {
	opts    Options
	daemon  string
	dir     string
	ownDir  bool
	sock    string
	cfgPath string

	mu        sync.Mutex
	closed    bool
	cmd       *exec.Cmd
	exited    chan struct{} // closed when cmd exited
	stderr    *lockedBuffer
	conn      *dbus.Conn
	props     *prop.Properties
	delayMax  time.Duration
	preparing bool
	inhib     []*inhibitor
	reboots   []bool
	powerOffs []bool
	killUnits []KillUnitCall
	errs      map[string]*dbus.Error // method → error to return
	changed   chan struct{}          // closed and replaced on every change
}

// Start starts a Server for a test and registers its Close with t.Cleanup.
// It fails the test (never skips) when dbus-daemon is missing.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	dir := t.TempDir()
	if len(filepath.Join(dir, "bus")) > maxSocketLen || !plainAddress(dir) {
		dir = "" // New makes a short one and removes it on Close.
	}
	s, err := New(dir, opts)
	if err != nil {
		t.Fatalf("logindtest: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("logindtest: close: %v", err)
		}
	})
	return s
}

// plainAddress reports whether path needs no escaping in a D-Bus address
// (a test name such as "kill@947ms" makes t.TempDir hold an '@').
func plainAddress(path string) bool {
	for _, r := range path {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_/.\\*", r)) {
			return false
		}
	}
	return true
}

// New starts a Server whose socket and configuration live in dir (empty: a
// new temporary directory, removed by Close). Close it when done.
func New(dir string, opts Options) (*Server, error) {
	daemon := opts.DBusDaemon
	if daemon == "" {
		daemon = "dbus-daemon"
	}
	daemon, err := exec.LookPath(daemon)
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", ErrNoDBusDaemon, err)
	}
	s := &Server{
		opts:     opts,
		daemon:   daemon,
		dir:      dir,
		delayMax: opts.InhibitDelayMax,
		errs:     map[string]*dbus.Error{},
		changed:  make(chan struct{}),
	}
	if s.delayMax <= 0 {
		s.delayMax = DefaultInhibitDelayMax
	}
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "logindtest-"); err != nil {
			return nil, fmt.Errorf("logindtest: %w", err)
		}
		s.ownDir = true
	}
	s.sock = filepath.Join(s.dir, "bus")
	if len(s.sock) > maxSocketLen {
		s.cleanupDir()
		return nil, fmt.Errorf("logindtest: socket path %s is longer than %d bytes; use a shorter directory", s.sock, maxSocketLen)
	}
	s.cfgPath = filepath.Join(s.dir, "bus.conf")
	if err := os.WriteFile(s.cfgPath, busConfig(s.sock), 0o600); err != nil {
		s.cleanupDir()
		return nil, fmt.Errorf("logindtest: write bus config: %w", err)
	}
	if err := s.StartBus(); err != nil {
		s.cleanupDir()
		return nil, err
	}
	return s, nil
}

func (s *Server) cleanupDir() {
	if s.ownDir {
		_ = os.RemoveAll(s.dir)
	}
}

// busConfig is a dbus-daemon configuration: one unix socket, EXTERNAL
// authentication, everything allowed.
func busConfig(sock string) []byte {
	var esc bytes.Buffer
	_ = xml.EscapeText(&esc, []byte(sock))
	return []byte(`<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>custom</type>
  <listen>unix:path=` + esc.String() + `</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
`)
}

// Address is the bus address to dial, stable across RestartBus.
func (s *Server) Address() string { return "unix:path=" + s.sock }

// StartBus starts the dbus-daemon and connects the fake to it. New calls
// it; call it again after KillBus.
func (s *Server) StartBus() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("logindtest: server closed")
	}
	if s.cmd != nil {
		return errors.New("logindtest: bus already running")
	}
	_ = os.Remove(s.sock) // left behind by a killed daemon
	addr := make(chan string, 1)
	cmd := exec.Command(s.daemon, "--nofork", "--print-address=1", "--config-file="+s.cfgPath)
	cmd.Stdout = &firstLine{ch: addr}
	s.stderr = &lockedBuffer{}
	cmd.Stderr = s.stderr
	// Do not outlive a test binary that crashes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("logindtest: start dbus-daemon: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case <-addr:
	case <-exited:
		return fmt.Errorf("logindtest: dbus-daemon exited at start: %s", strings.TrimSpace(s.stderr.String()))
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("logindtest: dbus-daemon printed no address within %s: %s", startTimeout, strings.TrimSpace(s.stderr.String()))
	}
	s.cmd, s.exited = cmd, exited
	if err := s.connectLocked(); err != nil {
		s.killLocked()
		return err
	}
	return nil
}

// KillBus kills the dbus-daemon (SIGKILL): every client connection sees
// EOF. Inhibitor locks stay as they are.
func (s *Server) KillBus() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("logindtest: bus not running")
	}
	s.killLocked()
	return nil
}

// RestartBus is KillBus then StartBus, at the same address.
func (s *Server) RestartBus() error {
	if err := s.KillBus(); err != nil {
		return err
	}
	return s.StartBus()
}

func (s *Server) killLocked() {
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn, s.props = nil, nil
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd, s.exited = nil, nil
	_ = os.Remove(s.sock)
}

// connectLocked connects the fake to the bus, exports its objects and takes
// its names.
func (s *Server) connectLocked() error {
	conn, err := dbus.Connect(s.Address(), dbus.WithIncomingInterceptor(interceptInhibit))
	if err != nil {
		return fmt.Errorf("logindtest: connect fake to bus: %w", err)
	}
	fail := func(op string, err error) error {
		_ = conn.Close()
		return fmt.Errorf("logindtest: %s: %w", op, err)
	}
	props, err := prop.Export(conn, Login1Path, prop.Map{Login1Manager: {
		"InhibitDelayMaxUSec":  {Value: uint64(s.delayMax.Microseconds()), Emit: prop.EmitFalse},
		"PreparingForShutdown": {Value: s.preparing, Emit: prop.EmitFalse},
	}})
	if err != nil {
		return fail("export properties", err)
	}
	if err := conn.Export(&login1{s: s, conn: conn}, Login1Path, Login1Manager); err != nil {
		return fail("export login1", err)
	}
	node := &introspect.Node{
		Name: string(Login1Path),
		Interfaces: []introspect.Interface{
			introspect.IntrospectData,
			prop.IntrospectData,
			{
				Name:       Login1Manager,
				Methods:    login1Methods,
				Signals:    []introspect.Signal{{Name: "PrepareForShutdown", Args: []introspect.Arg{{Name: "start", Type: "b"}}}},
				Properties: props.Introspection(Login1Manager),
			},
		},
	}
	if err := conn.Export(introspect.NewIntrospectable(node), Login1Path, "org.freedesktop.DBus.Introspectable"); err != nil {
		return fail("export introspection", err)
	}
	if err := conn.Export(&systemd1{s: s}, Systemd1Path, Systemd1Manager); err != nil {
		return fail("export systemd1", err)
	}
	sdNode := &introspect.Node{
		Name: string(Systemd1Path),
		Interfaces: []introspect.Interface{introspect.IntrospectData, {
			Name: Systemd1Manager,
			Methods: []introspect.Method{{Name: "KillUnit", Args: []introspect.Arg{
				{Name: "name", Type: "s", Direction: "in"},
				{Name: "whom", Type: "s", Direction: "in"},
				{Name: "signal", Type: "i", Direction: "in"},
			}}},
		}},
	}
	if err := conn.Export(introspect.NewIntrospectable(sdNode), Systemd1Path, "org.freedesktop.DBus.Introspectable"); err != nil {
		return fail("export systemd1 introspection", err)
	}
	for _, name := range []string{Login1Name, Systemd1Name} {
		reply, err := conn.RequestName(name, dbus.NameFlagDoNotQueue)
		if err != nil {
			return fail("request name "+name, err)
		}
		if reply != dbus.RequestNameReplyPrimaryOwner {
			return fail("request name "+name, fmt.Errorf("reply %d", reply))
		}
	}
	s.conn, s.props = conn, props
	return nil
}

var login1Methods = []introspect.Method{
	{Name: "Inhibit", Args: []introspect.Arg{
		{Name: "what", Type: "s", Direction: "in"},
		{Name: "who", Type: "s", Direction: "in"},
		{Name: "why", Type: "s", Direction: "in"},
		{Name: "mode", Type: "s", Direction: "in"},
		{Name: "pipe_fd", Type: "h", Direction: "out"},
	}},
	{Name: "ListInhibitors", Args: []introspect.Arg{{Name: "inhibitors", Type: "a(ssssuu)", Direction: "out"}}},
	{Name: "Reboot", Args: []introspect.Arg{{Name: "interactive", Type: "b", Direction: "in"}}},
	{Name: "PowerOff", Args: []introspect.Arg{{Name: "interactive", Type: "b", Direction: "in"}}},
}

// interceptInhibit runs in godbus's reader goroutine before an incoming
// call is dispatched, on the same *Message the handler goroutine gets. For
// Inhibit it sets NoReplyExpected so that godbus sends no reply of its own:
// login1.Inhibit sends the reply itself, and can then close its copy of the
// descriptor as soon as the write returned. godbus never closes a
// descriptor it sent, and a fixed delay instead would either leave the
// lock held (too long) or close it before it was sent (too short).
func interceptInhibit(msg *dbus.Message) {
	if msg.Type != dbus.TypeMethodCall {
		return
	}
	member, _ := msg.Headers[dbus.FieldMember].Value().(string)
	iface, _ := msg.Headers[dbus.FieldInterface].Value().(string)
	path, _ := msg.Headers[dbus.FieldPath].Value().(dbus.ObjectPath)
	if member == "Inhibit" && iface == Login1Manager && path == Login1Path {
		msg.Flags |= dbus.FlagNoReplyExpected
	}
}

// login1 is the exported org.freedesktop.login1.Manager of one connection.
type login1 struct {
	s    *Server
	conn *dbus.Conn
}

func (m *login1) Inhibit(msg dbus.Message, sender dbus.Sender, what, who, why, mode string) *dbus.Error {
	return m.s.inhibit(m.conn, msg, string(sender), what, who, why, mode)
}

// ListInhibitors returns the locks not yet released. UID and PID are the
// fake's own.
func (m *login1) ListInhibitors() ([]struct {
	What, Who, Why, Mode string
	UID, PID             uint32
}, *dbus.Error) {
	var out []struct {
		What, Who, Why, Mode string
		UID, PID             uint32
	}
	for _, in := range m.s.Inhibitors() {
		if !in.Released {
			out = append(out, struct {
				What, Who, Why, Mode string
				UID, PID             uint32
			}{in.What, in.Who, in.Why, in.Mode, uint32(os.Getuid()), uint32(os.Getpid())})
		}
	}
	return out, nil
}

func (m *login1) Reboot(interactive bool) *dbus.Error {
	return m.s.record("Reboot", func() { m.s.reboots = append(m.s.reboots, interactive) })
}

func (m *login1) PowerOff(interactive bool) *dbus.Error {
	return m.s.record("PowerOff", func() { m.s.powerOffs = append(m.s.powerOffs, interactive) })
}

// systemd1 is the exported org.freedesktop.systemd1.Manager.
type systemd1 struct{ s *Server }

func (m *systemd1) KillUnit(name, mode string, signal int32) *dbus.Error {
	if derr := m.s.record("KillUnit", func() {
		m.s.killUnits = append(m.s.killUnits, KillUnitCall{Unit: name, Mode: mode, Signal: signal})
	}); derr != nil {
		return derr
	}
	if name == "systemd-logind.service" && syscall.Signal(signal) == syscall.SIGHUP && m.s.opts.ConfDir != "" {
		d, err := readConfDir(m.s.opts.ConfDir)
		if err != nil {
			return dbus.MakeFailedError(err)
		}
		if d > 0 {
			m.s.SetInhibitDelayMax(d)
		}
	}
	return nil
}

// record runs add under the lock unless an error is set for method, which
// is then returned. Failed calls are not recorded.
func (s *Server) record(method string, add func()) *dbus.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if derr := s.errs[method]; derr != nil {
		return derr
	}
	add()
	s.changedLocked()
	return nil
}

var validWhat = []string{"shutdown", "sleep", "idle", "handle-power-key", "handle-suspend-key", "handle-hibernate-key", "handle-lid-switch", "handle-reboot-key"}

func (s *Server) inhibit(conn *dbus.Conn, msg dbus.Message, sender, what, who, why, mode string) *dbus.Error {
	if mode != "delay" && mode != "block" {
		return dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{"Invalid mode specification " + mode})
	}
	for _, w := range strings.Split(what, ":") {
		if !slices.Contains(validWhat, w) {
			return dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{"Invalid what specification " + what})
		}
	}
	if mode == "delay" && strings.Contains(what, "handle-") {
		return dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{"Delay inhibitors only supported for shutdown and sleep"})
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return dbus.MakeFailedError(errors.New("logindtest: server closed"))
	}
	if derr := s.errs["Inhibit"]; derr != nil {
		s.mu.Unlock()
		return derr
	}
	// Raw descriptors: the write end is only ever touched here, the read
	// end only by its watcher (through *os.File), so no Fd() races Close.
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		s.mu.Unlock()
		return dbus.MakeFailedError(fmt.Errorf("pipe: %w", err))
	}
	if err := syscall.SetNonblock(p[0], true); err != nil {
		s.mu.Unlock()
		_ = syscall.Close(p[0])
		_ = syscall.Close(p[1])
		return dbus.MakeFailedError(fmt.Errorf("pipe: %w", err))
	}
	in := &inhibitor{
		Inhibitor: Inhibitor{ID: len(s.inhib), What: what, Who: who, Why: why, Mode: mode, Sender: sender},
		r:         os.NewFile(uintptr(p[0]), "inhibit-read"),
		done:      make(chan struct{}),
	}
	s.inhib = append(s.inhib, in)
	s.changedLocked()
	s.mu.Unlock()
	go s.watch(in)

	reply := &dbus.Message{
		Type: dbus.TypeMethodReply,
		Headers: map[dbus.HeaderField]dbus.Variant{
			dbus.FieldReplySerial: dbus.MakeVariant(msg.Serial()),
			dbus.FieldSignature:   dbus.MakeVariant(dbus.SignatureOf(dbus.UnixFD(0))),
		},
		Body: []any{dbus.UnixFD(p[1])},
	}
	if sender != "" {
		reply.Headers[dbus.FieldDestination] = dbus.MakeVariant(sender)
	}
	// For a reply, Send writes synchronously and returns after the write:
	// the descriptor is in the socket buffer and our copy can go.
	conn.Send(reply, nil)
	_ = syscall.Close(p[1])
	return nil
}

// watch reads the lock's pipe until EOF (every write end closed: released)
// or until Close closes the read end.
func (s *Server) watch(in *inhibitor) {
	defer close(in.done)
	var buf [64]byte
	for {
		_, err := in.r.Read(buf[:])
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			s.mu.Lock()
			in.Released = true
			s.changedLocked()
			s.mu.Unlock()
			_ = in.r.Close()
		}
		return
	}
}

func (s *Server) changedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// wait blocks until cond (called with the lock held) is true or ctx ends.
func (s *Server) wait(ctx context.Context, cond func() bool) error {
	for {
		s.mu.Lock()
		ok, ch := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Inhibitors returns every lock handed out so far, released or not.
func (s *Server) Inhibitors() []Inhibitor {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Inhibitor, len(s.inhib))
	for i, in := range s.inhib {
		out[i] = in.Inhibitor
	}
	return out
}

// WaitInhibitors waits until at least n locks were handed out and returns
// them all.
func (s *Server) WaitInhibitors(ctx context.Context, n int) ([]Inhibitor, error) {
	err := s.wait(ctx, func() bool { return len(s.inhib) >= n })
	if err != nil {
		return nil, fmt.Errorf("logindtest: wait for %d inhibitors (have %d): %w", n, len(s.Inhibitors()), err)
	}
	return s.Inhibitors(), nil
}

// WaitReleased waits until the lock with the given ID was released.
func (s *Server) WaitReleased(ctx context.Context, id int) error {
	err := s.wait(ctx, func() bool { return id < len(s.inhib) && s.inhib[id].Released })
	if err != nil {
		return fmt.Errorf("logindtest: wait for inhibitor %d to be released: %w", id, err)
	}
	return nil
}

// Reboots returns the interactive argument of every successful Reboot.
func (s *Server) Reboots() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reboots)
}

// PowerOffs returns the interactive argument of every successful PowerOff.
func (s *Server) PowerOffs() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.powerOffs)
}

// KillUnits returns every successful KillUnit call.
func (s *Server) KillUnits() []KillUnitCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.killUnits)
}

// SetError makes method ("Inhibit", "Reboot", "PowerOff", "KillUnit")
// return the D-Bus error name with message; an empty name clears it.
func (s *Server) SetError(method, name, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name == "" {
		delete(s.errs, method)
		return
	}
	s.errs[method] = dbus.NewError(name, []any{message})
}

// InhibitDelayMax returns the current InhibitDelayMaxUSec.
func (s *Server) InhibitDelayMax() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.delayMax
}

// SetInhibitDelayMax changes InhibitDelayMaxUSec.
func (s *Server) SetInhibitDelayMax(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delayMax = d
	if s.props != nil {
		s.props.SetMust(Login1Manager, "InhibitDelayMaxUSec", uint64(d.Microseconds()))
	}
	s.changedLocked()
}

// SetPreparingForShutdown sets the PreparingForShutdown property without
// emitting the signal, as if the signal had been missed.
func (s *Server) SetPreparingForShutdown(active bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setPreparingLocked(active)
}

func (s *Server) setPreparingLocked(active bool) {
	s.preparing = active
	if s.props != nil {
		s.props.SetMust(Login1Manager, "PreparingForShutdown", active)
	}
	s.changedLocked()
}

// EmitPrepareForShutdown sets PreparingForShutdown and emits the
// PrepareForShutdown(active) signal, as logind does when a shutdown starts
// (true) or is cancelled (false).
func (s *Server) EmitPrepareForShutdown(active bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return errors.New("logindtest: emit PrepareForShutdown: bus not running")
	}
	s.setPreparingLocked(active)
	if err := s.conn.Emit(Login1Path, Login1Manager+".PrepareForShutdown", active); err != nil {
		return fmt.Errorf("logindtest: emit PrepareForShutdown: %w", err)
	}
	return nil
}

// Close stops the bus, stops watching the locks and removes the directory
// New created. Locks still held by clients are left to them.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.cmd != nil {
		s.killLocked()
	}
	inhib := slices.Clone(s.inhib)
	s.mu.Unlock()
	for _, in := range inhib {
		_ = in.r.Close() // ends the watcher; harmless if it closed already
		<-in.done
	}
	s.cleanupDir()
	return nil
}

// readConfDir returns the InhibitDelayMaxSec logind would use from the
// *.conf drop-ins in dir: the last assignment in name order wins (0 when
// there is none). Only that value is parsed, and only whole seconds with an
// optional "s" are understood.
func readConfDir(dir string) (time.Duration, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.conf"))
	if err != nil {
		return 0, err
	}
	sort.Strings(paths)
	var last, from string
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "InhibitDelayMaxSec="); ok {
				last, from = strings.TrimSpace(v), p
			}
		}
	}
	if from == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(strings.TrimSuffix(last, "s"), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%s: InhibitDelayMaxSec=%s: %w", from, last, err)
	}
	return time.Duration(n) * time.Second, nil
}

// firstLine sends the first line written to it on ch and discards the rest.
type firstLine struct {
	mu   sync.Mutex
	buf  []byte
	sent bool
	ch   chan<- string
}

func (f *firstLine) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sent {
		return len(p), nil
	}
	f.buf = append(f.buf, p...)
	if i := bytes.IndexByte(f.buf, '\n'); i >= 0 {
		f.ch <- string(f.buf[:i])
		f.sent = true
		f.buf = nil
	}
	return len(p), nil
}

// lockedBuffer collects dbus-daemon's stderr for error messages.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
