package host

import (
	"errors"
	"fmt"
)

// Sentinel errors. Match them with errors.Is; every error the package returns
// wraps one of these or a lower-level cause, and names the operation.
var (
	// ErrClosed is returned by a Logind whose Close has been called.
	ErrClosed = errors.New("host: logind client closed")
	// ErrInvalidInhibitMode is returned by Inhibit for a mode other than
	// "delay" or "block".
	ErrInvalidInhibitMode = errors.New("host: invalid inhibit mode")
	// ErrInvalidArgument is returned for an empty or malformed argument.
	ErrInvalidArgument = errors.New("host: invalid argument")
	// ErrNoInhibitFD is returned when logind's Inhibit reply carries no file
	// descriptor.
	ErrNoInhibitFD = errors.New("host: inhibit reply carried no file descriptor")
	// ErrUnexpectedReply is returned when a D-Bus reply or property has an
	// unexpected type.
	ErrUnexpectedReply = errors.New("host: unexpected D-Bus reply")
	// ErrInvalidBootID is returned when the boot ID file does not hold a UUID.
	ErrInvalidBootID = errors.New("host: invalid boot ID")
	// ErrInvalidConfig is returned when a logind configuration file cannot be
	// parsed.
	ErrInvalidConfig = errors.New("host: invalid logind configuration")
	// ErrCommandTimeout is wrapped by an *ExitError when the command ran past
	// its timeout and was killed.
	ErrCommandTimeout = errors.New("host: command timed out")
	// ErrInvalidUnitName is returned for a transient unit name systemd would
	// refuse.
	ErrInvalidUnitName = errors.New("host: invalid unit name")
)

// BusError is a D-Bus error reply (for example
// "org.freedesktop.login1.OperationInProgress"), converted at the package
// edge so that callers need not import godbus. Match it with errors.As.
type BusError struct {
	// Name is the D-Bus error name.
	Name string
	// Message is the first string of the error body, if any.
	Message string
}

func (e *BusError) Error() string {
	if e.Message == "" {
		return "D-Bus error " + e.Name
	}
	return fmt.Sprintf("D-Bus error %s: %s", e.Name, e.Message)
}
