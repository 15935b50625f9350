package v1alpha1

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=lt
// +kubebuilder:printcolumn:name="Start",type=string,JSONPath=`.spec.start`
// +kubebuilder:printcolumn:name="End",type=string,JSONPath=`.spec.end`
// +kubebuilder:printcolumn:name="Driver",type=string,JSONPath=`.spec.driver`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`

// LifecycleTransition is a capability: a transition from one state to another
// that a driver can perform on the nodes it names. The agent publishes one per
// enabled driver for its own node.
type LifecycleTransition struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec defines the lifecycle transition.
	// +required
	Spec LifecycleTransitionSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// LifecycleTransitionList contains a list of LifecycleTransition resources.
type LifecycleTransitionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LifecycleTransition `json:"items"`
}

// StateName is a CamelCase lifecycle state, such as DrainStarted.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:Pattern=`^[A-Z][A-Za-z0-9]*$`
type StateName string

// LifecycleTransitionSpec describes a lifecycle transition.
// +kubebuilder:validation:XValidation:rule="self.start != self.end",message="start and end must differ",fieldPath=".end"
// +kubebuilder:validation:XValidation:rule="(has(self.nodeName) ? 1 : 0) + (has(self.nodeSelector) ? 1 : 0) + ((has(self.allNodes) && self.allNodes) ? 1 : 0) == 1",message="exactly one of nodeName, nodeSelector or allNodes=true must be set"
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
type LifecycleTransitionSpec struct {
	// start identifies the initial state of the lifecycle transition.
	// +required
	Start StateName `json:"start"`

	// end identifies the desired terminal state of the lifecycle transition.
	// +required
	End StateName `json:"end"`

	// nodeName identifies the one Node whose driver can perform the transition.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName *string `json:"nodeName,omitempty"`

	// nodeSelector selects the Nodes whose drivers can perform the transition.
	// +optional
	NodeSelector *corev1.NodeSelector `json:"nodeSelector,omitempty"`

	// allNodes says that every Node's driver can perform the transition.
	// +optional
	AllNodes *bool `json:"allNodes,omitempty"`

	// sla is the time allowed from claim to the end state; positive, at most 30 days.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) <= duration('720h')",message="sla must be positive and at most 720h (30 days)"
	Sla *metav1.Duration `json:"sla,omitempty"`

	// driver is the driver that performs the transition, as
	// <dns-subdomain>/<name>, e.g. lifecycle-agent.x-k8s.io/drain.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="!self.contains('/') || (self.split('/')[0].size() <= 253 && self.split('/')[1].size() <= 63)",message="driver must be <dns-subdomain (at most 253)>/<name (at most 63)>"
	Driver string `json:"driver"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=le
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.bindingNode`
// +kubebuilder:printcolumn:name="Transition",type=string,JSONPath=`.spec.transitionName`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.claimStatus`
// +kubebuilder:printcolumn:name="Step",type=string,JSONPath=`.status.currentStep`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
// +kubebuilder:selectablefield:JSONPath=`.spec.bindingNode`
// +kubebuilder:selectablefield:JSONPath=`.status.claimStatus`

// LifecycleEvent is a request to run one transition on one node. The agent of
// spec.bindingNode claims it, runs it and reports progress in status.
type LifecycleEvent struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec names the transition and the node. Immutable.
	// +required
	Spec LifecycleEventSpec `json:"spec"`

	// status reports the claim and the progress of the transition.
	// +optional
	Status LifecycleEventStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// LifecycleEventList contains a list of LifecycleEvent resources.
type LifecycleEventList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LifecycleEvent `json:"items"`
}

// LifecycleEventSpec names the transition to run and the node to run it on.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
type LifecycleEventSpec struct {
	// transitionName refers to a LifecycleTransition object by name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	TransitionName string `json:"transitionName"`

	// bindingNode is the Node whose agent may claim the event.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	BindingNode string `json:"bindingNode"`

	// parameters (ext) are passed to the driver, which validates them.
	// At most 32 entries; keys up to 63 characters, values up to 1024.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() <= 63 && k.matches('^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'))",message="parameter names must be at most 63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
	// +kubebuilder:validation:XValidation:rule="self.all(k, self[k].size() <= 1024)",message="parameter values must be at most 1024 characters"
	Parameters map[string]string `json:"parameters,omitempty"`

	// disruption (ext) is an optional cross-node budget: before its first
	// disruptive step the agent must hold one of maxConcurrent slots of group.
	// +optional
	Disruption *DisruptionBudget `json:"disruption,omitempty"`
}

