package vm

import (
	"testing"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// PodRequest is one pod request of kube-apiserver's audit log
// (ClusterOptions.AuditLog): testenv.PodRequest.
type PodRequest = testenv.PodRequest

// PodRequests reads the audit log: every completed pod request of
// namespace ns, in the order the API server answered them.
func (c *Cluster) PodRequests(t testing.TB, ns string) []PodRequest {
	t.Helper()
	path := c.Env.AuditLogPath()
	if path == "" {
		t.Fatalf("vm: no audit log: start the cluster with ClusterOptions.AuditLog")
	}
	reqs, err := testenv.PodRequests(path, ns)
	if err != nil {
		t.Fatalf("vm: %v", err)
	}
	return reqs
}
