// Package docs checks the operator documentation (docs/*.md, README.md)
// against the code, so that what an operator copies from it works.
//
// TestQuickStart: the docs' commands are the real ones. It takes every
// command of the ```sh blocks of docs/quickstart.md, in order, and runs each
// with bash (-o pipefail, a fresh shell per command) against a real control
// plane (test/testenv, with kube-controller-manager and the manifests
// installed), with:
//
//   - the real binaries, built with the project's tag into <tmp>/bin:
//     lifecycle-agent (./cmd/lifecycle-agent) and kubectl-lifecycle
//     (./cmd/kubectl-lifecycle), first on PATH;
//   - a Node $NODE (registered Ready, with a kubelet stand-in and three pods
//     of a StatefulSet behind a PodDisruptionBudget, minAvailable 2, that
//     are replaced on a spare node), and the agent running in the
//     background as that node (`lifecycle-agent run`, the node's own
//     identity system:node:$NODE, host.mode simulate), as systemd runs it on
//     a node with the package;
//   - the agent's configuration in a file named by LIFECYCLE_AGENT_CONFIG,
//     as /etc/lifecycle-agent/config.yaml is on a node: nodeName, the node's
//     kubeconfig, the journal and socket under <tmp> (the test cannot use
//     /var/lib and /run), host.mode simulate and drain.evictRetryDelay 1s.
//     The node-side commands of the quick start (doctor, status, request)
//     therefore read the same configuration as the agent;
//   - a private logind on a private D-Bus (internal/host/logindtest, logind's
//     default InhibitDelayMaxSec of 5s) in DBUS_SYSTEM_BUS_ADDRESS, so that
//     doctor's logind check and the agent's shutdown delay lock have one;
//   - KUBECONFIG set to an admin kubeconfig (env.WriteKubeconfigFor("admin")),
//     for kubectl.
//
// kubectl: the test's PATH has a `kubectl` that is this test binary (a
// symlink; TestMain looks at its name). It does exactly two things and
// refuses everything else with exit 127 and a message: `kubectl lifecycle
// ARGS...` executes kubectl-lifecycle ARGS... from PATH, as kubectl's plugin
// mechanism does; `kubectl apply -f -` applies the YAML stream on stdin with
// testenv.Apply (server-side apply, as the kubeconfig's user) — the same
// call InstallManifests made before the quick start ran, so the quick
// start's apply is a real, idempotent re-apply. No real kubectl is needed
// or used (a machine may have none, or another version).
//
// A command must exit 0, unless its line carries a trailing comment
// "# exits N" (N a number), which the test requires instead. Each command
// runs in its own shell: the quick start may not rely on shell state, so
// lines that only set a variable (FOO=bar, export FOO=bar) or start with a
// prompt ("$ ") are refused, as are blocks with fewer commands than the
// quick start is known to have. After the last command the test checks what
// an operator would see: the drain event Succeeded and evicted the pods,
// and the node is schedulable again.
//
// TestRelativeLinks: every relative link in docs/*.md and README.md points
// to a file that exists, and a #fragment into a Markdown file names one of
// its headings (GitHub's anchors). TestGrafanaDashboard: the dashboard is
// valid JSON with the panels docs/metrics.md promises, and every
// lifecycle_agent_* name in the dashboard and in docs/*.md is a metric the
// code registers.
//
// TestQuickStart needs the control plane and builds binaries: it is skipped
// with -short. The others always run.
package docs
