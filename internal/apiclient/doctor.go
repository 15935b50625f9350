package apiclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// The probes of `lifecycle-agent doctor`. They return plain data and never
// print; the command turns them into lines. Every probe is read-only or a
// server-side dry run: none of them changes anything in the cluster.

// NodeScopePolicy is the ValidatingAdmissionPolicy (and its binding) in
// deploy/admission.yaml that confines a node's writes to its own objects.
const NodeScopePolicy = "lifecycle-agent-node-scope"

// Identity prefixes of a kubelet's credentials.
const (
	NodeUserPrefix = "system:node:"
	NodesGroup     = "system:nodes"
)

// FailureKind says why a probe's request failed, in terms an operator can act on.
type FailureKind string

const (
	// FailUnreachable: no HTTP answer (connection refused, DNS, timeout).
	FailUnreachable FailureKind = "unreachable"
	// FailTLS: the server's certificate was not trusted.
	FailTLS FailureKind = "tls"
	// FailUnauthorized: the server refused the credentials (401).
	FailUnauthorized FailureKind = "unauthorized"
	// FailForbidden: the identity may not make this request (403).
	FailForbidden FailureKind = "forbidden"
	// FailNotFound: the resource does not exist on the server (404).
	FailNotFound FailureKind = "not-found"
	// FailOther: anything else.
	FailOther FailureKind = "other"
)

// ProbeError is every request error a Doctor method returns.
type ProbeError struct {
	Kind FailureKind
	Op   string // e.g. "SelfSubjectReview"
	Msg  string // the cause, one line, without the request URL
	Err  error
}

func (e *ProbeError) Error() string { return "apiclient: " + e.Op + ": " + e.Msg }
func (e *ProbeError) Unwrap() error { return e.Err }

// DoctorConfig configures NewDoctor.
type DoctorConfig struct {
	// Timeout bounds each request (the agent's apiTimeout); 0 means 10 s.
	Timeout time.Duration
	// Clock times the requests for ServerClock; nil means the real clock.
	Clock clock.PassiveClock
}

// Doctor runs the API probes of `lifecycle-agent doctor` with one identity.
type Doctor struct {
	host    string
	timeout time.Duration
	core    kubernetes.Interface
	lc      *LifecycleClients
	dates   *dateRecorder
}

// NewDoctor builds a Doctor from cfg (see LoadConfig). It does not connect.
func NewDoctor(cfg *rest.Config, dc DoctorConfig) (*Doctor, error) {
	if dc.Timeout <= 0 {
		dc.Timeout = 10 * time.Second
	}
	if dc.Clock == nil {
		dc.Clock = clock.RealClock{}
	}
	c := rest.CopyConfig(cfg)
	c.Timeout = dc.Timeout
	c.QPS, c.Burst = 50, 100
	c.WarningHandler = rest.NoWarnings{}
	rec := &dateRecorder{clock: dc.Clock}
	prev := c.WrapTransport
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return &dateTransport{next: rt, rec: rec}
	}
	core, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("apiclient: %w", err)
	}
	lc, err := NewLifecycleClients(c)
	if err != nil {
		return nil, err
	}
	return &Doctor{host: c.Host, timeout: dc.Timeout, core: core, lc: lc, dates: rec}, nil
}

// Host is the API server address from the kubeconfig.
func (d *Doctor) Host() string { return d.host }

// Identity is who the API server says we are (SelfSubjectReview).
type Identity struct {
	Username string
	UID      string
	Groups   []string
}

// NodeName returns <name> for system:node:<name> in group system:nodes, the
// identity of a kubelet's kubeconfig.
func (id Identity) NodeName() (string, bool) {
	name, ok := strings.CutPrefix(id.Username, NodeUserPrefix)
	if !ok || name == "" || !slices.Contains(id.Groups, NodesGroup) {
		return "", false
	}
	return name, true
}

// WhoAmI asks the server who the credentials belong to (authentication.k8s.io/v1
// SelfSubjectReview, allowed to every authenticated user).
func (d *Doctor) WhoAmI(ctx context.Context) (Identity, error) {
	r, err := d.core.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return Identity{}, d.probeError("SelfSubjectReview", err)
	}
	u := r.Status.UserInfo
	id := Identity{Username: u.Username, UID: u.UID}
	for _, g := range u.Groups {
		if g != "" {
			id.Groups = append(id.Groups, g)
		}
	}
	return id, nil
}

