package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of both kinds.
const GroupName = "lifecycle.x-k8s.io"

// SchemeGroupVersion is the group and version of this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource names, for clients and RBAC.
var (
	TransitionsResource = SchemeGroupVersion.WithResource("lifecycletransitions")
	EventsResource      = SchemeGroupVersion.WithResource("lifecycleevents")
	LeasesResource      = SchemeGroupVersion.WithResource("lifecycleleases")
)

var (
	// SchemeBuilder registers the kinds of this package.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion,
		&LifecycleTransition{}, &LifecycleTransitionList{},
		&LifecycleEvent{}, &LifecycleEventList{},
		&LifecycleLease{}, &LifecycleLeaseList{},
	)
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
