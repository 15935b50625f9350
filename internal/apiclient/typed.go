package apiclient

import (
	"fmt"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// Scheme knows the core kinds and both lifecycle kinds.
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := scheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

// EventClient is typed access to LifecycleEvents (cluster-scoped).
type EventClient = gentype.ClientWithList[*v1alpha1.LifecycleEvent, *v1alpha1.LifecycleEventList]

// TransitionClient is typed access to LifecycleTransitions (cluster-scoped).
type TransitionClient = gentype.ClientWithList[*v1alpha1.LifecycleTransition, *v1alpha1.LifecycleTransitionList]

// LeaseClient is typed access to LifecycleLeases (namespaced).
type LeaseClient = gentype.ClientWithList[*v1alpha1.LifecycleLease, *v1alpha1.LifecycleLeaseList]

// LifecycleClients holds typed clients for the lifecycle kinds, built on client-go's
// generic typed client (the same code generated clientsets use).
type LifecycleClients struct {
	Events      *EventClient
	Transitions *TransitionClient
	REST        rest.Interface
}

// Leases returns the LifecycleLease client for namespace ns.
func (c *LifecycleClients) Leases(ns string) *LeaseClient {
	return gentype.NewClientWithList[*v1alpha1.LifecycleLease, *v1alpha1.LifecycleLeaseList](
		"lifecycleleases", c.REST, parameterCodec, ns,
		func() *v1alpha1.LifecycleLease { return &v1alpha1.LifecycleLease{} },
		func() *v1alpha1.LifecycleLeaseList { return &v1alpha1.LifecycleLeaseList{} },
	)
}

// NewLifecycleClients builds typed clients for lifecycle.x-k8s.io/v1alpha1.
func NewLifecycleClients(cfg *rest.Config) (*LifecycleClients, error) {
	return newLifecycleClients(cfg, nil)
}

// newLifecycleClients is NewLifecycleClients on httpClient's connections
// when it is not nil (with cfg's own rate limiter).
func newLifecycleClients(cfg *rest.Config, httpClient *http.Client) (*LifecycleClients, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1alpha1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = codecs.WithoutConversion()
	c.ContentType = runtime.ContentTypeJSON
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	var rc *rest.RESTClient
	var err error
	if httpClient != nil {
		rc, err = rest.RESTClientForConfigAndClient(c, httpClient)
	} else {
		rc, err = rest.RESTClientFor(c)
	}
	if err != nil {
		return nil, fmt.Errorf("apiclient: lifecycle REST client: %w", err)
	}
	return &LifecycleClients{
		REST: rc,
		Events: gentype.NewClientWithList[*v1alpha1.LifecycleEvent, *v1alpha1.LifecycleEventList](
			"lifecycleevents", rc, parameterCodec, "",
			func() *v1alpha1.LifecycleEvent { return &v1alpha1.LifecycleEvent{} },
			func() *v1alpha1.LifecycleEventList { return &v1alpha1.LifecycleEventList{} },
		),
		Transitions: gentype.NewClientWithList[*v1alpha1.LifecycleTransition, *v1alpha1.LifecycleTransitionList](
			"lifecycletransitions", rc, parameterCodec, "",
			func() *v1alpha1.LifecycleTransition { return &v1alpha1.LifecycleTransition{} },
			func() *v1alpha1.LifecycleTransitionList { return &v1alpha1.LifecycleTransitionList{} },
		),
	}, nil
}

// BindingNodeSelector is the field selector that limits a list or watch to
// the events bound to node.
func BindingNodeSelector(node string) metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: "spec.bindingNode=" + node}
}