// Permission is one request the agent makes, as a SelfSubjectAccessReview
// asks about it.
type Permission struct {
	Group         string // "" for the core group
	Resource      string // plural
	Subresource   string
	Verb          string
	Namespace     string // "" for cluster-scoped or all namespaces
	Name          string // "" for any
	FieldSelector string // e.g. spec.nodeName=node-a, for list and watch
}

// ResourcePath is resource[/subresource], e.g. "lifecycleevents/status".
func (p Permission) ResourcePath() string {
	if p.Subresource == "" {
		return p.Resource
	}
	return p.Resource + "/" + p.Subresource
}

// AgentPermissions lists every request the agent on node makes (DESIGN §7,
// deploy/rbac.yaml), with the namespace, name and field selector it uses, so
// that the Node authorizer judges them as it judges the agent.
func AgentPermissions(node string) []Permission {
	const lc = v1alpha1.GroupName
	var ps []Permission
	add := func(p Permission, verbs ...string) {
		for _, v := range verbs {
			p.Verb = v
			ps = append(ps, p)
		}
	}
	bound := BindingNodeSelector(node).FieldSelector
	add(Permission{Group: lc, Resource: "lifecycleevents"}, "get")
	add(Permission{Group: lc, Resource: "lifecycleevents", FieldSelector: bound}, "list", "watch")
	add(Permission{Group: lc, Resource: "lifecycleevents"}, "update", "patch", "delete") // delete: eventRetention
	add(Permission{Group: lc, Resource: "lifecycleevents", Subresource: "status"}, "update")
	add(Permission{Group: lc, Resource: "lifecycletransitions"}, "get", "create", "delete", "list", "watch") // watch: the claim reads this node's from an informer
	add(Permission{Group: lc, Resource: "lifecycleleases", Namespace: v1alpha1.SystemNamespace}, "get", "create", "update")
	add(Permission{Resource: "nodes", Name: node}, "get", "patch")
	add(Permission{Resource: "nodes", Subresource: "status", Name: node}, "patch")
	add(Permission{Resource: "pods", FieldSelector: "spec.nodeName=" + node}, "list", "watch") // watch: evict.go
	add(Permission{Resource: "pods", Subresource: "eviction"}, "create")
	add(Permission{Group: "apps", Resource: "daemonsets"}, "get")
	add(Permission{Group: "policy", Resource: "poddisruptionbudgets"}, "list", "watch") // evict.go
	add(Permission{Resource: "events", Namespace: metav1.NamespaceDefault}, "create")
	return ps
}

// Access is the server's answer for one Permission.
type Access struct {
	Permission
	Allowed bool
	Reason  string // the authorizer's reason or evaluation error, if any
}

// CheckAccess asks the server, with one SelfSubjectAccessReview per
// permission (a few at a time), whether this identity may make each request.
// The answers are in the order of perms. It fails if any review fails.
func (d *Doctor) CheckAccess(ctx context.Context, perms []Permission) ([]Access, error) {
	out := make([]Access, len(perms))
	errs := make([]error, len(perms))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, p := range perms {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i], errs[i] = d.access(ctx, p)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d *Doctor) access(ctx context.Context, p Permission) (Access, error) {
	ra := &authzv1.ResourceAttributes{
		Namespace: p.Namespace, Verb: p.Verb, Group: p.Group,
		Resource: p.Resource, Subresource: p.Subresource, Name: p.Name,
	}
	if p.FieldSelector != "" {
		ra.FieldSelector = &authzv1.FieldSelectorAttributes{RawSelector: p.FieldSelector}
	}
	r, err := d.core.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
		&authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: ra}}, metav1.CreateOptions{})
	if err != nil {
		return Access{}, d.probeError("SelfSubjectAccessReview "+p.ResourcePath()+" "+p.Verb, err)
	}
	a := Access{Permission: p, Allowed: r.Status.Allowed && !r.Status.Denied, Reason: r.Status.Reason}
	if r.Status.EvaluationError != "" {
		a.Reason = strings.TrimSpace(a.Reason + " " + r.Status.EvaluationError)
	}
	return a, nil
}

// CRD is what ProbeCRDs found about one of the lifecycle kinds.
type CRD struct {
	Resource  string // plural, e.g. lifecycleevents
	Namespace string // where it is listed: "" for cluster-scoped kinds
	Installed bool
	// Via is how it was seen: "list" (a list with limit=1 worked) or
	// "discovery" (the identity may not list it, but the server serves it).
	Via string
}

