package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// stallRenewal is the node's transport with one fault: once armed, the next
// PUT of the node Lease (the running event's renewal) reaches no server
// until its caller gives up on it, as over a connection gone silent. Then
// the request is delivered anyway, as a server that had it in a buffer
// would: at once, before the caller hears of its cancellation (landsEarly),
// or when the test calls land (after the event's end).
type stallRenewal struct {
	next       http.RoundTripper
	path       string
	landsEarly bool

	mu        sync.Mutex
	armed     bool
	stalled   chan struct{} // closed when the renewal is held
	cancelled chan struct{} // closed when its caller gave up on it
	req       *http.Request
	body      []byte
	landed    int // the server's answer to the delivered renewal
}

func (s *stallRenewal) arm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed = true
}

func (s *stallRenewal) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	hold := s.armed && req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, s.path)
	if hold {
		s.armed = false
	}
	s.mu.Unlock()
	if !hold {
		return s.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	_ = req.Body.Close()
	s.mu.Lock()
	s.req, s.body = req, body
	s.mu.Unlock()
	close(s.stalled)
	<-req.Context().Done()
	close(s.cancelled)
	if s.landsEarly {
		s.land()
	}
	return nil, req.Context().Err()
}

// land delivers the held renewal, as it was sent, and records the answer.
func (s *stallRenewal) land() {
	s.mu.Lock()
	req, body := s.req, s.body
	s.mu.Unlock()
	late := req.Clone(context.Background())
	late.Body = io.NopCloser(bytes.NewReader(body))
	late.ContentLength = int64(len(body))
	resp, err := s.next.RoundTrip(late)
	code := -1
	if err == nil {
		code = resp.StatusCode
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	s.mu.Lock()
	s.landed = code
	s.mu.Unlock()
}

func (s *stallRenewal) answer() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.landed
}

// A renewal of the node Lease in flight when the event ends, on a
// connection gone silent: the end cancels it instead of waiting for it
// (internal/engine renewal.end), and whenever it still lands it cannot
// take the released Lease back: delivered before the release, the release
// reads the Lease again on its 409 and frees it; delivered after, it
// carries the resourceVersion it read and is refused. Either way the event
// ends Succeeded and the node's Lease has no holder at rest (DESIGN §2's
// end order). Without the cancel in renewal.end the finish waits for
// renewLoop for good (the event never ends); a renewal sent without its
// resourceVersion would take the Lease back after the release.
func TestRenewalInFlightAtTheEnd(t *testing.T) {
	for _, tc := range []struct {
		name       string
		landsEarly bool
		wantLanded int
	}{
		{"lands before the release", true, http.StatusOK},
		{"lands after the release", false, http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := "renewal-" + map[bool]string{true: "early", false: "late"}[tc.landsEarly]
			newNode(t, node)
			stall := &stallRenewal{path: "/lifecycleleases/" + apiclient.NodeLeaseName(node), landsEarly: tc.landsEarly,
				stalled: make(chan struct{}), cancelled: make(chan struct{})}
			rc := env.NodeConfig(node)
			rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { stall.next = rt; return stall })
			g := newGateDriver("renewal", false, "hold")
			startAgent(t, node, agentOpts{retention: time.Hour, extra: []drivers.Driver{g}, rest: rc})
			lc := clients(t, env.AdminConfig())
			ctx := context.Background()
			waitFor(t, "the transition", 30*time.Second, func() bool {
				_, err := lc.Transitions.Get(ctx, transitionName(node, "renewal"), metav1.GetOptions{})
				return err == nil
			})
			name := node + "-1"
			createEvent(t, name, node, transitionName(node, "renewal"), nil, nil)
			waitFor(t, "step hold running", 30*time.Second, func() bool {
				ev, err := lc.Events.Get(ctx, name, metav1.GetOptions{})
				return err == nil && ev.Status.CurrentStep == "hold"
			})
			// The claim took the Lease; the next write to it is the
			// renewal, a third of the Lease's 40 s after the claim.
			stall.arm()
			select {
			case <-stall.stalled:
			case <-time.After(30 * time.Second):
				t.Fatal("no renewal of the node Lease within 30s of the claim")
			}
			g.open("hold")
			ev := waitEvent(t, name, 30*time.Second)
			if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
				t.Fatalf("event ended %s: %s", ev.Status.ClaimStatus, ev.Status.Message)
			}
			// The Lease is released right after the finalizer comes off,
			// once the renewal has been cancelled and renewLoop returned.
			waitFor(t, "the node Lease released after the end", 20*time.Second, func() bool { return holder(t, node) == "" })
			select {
			case <-stall.cancelled:
			default:
				t.Fatal("the node Lease was released with its renewal still in flight")
			}
			if !tc.landsEarly {
				stall.land()
			}
			if got := stall.answer(); got != tc.wantLanded {
				t.Fatalf("the held renewal, delivered %s, was answered %d; want %d", tc.name, got, tc.wantLanded)
			}
			free(t, node, "at rest, after the held renewal landed")
		})
	}
}

// holder is who holds node's Lease ("" when no one does, or it is gone).
func holder(t *testing.T, node string) string {
	t.Helper()
	lc := clients(t, env.AdminConfig())
	l, err := lc.Leases(v1alpha1.SystemNamespace).Get(context.Background(), apiclient.NodeLeaseName(node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != "" {
		return *h + " (for event " + l.Annotations[apiclient.AnnotationLeaseEvent] + ")"
	}
	return ""
}

// free fails t unless node's Lease has no holder.
func free(t *testing.T, node, when string) {
	t.Helper()
	if h := holder(t, node); h != "" {
		t.Fatalf("node Lease of %s held by %s %s", node, h, when)
	}
}
