// Module kubebin builds the test control plane (kube-apiserver, etcd,
// kube-controller-manager) from the Go module proxy; see hack/kubebin.sh.
// It is a separate module so that k8s.io/kubernetes never enters the agent's
// own dependency graph.
package kubebin