// ProbeCRDs tells whether the server serves every lifecycle kind (events,
// transitions and, in lifecycle-system, leases). A node identity may not
// read CRDs, so it lists each kind with limit=1 (404 when its CRD is missing
// or not yet established) and, where the list is forbidden, looks the kind
// up in the group's discovery document, which every authenticated user may
// read.
func (d *Doctor) ProbeCRDs(ctx context.Context) ([]CRD, error) {
	rc := d.lc.REST
	out := []CRD{{Resource: "lifecycleevents"}, {Resource: "lifecycletransitions"},
		{Resource: "lifecycleleases", Namespace: v1alpha1.SystemNamespace}}
	var forbidden bool
	for i := range out {
		err := rc.Get().Namespace(out[i].Namespace).Resource(out[i].Resource).Param("limit", "1").Do(ctx).Error()
		switch {
		case err == nil:
			out[i].Installed, out[i].Via = true, "list"
		case apierrors.IsNotFound(err):
			out[i].Via = "list"
		case apierrors.IsForbidden(err):
			forbidden = true
		default:
			return nil, d.probeError("list "+out[i].Resource, err)
		}
	}
	if !forbidden {
		return out, nil
	}
	gv := v1alpha1.SchemeGroupVersion.String()
	raw, err := d.core.Discovery().RESTClient().Get().AbsPath("/apis/" + gv).Do(ctx).Raw()
	var served []string
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, d.probeError("discovery of "+gv, err)
	default:
		var l metav1.APIResourceList
		if err := json.Unmarshal(raw, &l); err != nil {
			return nil, &ProbeError{Kind: FailOther, Op: "discovery of " + gv, Msg: err.Error(), Err: err}
		}
		for _, r := range l.APIResources {
			served = append(served, r.Name)
		}
	}
	for i := range out {
		if out[i].Via == "" {
			out[i].Installed, out[i].Via = slices.Contains(served, out[i].Resource), "discovery"
		}
	}
	return out, nil
}

// PolicyProbe is what ProbeNodeScopePolicy found.
type PolicyProbe struct {
	// Enforced: for a node identity, a dry-run write for another node was
	// refused by NodeScopePolicy; for any other identity (which the policy
	// does not match), the policy and a Deny binding exist.
	Enforced bool
	// Via is "dry-run" or "read".
	Via string
	// Detail is the server's refusal, or what is missing.
	Detail string
}

// ProbeNodeScopePolicy checks that NodeScopePolicy is in force. As a node
// identity it makes a server-side dry-run create of a LifecycleTransition
// for another node, which the policy must refuse (a dry run stores nothing).
// As another identity, which the policy does not match, it reads the policy
// and its binding instead (this needs read access to them).
func (d *Doctor) ProbeNodeScopePolicy(ctx context.Context, id Identity) (PolicyProbe, error) {
	node, isNode := id.NodeName()
	if !isNode {
		return d.readPolicy(ctx)
	}
	other := "lifecycle-agent-doctor-probe"
	if other == node {
		other += "-other"
	}
	lt := &v1alpha1.LifecycleTransition{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "lifecycle-agent-doctor-"},
		Spec: v1alpha1.LifecycleTransitionSpec{
			Start: "DoctorProbeStarted", End: "DoctorProbeComplete",
			NodeName: &other, Driver: "lifecycle-agent.x-k8s.io/doctor-probe",
		},
	}
	_, err := d.lc.Transitions.Create(ctx, lt, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return PolicyProbe{Via: "dry-run", Detail: fmt.Sprintf(
			"a dry-run create of a LifecycleTransition for node %s as %s was accepted", other, id.Username)}, nil
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), NodeScopePolicy):
		return PolicyProbe{Enforced: true, Via: "dry-run", Detail: statusMessage(err)}, nil
	}
	return PolicyProbe{}, d.probeError("dry-run create of a LifecycleTransition", err)
}

func (d *Doctor) readPolicy(ctx context.Context) (PolicyProbe, error) {
	ar := d.core.AdmissionregistrationV1()
	p := PolicyProbe{Via: "read"}
	if _, err := ar.ValidatingAdmissionPolicies().Get(ctx, NodeScopePolicy, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		p.Detail = "ValidatingAdmissionPolicy " + NodeScopePolicy + " not found"
		return p, nil
	} else if err != nil {
		return p, d.probeError("get ValidatingAdmissionPolicy "+NodeScopePolicy, err)
	}
	b, err := ar.ValidatingAdmissionPolicyBindings().Get(ctx, NodeScopePolicy, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		p.Detail = "ValidatingAdmissionPolicyBinding " + NodeScopePolicy + " not found"
	case err != nil:
		return p, d.probeError("get ValidatingAdmissionPolicyBinding "+NodeScopePolicy, err)
	case b.Spec.PolicyName != NodeScopePolicy || !slices.Contains(b.Spec.ValidationActions, "Deny"):
		p.Detail = fmt.Sprintf("ValidatingAdmissionPolicyBinding %s does not deny with policy %s (policyName %q, validationActions %v)",
			NodeScopePolicy, NodeScopePolicy, b.Spec.PolicyName, b.Spec.ValidationActions)
	default:
		p.Enforced = true
		p.Detail = "ValidatingAdmissionPolicy and binding " + NodeScopePolicy + " present"
	}
	return p, nil
}