// DisruptionBudget (ext) limits how many nodes of a group are disrupted at once.
type DisruptionBudget struct {
	// group names the set of nodes sharing the budget, e.g. rack-12. The slots
	// are Leases <group>-0 … <group>-(maxConcurrent-1) in lifecycle-system.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=56
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Group string `json:"group"`

	// maxConcurrent is how many nodes of the group may be disrupted at once.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxConcurrent int32 `json:"maxConcurrent"`
}

// LifecycleEventClaimStatus is the phase of a LifecycleEvent.
// +kubebuilder:validation:Enum=Pending;Claimed;Failed;SlaExpired;Succeeded
type LifecycleEventClaimStatus string

// The phases of a LifecycleEvent, as in the KEP.
const (
	LifecycleEventPending    LifecycleEventClaimStatus = "Pending"
	LifecycleEventClaimed    LifecycleEventClaimStatus = "Claimed"
	LifecycleEventFailed     LifecycleEventClaimStatus = "Failed"
	LifecycleEventSlaExpired LifecycleEventClaimStatus = "SlaExpired"
	LifecycleEventSucceeded  LifecycleEventClaimStatus = "Succeeded"
)

// Finished reports whether s is an end state.
func (s LifecycleEventClaimStatus) Finished() bool {
	return s == LifecycleEventFailed || s == LifecycleEventSlaExpired || s == LifecycleEventSucceeded
}

