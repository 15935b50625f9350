package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"
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

// A call held up by an outage goes on within a second of the API server's
// return: while the server does not answer, retryAPI tries every
// unansweredRetry, not on a back-off grown over the outage (2, 4, 8, 16 s:
// an event's finish, its Lease release, caught in a 6 s outage, went on
// 8 s after the server was back, and the next event was claimed late,
// test/e2e TestClaimsAfterEveryOutage). A try that timed out waits at most
// timedOutRetry; a server that answers with a refusal (503, 429) keeps the
// exponential back-off.
func TestRetryAPICadence(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want []time.Duration // the time of each try, from the first
	}{
		{"refused", dialErr(syscall.ECONNREFUSED), []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second}},
		{"timed out", fmt.Errorf("apiclient: release node lease: %w", context.DeadlineExceeded), []time.Duration{0, 2 * time.Second, 6 * time.Second, 11 * time.Second, 16 * time.Second, 21 * time.Second}},
		{"unavailable", apierrors.NewServiceUnavailable("etcd"), []time.Duration{0, 2 * time.Second, 6 * time.Second, 14 * time.Second, 30 * time.Second, 60 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
			clk := clocktesting.NewFakeClock(start)
			e := newOfflineEngine(t, clk)
			var mu sync.Mutex
			var tries []time.Duration
			done := make(chan error, 1)
			go func() {
				_, err := e.retryAPI(context.Background(), func(context.Context) (bool, error) {
					mu.Lock()
					defer mu.Unlock()
					tries = append(tries, clk.Since(start))
					if len(tries) < len(tc.want) {
						return false, tc.err
					}
					return true, nil
				})
				done <- err
			}()
			for {
				select {
				case err := <-done:
					mu.Lock()
					defer mu.Unlock()
					if err != nil || !slices.Equal(tries, tc.want) {
						t.Fatalf("tries at %v (err %v), want at %v", tries, err, tc.want)
					}
					return
				default:
				}
				if clk.HasWaiters() {
					clk.Step(250 * time.Millisecond)
				} else {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
}