// ClockSample compares the API server's clock with ours: the Date header of
// a response against the local time halfway through the request.
type ClockSample struct {
	Server time.Time     // the Date header (whole seconds)
	Local  time.Time     // local time at the middle of the round trip
	RTT    time.Duration // the round trip
}

// Offset is how far the server's clock is ahead of ours (negative: behind).
// The Date header is truncated to the second, so half a second is added.
// The error is at most ±(500 ms + RTT/2).
func (s ClockSample) Offset() time.Duration {
	return s.Server.Add(500 * time.Millisecond).Sub(s.Local)
}

// ServerClock makes one request (GET /version; any answer, even a refusal,
// carries a Date header) and returns the sample with the shortest round trip
// among every response this Doctor has seen.
func (d *Doctor) ServerClock(ctx context.Context) (ClockSample, error) {
	err := d.core.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
	if s, ok := d.dates.best(); ok {
		return s, nil
	}
	if err == nil {
		err = errors.New("no Date header in the response")
	}
	return ClockSample{}, d.probeError("GET /version", err)
}

// dateRecorder keeps the Date header of the response with the shortest
// round trip, over every transport built from the Doctor's config.
type dateRecorder struct {
	clock clock.PassiveClock

	mu     sync.Mutex
	sample ClockSample
	have   bool
}

// dateTransport times each request and hands the response's Date to rec.
type dateTransport struct {
	next http.RoundTripper
	rec  *dateRecorder
}

func (t *dateTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	sent := t.rec.clock.Now()
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if date, perr := http.ParseTime(resp.Header.Get("Date")); perr == nil {
		t.rec.observe(date, sent, t.rec.clock.Now())
	}
	return resp, nil
}

// WrappedRoundTripper lets client-go reach the transport underneath to
// cancel a request.
func (t *dateTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

func (r *dateRecorder) observe(date, sent, recv time.Time) {
	rtt := recv.Sub(sent)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.have || rtt < r.sample.RTT {
		r.sample, r.have = ClockSample{Server: date, Local: sent.Add(rtt / 2), RTT: rtt}, true
	}
}

func (r *dateRecorder) best() (ClockSample, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sample, r.have
}

// probeError classifies err from a request made for op.
func (d *Doctor) probeError(op string, err error) error {
	return classify(op, err, d.timeout)
}

func classify(op string, err error, timeout time.Duration) *ProbeError {
	pe := &ProbeError{Kind: FailOther, Op: op, Msg: err.Error(), Err: err}
	var status apierrors.APIStatus
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ue) {
		pe.Msg = ue.Err.Error() // drop `Post "https://…/apis/…?timeout=10s": `
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) || apierrors.IsTimeout(err):
		pe.Kind, pe.Msg = FailUnreachable, fmt.Sprintf("no answer within %s", timeout)
	case isTLSError(err):
		pe.Kind = FailTLS
	case errors.As(err, &status) && status.Status().Code != 0:
		pe.Msg = statusMessage(err)
		switch {
		case apierrors.IsUnauthorized(err):
			pe.Kind = FailUnauthorized
		case apierrors.IsForbidden(err):
			pe.Kind = FailForbidden
		case apierrors.IsNotFound(err):
			pe.Kind = FailNotFound
		}
	case ue != nil || errors.As(err, new(*net.OpError)) || errors.As(err, new(*net.DNSError)):
		pe.Kind = FailUnreachable
	}
	pe.Msg = strings.Join(strings.Fields(pe.Msg), " ")
	return pe
}

func isTLSError(err error) bool {
	return errors.As(err, new(x509.UnknownAuthorityError)) || errors.As(err, new(x509.HostnameError)) ||
		errors.As(err, new(x509.CertificateInvalidError)) || errors.As(err, new(*tls.CertificateVerificationError)) ||
		errors.As(err, new(tls.RecordHeaderError))
}

// statusMessage is the server's message in an API error.
func statusMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Message != "" {
		return status.Status().Message
	}
	return err.Error()
}