// LifecycleEventStatus reports the claim and the progress of the transition.
type LifecycleEventStatus struct {
	// claimStatus is the current phase of the event.
	// +optional
	ClaimStatus LifecycleEventClaimStatus `json:"claimStatus,omitempty"`

	// sla is the deadline: claim time + the transition's sla.
	// +optional
	Sla *metav1.Time `json:"sla,omitempty"`

	// driver is copied from the transition at claim time.
	// +optional
	Driver LifecycleDriverStatus `json:"driver,omitempty"`

	// holder (ext) says which agent runs the event.
	// +optional
	Holder *Holder `json:"holder,omitempty"`

	// currentStep (ext) is the name of the step running now, or the last one.
	// +optional
	CurrentStep string `json:"currentStep,omitempty"`

	// steps (ext) is the journal of the transition, as the cluster sees it.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Steps []StepStatus `json:"steps,omitempty"`

	// conditions (ext): at least Progressing and WaitingForDisruptionBudget.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// message (ext) is the last human-readable word on the event.
	// +optional
	Message string `json:"message,omitempty"`

	// completionTime (ext) is when the event reached an end state.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// LifecycleDriverStatus is a copy of the transition's driver, start and end.
type LifecycleDriverStatus struct {
	// name is a copy of the driver name from the LifecycleTransition.
	// +optional
	Name string `json:"name,omitempty"`

	// start is a copy of the start state from the LifecycleTransition.
	// +optional
	Start string `json:"start,omitempty"`

	// end is a copy of the end state from the LifecycleTransition.
	// +optional
	End string `json:"end,omitempty"`
}

// Holder (ext) identifies the agent that claimed the event.
type Holder struct {
	// identity is the agent's identity, e.g. node-a/<pid>.
	Identity string `json:"identity"`
	// bootID is the node's boot ID when the event was claimed.
	// +optional
	BootID string `json:"bootID,omitempty"`
	// claimTime is when the agent claimed the event.
	// +optional
	ClaimTime *metav1.Time `json:"claimTime,omitempty"`
	// renewTime is when the agent last said it is still working on the event.
	// +optional
	RenewTime *metav1.Time `json:"renewTime,omitempty"`
}

// StepState is the state of one step.
// +kubebuilder:validation:Enum=Pending;Running;Done;Failed;Skipped
type StepState string

// Step states as shown in status.steps.
const (
	StepPending StepState = "Pending"
	StepRunning StepState = "Running"
	StepDone    StepState = "Done"
	StepFailed  StepState = "Failed"
	StepSkipped StepState = "Skipped"
)

// StepStatus (ext) is one step of the transition.
type StepStatus struct {
	// name of the step, e.g. cordon.
	Name string `json:"name"`
	// state of the step.
	State StepState `json:"state"`
	// attempt counts the tries of this step, from 1.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	FinishTime *metav1.Time `json:"finishTime,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// Condition types on a LifecycleEvent.
const (
	ConditionProgressing                = "Progressing"
	ConditionWaitingForDisruptionBudget = "WaitingForDisruptionBudget"
)

// Finalizer is added by the agent right after it claims an event and removed
// when it writes an end state.
const Finalizer = "lifecycle.x-k8s.io/agent"

// AnnotationCordonedBy on a Node records that the agent owns the cordon.
const AnnotationCordonedBy = "lifecycle.x-k8s.io/cordoned-by"

// AnnotationResolvedPlan on a LifecycleEvent is the plan the agent fixed
// at claim (a JSON object of the "resolved." parameters: the readiness
// snapshot, gpu-reset's GPUs), written with the finalizer, in the same
// update. The journal holds the same plan; the annotation is read only
// when an agent adopts an event it claimed and its journal has no record
// of it (lost, re-imaged), so that it does not fix the plan again from a
// node the event already disrupted.
const AnnotationResolvedPlan = "lifecycle.x-k8s.io/resolved-plan"

// Node condition types written by the agent: LifecycleTransition (the
// LifecycleEvent proposal), the five Node Lifecycle Conditions of KEP-5683
// as merged (the same strings as k8s.io/api core/v1's NodeDrainInProgress
// … constants; untyped here, checked by a test), GPUHealthy and
// RebootRequired (ours).
const (
	NodeConditionLifecycleTransition            = "LifecycleTransition"
	NodeConditionDrainInProgress                = "DrainInProgress"
	NodeConditionDrained                        = "Drained"
	NodeConditionMaintenancePlanned             = "MaintenancePlanned"
	NodeConditionMaintenanceInProgress          = "MaintenanceInProgress"
	NodeConditionGracefulNodeShutdownInProgress = "GracefulNodeShutdownInProgress"
	NodeConditionGPUHealthy                     = "GPUHealthy"
	// NodeConditionRebootRequired: the node needs a reboot (its sentinel
	// file exists, or its sentinel command says so); internal/needs.
	NodeConditionRebootRequired = "RebootRequired"
	// NodeConditionGPUResetRequired: some GPU asks for a reset (its
	// recovery action, a pending row remap, a reset-class XID);
	// internal/gpuhealth.
	NodeConditionGPUResetRequired = "GPUResetRequired"
	// NodeConditionGPUReplacementRequired: some GPU is failing and needs
	// service (row remapping failed, XID 64); internal/gpuhealth.
	NodeConditionGPUReplacementRequired = "GPUReplacementRequired"
)

// NodeConditionTypes is every Node condition type the agent writes, in the
// order tools show them (kubectl lifecycle status).
var NodeConditionTypes = []string{
	NodeConditionLifecycleTransition,
	NodeConditionMaintenancePlanned,
	NodeConditionDrainInProgress,
	NodeConditionDrained,
	NodeConditionMaintenanceInProgress,
	NodeConditionGracefulNodeShutdownInProgress,
	NodeConditionGPUHealthy,
	NodeConditionRebootRequired,
	NodeConditionGPUResetRequired,
	NodeConditionGPUReplacementRequired,
}

// SystemNamespace holds the per-node and disruption-slot Leases.
const SystemNamespace = "lifecycle-system"

// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=llease
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.spec.holderIdentity`
// +kubebuilder:printcolumn:name="Event",type=string,JSONPath=`.metadata.annotations.lifecycle\.x-k8s\.io/event`
// +kubebuilder:printcolumn:name="Renewed",type=date,JSONPath=`.spec.renewTime`

// LifecycleLease (ext) is a coordination Lease of our own group. The agent
// holds one per node (node-<name>) while an event is claimed, and one slot
// per disruption budget (<group>-<i>), in namespace lifecycle-system.
//
// Why not coordination.k8s.io Leases: the agent runs as the kubelet
// (system:node:<name>), and the NodeRestriction admission plugin lets node
// identities touch Leases only in kube-node-lease, and there only the one
// named after the node. The spec is coordination/v1's LeaseSpec, unchanged.
type LifecycleLease struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is a coordination/v1 LeaseSpec.
	// +optional
	Spec coordinationv1.LeaseSpec `json:"spec,omitempty"`
}

// +kubebuilder:object:root=true

// LifecycleLeaseList contains a list of LifecycleLease resources.
type LifecycleLeaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LifecycleLease `json:"items"`
}
