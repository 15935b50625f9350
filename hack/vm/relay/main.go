// Command relay joins its standard input and output to a TCP connection. The
// VM tests' QEMU runs it once per guest connection through user networking's
// guestfwd ("guestfwd=tcp:10.0.2.100:6443-cmd:relay 127.0.0.1:PORT"), so that
// the guest reaches the host's test kube-apiserver on 127.0.0.1 and nothing
// else. QEMU's plain chardev form of guestfwd carries one connection for the
// whole life of the VM, which HTTPS clients cannot live with.
//
// stdin, stdout and stderr are all the guest's socket: nothing may be written
// to stderr. Errors go to the file named by -log, if any.
//
//	relay [-log FILE] HOST:PORT
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

func main() {
	args := os.Args[1:]
	var logf io.Writer = io.Discard
	if len(args) == 3 && args[0] == "-log" {
		if f, err := os.OpenFile(args[1], os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
			logf = f
		}
		args = args[2:]
	}
	if len(args) != 1 {
		os.Exit(2)
	}
	conn, err := net.DialTimeout("tcp", args[0], 10*time.Second)
	if err != nil {
		fmt.Fprintf(logf, "%s relay: %v\n", time.Now().Format(time.RFC3339), err)
		os.Exit(1)
	}
	tcp := conn.(*net.TCPConn)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // guest -> host
		defer wg.Done()
		_, _ = io.Copy(tcp, os.Stdin)
		_ = tcp.CloseWrite()
	}()
	go func() { // host -> guest
		defer wg.Done()
		_, _ = io.Copy(os.Stdout, tcp)
		// stdout is a socket (slirp's socketpair): half-close it so the
		// guest sees EOF while its own direction may still be sending.
		if err := syscall.Shutdown(int(os.Stdout.Fd()), syscall.SHUT_WR); err != nil {
			_ = os.Stdout.Close()
		}
	}()
	wg.Wait()
	_ = tcp.Close()
}
