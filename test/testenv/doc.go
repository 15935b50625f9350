// Package testenv runs a real control plane for tests and for `make demo`:
// etcd, kube-apiserver and (optionally) kube-controller-manager, built from
// the Go module proxy by hack/kubebin.sh and cached outside the clone.
//
// The apiserver listens on a free 127.0.0.1 port with
// --authorization-mode=Node,RBAC and the NodeRestriction admission plugin, as
// a real cluster does. Identities:
//
//   - Admin: user test-admin in system:masters (static token).
//   - Node(name): user system:node:<name> in group system:nodes; node-a and
//     node-b have static tokens, any other name gets an x509 client
//     certificate minted with the test CA.
//   - User(name, groups...): any other identity, by client certificate.
//
// InstallManifests applies deploy/ (CRDs, RBAC, admission policy) and waits
// until the CRDs are Established and the ValidatingAdmissionPolicy is
// enforced (it takes effect about a second after creation).
//
// Every process is started with Pdeathsig=SIGKILL in its own process group
// and stopped by Stop, so a test binary that dies leaves nothing behind.
// Nothing here skips: when the binaries cannot be built or started, Start
// returns an error that says why, and the caller fails.
package testenv
