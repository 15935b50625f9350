package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/godbus/dbus/v5"
)

// D-Bus names used by this package.
const (
	login1Dest      = "org.freedesktop.login1"
	login1Path      = dbus.ObjectPath("/org/freedesktop/login1")
	login1Manager   = "org.freedesktop.login1.Manager"
	systemd1Dest    = "org.freedesktop.systemd1"
	systemd1Path    = dbus.ObjectPath("/org/freedesktop/systemd1")
	systemd1Manager = "org.freedesktop.systemd1.Manager"
	propertiesIface = "org.freedesktop.DBus.Properties"

	// DefaultSystemBusAddress is used when neither Config.Address nor the
	// DBUS_SYSTEM_BUS_ADDRESS environment variable is set.
	DefaultSystemBusAddress = "unix:path=/run/dbus/system_bus_socket"
)

// transport is the lower seam: one connection to a message bus. It is
// unexported; callers use the verbs of Logind and own their own verb-level
// interfaces. The godbus implementation is busConn; unit tests use a
// hand-written fake.
type transport interface {
	// call invokes method ("interface.Member") on dest at path and returns
	// the reply body. A D-Bus error reply is returned as *BusError.
	call(ctx context.Context, dest string, path dbus.ObjectPath, method string, args ...any) ([]any, error)
	// getProperty reads iface.name through org.freedesktop.DBus.Properties.
	getProperty(ctx context.Context, dest string, path dbus.ObjectPath, iface, name string) (dbus.Variant, error)
	// addMatch adds a signal match rule on the bus.
	addMatch(ctx context.Context, opts ...dbus.MatchOption) error
	// subscribe registers ch to receive every signal delivered to this
	// connection. ch is closed when the connection is closed or lost.
	subscribe(ch chan<- *dbus.Signal)
	// done is closed when the connection is closed or lost.
	done() <-chan struct{}
	// close closes the connection.
	close() error
}

// dialFunc opens a new transport.
type dialFunc func(ctx context.Context) (transport, error)

// systemBusAddress resolves the address of the system bus the way libdbus
// does: the environment variable, else the well-known socket.
func systemBusAddress() string {
	if a := os.Getenv("DBUS_SYSTEM_BUS_ADDRESS"); a != "" {
		return a
	}
	return DefaultSystemBusAddress
}

// busConn is the godbus implementation of transport.
type busConn struct {
	c *dbus.Conn
}

// dialBus returns a dialFunc that connects to address (EXTERNAL auth, Hello)
// and gives up when ctx ends. A connection that completes after ctx ended is
// closed.
func dialBus(address string) dialFunc {
	return func(ctx context.Context) (transport, error) {
		type result struct {
			c   *dbus.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			c, err := dbus.Connect(address)
			ch <- result{c, err}
		}()
		select {
		case r := <-ch:
			if r.err != nil {
				return nil, fmt.Errorf("connect to bus %s: %w", address, r.err)
			}
			return &busConn{c: r.c}, nil
		case <-ctx.Done():
			go func() {
				if r := <-ch; r.c != nil {
					_ = r.c.Close()
				}
			}()
			return nil, fmt.Errorf("connect to bus %s: %w", address, ctx.Err())
		}
	}
}

func (b *busConn) call(ctx context.Context, dest string, path dbus.ObjectPath, method string, args ...any) ([]any, error) {
	// The call is sent without a context so that godbus keeps tracking it
	// when ctx ends first: a late reply can then still be seen and any file
	// descriptor in it closed. A reply godbus no longer tracks is dropped
	// with its descriptors open, which for Inhibit would leak a lock.
	done := make(chan *dbus.Call, 1)
	b.c.Object(dest, path).Go(method, 0, done, args...)
	select {
	case c := <-done:
		if c.Err != nil {
			return nil, convertBusError(c.Err)
		}
		return c.Body, nil
	case <-ctx.Done():
		go func() {
			if c := <-done; c.Err == nil {
				closeUnixFDs(c.Body)
			}
		}()
		return nil, ctx.Err()
	}
}

func (b *busConn) getProperty(ctx context.Context, dest string, path dbus.ObjectPath, iface, name string) (dbus.Variant, error) {
	body, err := b.call(ctx, dest, path, propertiesIface+".Get", iface, name)
	if err != nil {
		return dbus.Variant{}, err
	}
	if len(body) != 1 {
		return dbus.Variant{}, fmt.Errorf("%w: Properties.Get returned %d values", ErrUnexpectedReply, len(body))
	}
	v, ok := body[0].(dbus.Variant)
	if !ok {
		return dbus.Variant{}, fmt.Errorf("%w: Properties.Get returned %T", ErrUnexpectedReply, body[0])
	}
	return v, nil
}

func (b *busConn) addMatch(ctx context.Context, opts ...dbus.MatchOption) error {
	return convertBusError(b.c.AddMatchSignalContext(ctx, opts...))
}

func (b *busConn) subscribe(ch chan<- *dbus.Signal) { b.c.Signal(ch) }

func (b *busConn) done() <-chan struct{} { return b.c.Context().Done() }

func (b *busConn) close() error { return b.c.Close() }

// convertBusError turns a godbus error reply into *BusError and leaves other
// errors alone.
func convertBusError(err error) error {
	var de dbus.Error
	var dep *dbus.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &de):
	case errors.As(err, &dep):
		de = *dep
	default:
		return err
	}
	be := &BusError{Name: de.Name}
	if len(de.Body) > 0 {
		if s, ok := de.Body[0].(string); ok {
			be.Message = s
		}
	}
	return be
}

// closeUnixFDs closes every file descriptor carried in a reply body that
// nobody will take ownership of.
func closeUnixFDs(body []any) {
	for _, v := range body {
		if fd, ok := v.(dbus.UnixFD); ok {
			_ = syscall.Close(int(fd))
		}
	}
}
