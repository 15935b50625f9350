// Package apiclient is the agent's only door to the Kubernetes API (client-go
// and kubectl's drain library are imported here and nowhere else in the
// agent). It offers verbs, not objects:
//
//   - typed access to LifecycleEvents and LifecycleTransitions (typed.go),
//     built on client-go's generic typed client;
//   - a watch of this node's events only, filtered server-side with the field
//     selector spec.bindingNode=<node> (watch.go), so that a fleet of N
//     nodes costs the server N small watches;
//   - status updates with resourceVersion preconditions (a 409 tells the
//     loser of a claim race that it lost) and the finalizer
//     lifecycle.x-k8s.io/agent;
//   - Node condition patches: a strategic-merge patch on nodes/status that
//     names only our condition types, so the kubelet's own conditions are
//     never touched (nodes.go);
//   - cordon and uncordon together with the ownership annotation
//     lifecycle.x-k8s.io/cordoned-by, in one patch (nodes.go);
//   - the per-node lease node-<name> and the disruption-budget slot leases
//     <group>-<i> in namespace lifecycle-system (leases.go). They are
//     LifecycleLeases (our group, coordination/v1's LeaseSpec): the
//     NodeRestriction admission plugin refuses node identities every
//     coordination.k8s.io Lease outside kube-node-lease ("can only access
//     leases in the kube-node-lease system namespace", seen on 1.37);
//   - a Kubernetes Event on the LifecycleEvent for each step (events.go);
//   - drain through k8s.io/kubectl/pkg/drain (drain.go), with two bounds the
//     library lacks: EvictErrorRetryDelay is always set (its default of 0 is a
//     hot loop), and client-go's silent retry of a 429 that carries
//     Retry-After (a PDB-blocked eviction; ~100 s inside one call) is turned
//     off for evictions, so the drain loop itself sees each refusal and can
//     report the PDB and the pod.
//
// Identity: by default the kubelet's kubeconfig (system:node:<name>); the
// Node authorizer, NodeRestriction and the policy in deploy/admission.yaml
// confine every write above to this node's own objects.
package apiclient
