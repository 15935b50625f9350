package main

import (
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// ownForeground makes the sandbox a process group of its own and that group
// the terminal's foreground one, so that Ctrl-C reaches the sandbox alone:
// not `go run` nor make, its parents. Otherwise make, which gets the SIGINT
// too, kills itself with it once the sandbox has stopped, and `make
// sandbox` ends with status 130 although the sandbox stopped cleanly. It
// returns the function that gives the terminal back to the group it was
// taken from (call it before exiting). Without a controlling terminal, or
// when not in its foreground, it changes nothing.
func ownForeground() (restore func()) {
	noop := func() {}
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return noop
	}
	fd := tty.Fd()
	var fg int32
	if ioctlPgrp(fd, syscall.TIOCGPGRP, &fg) != nil || int(fg) != syscall.Getpgrp() {
		tty.Close()
		return noop
	}
	// Between Setpgid and TIOCSPGRP this process is in a background group,
	// where setting the foreground group raises SIGTTOU (it would stop it).
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	if err := syscall.Setpgid(0, 0); err != nil {
		tty.Close()
		return noop
	}
	me := int32(syscall.Getpid())
	if ioctlPgrp(fd, syscall.TIOCSPGRP, &me) != nil {
		_ = syscall.Setpgid(0, int(fg))
		tty.Close()
		return noop
	}
	// Ctrl-Z would stop the sandbox alone, its parents not: the terminal
	// would stay with a stopped group. Caught (not ignored: the agents it
	// starts keep the default), it does nothing.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTSTP)
	return func() {
		signal.Ignore(syscall.SIGTTOU)
		_ = ioctlPgrp(fd, syscall.TIOCSPGRP, &fg)
		signal.Reset(syscall.SIGTTOU)
		tty.Close()
	}
}

func ioctlPgrp(fd uintptr, req uintptr, pgrp *int32) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(pgrp))); e != 0 {
		return e
	}
	return nil
}
