package testenv

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// syncBuf is a log the control plane's starter writes to.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStartRetriesTakenPort: a port picked free and taken by another
// process before etcd or kube-apiserver binds it (go test runs packages
// in parallel, each with its control plane) no longer fails the package's
// setup: the start is tried again on new ports.
func TestStartRetriesTakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	real := freePort
	var mu sync.Mutex
	calls := 0
	freePort = func() (int, error) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		// etcd takes two ports per attempt (client, peer), kube-apiserver one:
		// call 1 is etcd's first client port, call 5 kube-apiserver's first.
		if n == 1 || n == 5 {
			return taken.Addr().(*net.TCPAddr).Port, nil
		}
		return real()
	}
	defer func() { freePort = real }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var log syncBuf
	e, err := Start(ctx, Options{Log: &log})
	if err != nil {
		t.Fatalf("Start with taken ports: %v", err)
	}
	defer e.Stop()
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if !strings.Contains(log.String(), name+" lost a port to another process") {
			t.Errorf("no retry of %s logged; the test's premise is that its first port was taken:\n%s", name, log.String())
		}
	}
	cs, err := kubernetes.NewForConfig(e.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("the control plane started on the retried ports does not answer: %v", err)
	}
}
