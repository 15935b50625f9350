//go:build tools

// Module nodebin builds the test node's container runtime from the Go module
// proxy — containerd, its runc shim, runc, the CNI plugins — and the two
// container images the VM's real kubelet runs (pause, and a workload that
// records SIGTERM on a hostPath), for the VM tests' real node (hack/nodebin.sh,
// issue 18). It is a separate module so that none of this enters the agent's
// dependency graph; nothing here is shipped in the package.
package nodebin

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/opencontainers/runc"
)
