package apiclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
)

// These unit tests cover what a real API server cannot be made to do on
// demand (a skewed clock, a hanging or untrusted server). The probes
// themselves are tested against a real kube-apiserver in test/e2e.

func TestIdentityNodeName(t *testing.T) {
	tests := []struct {
		name string
		id   Identity
		want string
		ok   bool
	}{
		{name: "kubelet", id: Identity{Username: "system:node:node-a", Groups: []string{"system:nodes", "system:authenticated"}}, want: "node-a", ok: true},
		{name: "no group", id: Identity{Username: "system:node:node-a", Groups: []string{"system:authenticated"}}},
		{name: "empty name", id: Identity{Username: "system:node:", Groups: []string{"system:nodes"}}},
		{name: "user", id: Identity{Username: "alice", Groups: []string{"system:nodes"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.id.NodeName()
			if got != tt.want || ok != tt.ok {
				t.Errorf("NodeName() = %q, %v; want %q, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestAgentPermissions(t *testing.T) {
	ps := AgentPermissions("node-a")
	if len(ps) != 25 {
		t.Errorf("%d permissions, want 25", len(ps))
	}
	seen := map[string]bool{}
	for _, p := range ps {
		k := fmt.Sprintf("%s %s %s %s", p.Group, p.ResourcePath(), p.Verb, p.Namespace)
		if seen[k] {
			t.Errorf("duplicate permission %s", k)
		}
		seen[k] = true
		if p.Resource == "nodes" && p.Name != "node-a" {
			t.Errorf("%s %s is not limited to the node's own object", p.ResourcePath(), p.Verb)
		}
		if p.Resource == "pods" && p.Verb == "list" && p.FieldSelector != "spec.nodeName=node-a" {
			t.Errorf("pods list has field selector %q, want spec.nodeName=node-a (the Node authorizer needs it)", p.FieldSelector)
		}
	}
}

// TestServerClock: the offset is the Date header (plus half a second for its
// truncation) against the local time halfway through the round trip.
func TestServerClock(t *testing.T) {
	local := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name   string
		server time.Time
		rtt    time.Duration
		want   time.Duration
	}{
		{name: "in step", server: local, rtt: 0, want: 500 * time.Millisecond},
		{name: "server ahead", server: local.Add(42 * time.Second), rtt: 200 * time.Millisecond, want: 42*time.Second + 400*time.Millisecond},
		{name: "server behind", server: local.Add(-10 * time.Second), rtt: 0, want: -9500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakePassiveClock(local)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				clk.SetTime(clk.Now().Add(tt.rtt)) // the round trip takes rtt
				w.Header().Set("Date", tt.server.Format(http.TimeFormat))
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"major":"1","minor":"37"}`)
			}))
			defer srv.Close()
			d, err := NewDoctor(&rest.Config{Host: srv.URL}, DoctorConfig{Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			s, err := d.ServerClock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if s.RTT != tt.rtt {
				t.Errorf("RTT %s, want %s", s.RTT, tt.rtt)
			}
			if got := s.Offset(); got != tt.want {
				t.Errorf("Offset() = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestProbeErrors: each way a request can fail is classified so that the
// command can name a fix.
func TestProbeErrors(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	status := func(code int, reason string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"%s says no","reason":"%s","code":%d}`, reason, reason, code)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()

	tests := []struct {
		name    string
		handler http.Handler // nil: nothing listens
		tls     bool
		kind    FailureKind
		msg     string // substring
	}{
		{name: "closed port", kind: FailUnreachable, msg: "connect: connection refused"},
		{name: "no answer", handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // then the server notices the client leave
			select {                           // until the client gives up
			case <-r.Context().Done():
			case <-hang:
			}
		}), kind: FailUnreachable, msg: "no answer within 300ms"},
		{name: "untrusted certificate", handler: status(200, ""), tls: true, kind: FailTLS, msg: "certificate"},
		{name: "unauthorized", handler: status(401, "Unauthorized"), kind: FailUnauthorized, msg: "Unauthorized says no"},
		{name: "forbidden", handler: status(403, "Forbidden"), kind: FailForbidden, msg: "Forbidden says no"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host := closed
			if tt.handler != nil {
				srv := httptest.NewUnstartedServer(tt.handler)
				if tt.tls {
					srv.StartTLS()
				} else {
					srv.Start()
				}
				defer srv.Close()
				host = srv.URL
			}
			timeout := 10 * time.Second
			if tt.kind == FailUnreachable {
				timeout = 300 * time.Millisecond
			}
			d, err := NewDoctor(&rest.Config{Host: host}, DoctorConfig{Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.WhoAmI(context.Background())
			var pe *ProbeError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T) is not a *ProbeError", err, err)
			}
			if pe.Kind != tt.kind || !strings.Contains(pe.Msg, tt.msg) {
				t.Errorf("got kind %s, message %q; want %s, containing %q", pe.Kind, pe.Msg, tt.kind, tt.msg)
			}
			if strings.Contains(pe.Msg, "selfsubjectreviews") || strings.Contains(pe.Msg, "\n") {
				t.Errorf("message %q carries the URL or a newline", pe.Msg)
			}
		})
	}
}

// TestProbeCRDsDiscovery: an identity that may not list the kinds still
// learns from discovery whether they are served.
func TestProbeCRDsDiscovery(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/apis/lifecycle.x-k8s.io/v1alpha1/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`)
	})
	mux.HandleFunc("/apis/lifecycle.x-k8s.io/v1alpha1", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"APIResourceList","groupVersion":"lifecycle.x-k8s.io/v1alpha1","resources":[
			{"name":"lifecycleevents","namespaced":false,"kind":"LifecycleEvent","verbs":["get"]},
			{"name":"lifecycleevents/status","namespaced":false,"kind":"LifecycleEvent","verbs":["get"]}]}`)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	d, err := NewDoctor(&rest.Config{Host: srv.URL}, DoctorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	crds, err := d.ProbeCRDs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []CRD{{Resource: "lifecycleevents", Installed: true, Via: "discovery"}, {Resource: "lifecycletransitions", Via: "discovery"},
		{Resource: "lifecycleleases", Namespace: "lifecycle-system", Via: "discovery"}}
	if fmt.Sprint(crds) != fmt.Sprint(want) {
		t.Errorf("got %+v, want %+v", crds, want)
	}
}
