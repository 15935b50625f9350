// Package v1alpha1 holds the Go types of the lifecycle.x-k8s.io/v1alpha1 API:
// LifecycleTransition and LifecycleEvent, the API proposed by KEP-5683
// (Specialized Lifecycle Management), with the field names of the KEP's Go API
// so that moving to the upstream group later is a rename.
//
// Fields marked (ext) in their comments are this project's extensions:
// spec.parameters, spec.disruption and most of status (holder, steps,
// conditions, message, completionTime, currentStep).
//
// The CRDs in deploy/crds are generated from these types by controller-gen
// (`make generate`); validation lives in the kubebuilder markers below, as
// OpenAPI constraints and CEL rules, so that a bad object is refused at
// admission with a message naming the field.
//
// +kubebuilder:object:generate=true
// +groupName=lifecycle.x-k8s.io
package v1alpha1
