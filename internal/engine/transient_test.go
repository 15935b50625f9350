package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// dialErr is the error client-go returns when a dial fails with errno, as
// net/http wraps it: *url.Error → *net.OpError → *os.SyscallError.
func dialErr(errno syscall.Errno) error {
	return &url.Error{Op: "Get", URL: "https://kubernetes:6443/api/v1/nodes/vm-node?timeout=10s",
		Err: &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 2, 100), Port: 6443},
			Err: os.NewSyscallError("connect", errno)}}
}

// What isTransient retries: the API server or the node's own network not
// answering (an abort right after a boot met "network is unreachable" and
// gave up, leaving the node cordoned), never a refusal or a stop.
func TestIsTransient(t *testing.T) {
	gr := schema.GroupResource{Resource: "nodes"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"network is unreachable", fmt.Errorf("apiclient: get node vm-node: %w", dialErr(syscall.ENETUNREACH)), true},
		{"no route to host", dialErr(syscall.EHOSTUNREACH), true},
		{"connection refused", dialErr(syscall.ECONNREFUSED), true},
		{"network down", dialErr(syscall.ENETDOWN), true},
		{"name not resolvable yet", &url.Error{Op: "Get", URL: "https://kubernetes:6443/", Err: &net.OpError{Op: "dial", Net: "tcp",
			Err: &net.DNSError{Err: "no such host", Name: "kubernetes", IsNotFound: true}}}, true},
		{"server error", apierrors.NewInternalError(errors.New("etcd")), true},
		{"throttled", apierrors.NewTooManyRequests("slow down", 1), true},
		{"deadline", context.DeadlineExceeded, true},
		{"conflict", apierrors.NewConflict(gr, "vm-node", errors.New("changed")), false},
		{"forbidden", apierrors.NewForbidden(gr, "vm-node", errors.New("no")), false},
		{"not found", apierrors.NewNotFound(gr, "vm-node"), false},
		{"stopping", context.Canceled, false},
		{"permission denied", dialErr(syscall.EACCES), false},
		{"a driver's own failure", errors.New("the upgrade did not reach its target"), false},
		{"nil", nil, false},
	} {
		if got := isTransient(tc.err); got != tc.want {
			t.Errorf("%s: isTransient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
