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
// Sample outputs: docs are outputs, not hopes. An output block — a fenced
// block with the info string text, console, json or none — carries a
// marker on the line before its fence (outputs_test.go has the grammar):
// <!-- output: test/docs --> (the output of the ```sh block right before
// it, or of the "$ " lines in it), <!-- output: test/docs: COMMAND -->
// (of a command the reader does not see, such as `lifecycle-agent doctor
// 2>/dev/null | grep '^✗ logind'`), or <!-- output: from SOURCE --> for a
// sample this test cannot produce, saying where it comes from.
// TestOutputMarkers (always) refuses an output block without a marker.
// TestQuickStart, after the quick start and its checks, compares every
// checked block with what its command prints: the quick start's with the
// outputs of its own commands, the other files' by running their commands
// then, in the same environment, in file order (a command that is also one
// of the quick start's is not run again). Both sides are normalised for
// what changes from run to run: RFC 3339 times, clock times, durations,
// the request's date stamp and generateName suffixes in event and pod names,
// agent identities, UUIDs and runs of spaces; a "…" in the doc stands for
// any text; "(progress varies)" at the end of a marker compares only the
// first and the last line, for outputs whose progress lines depend on
// timing. The output is shown with the test's paths and addresses as a
// node's defaults (/etc/lifecycle-agent/config.yaml, the API server as
// https://10.0.0.10:6443, ...) and, in docs/plugin.md, the node as node-a.
// A hidden command may prepare what its sample needs (docs/plugin.md's
// uncordon the node first, and sleep a second where kubectl lifecycle
// history, which orders by whole-second completion times and then by
// name, would otherwise list two events of the same second by name; for
// the same reason each command of the other files starts in a wall-clock
// second after the one the previous command ended in).
// For the samples of failing doctor checks the commands see
// DOCS_LOGIND_SHORT (a second private logind, InhibitDelayMaxSec 2s) and
// DOCS_CONFIG_CORRUPT_JOURNAL (the node's configuration with a corrupt
// journal file); for the sample of a queued request, DOCS_OFFLINE_AGENT (a
// script that runs its arguments against a second agent for the node whose
// API server is a closed port); for a drain held by a PodDisruptionBudget
// until its SLA passes, DOCS_BUDGET_SCENARIO blocked|expired (a script that
// applies a ReplicaSet with one pod on the node, a budget minAvailable 1, a
// drain transition with a 15s SLA and an event for it, follows the event to
// its end, and prints its message while blocked or at the end). A mismatch fails with a diff and the block to paste;
// UPDATE_DOCS=1 go test -tags kustomize_disable_go_plugin_support
// -run 'TestQuickStart$' ./test/docs/ rewrites every checked block from one
// run instead (a block with a "…" only when it differs).
//
// The output blocks (docs/benchmarks.md aside: bench checks its tables):
//
//	docs/quickstart.md  doctor, status, transitions, request drain --wait
//	                    (progress varies), kubectl lifecycle status,
//	                    request os-upgrade (refused), uncordon (progress
//	                    varies), history, status again      test/docs
//	docs/install.md     doctor                              test/docs
//	docs/pipelines.md   request os-upgrade (refused); request drain -o json
//	                    --wait and request drain --wait (progress varies)
//	                                                        test/docs
//	                    a queued request (DOCS_OFFLINE_AGENT)
//	                                                        test/docs
//	docs/plugin.md      transitions; drain (progress varies); run upgrade
//	                    (refused); status EVENT; history; drain -o json
//	                                                        test/docs
//	                    three rollouts (five nodes, five agents)
//	                                                        from test/plugin
//	                    TestRolloutMaxConcurrent, TestRolloutMaxFailures,
//	                    TestRolloutResumesAfterKill
//	docs/troubleshooting.md  doctor's ✗ journal (corrupt), ✗ logind (2s),
//	                    ✓ nvml                              test/docs
//	                    a PodDisruptionBudget refusal, an SLA expiry message
//	                    (DOCS_BUDGET_SCENARIO)              test/docs
//	docs/shutdown.md    doctor's ✗ logind (2s)              test/docs
//	docs/gpu.md         gpu xids with a GPU                 from (needs NVML)
//	docs/conditions.md  a condition sequence                unmarked, allowed
//	                    in unmarkedAllowed (test/e2e TestNodeConditionSequences)
//
// TestRelativeLinks: every relative link in docs/*.md and README.md points
// to a file that exists, and a #fragment into a Markdown file names one of
// its headings (GitHub's anchors). TestGrafanaDashboard: the dashboard is
// valid JSON with the panels docs/metrics.md promises, and every
// lifecycle_agent_* name in the dashboard and in docs/*.md is a metric the
// code registers.
//
// TestQuickStart needs the control plane and builds binaries: it is skipped
// with -short, and so are the sample outputs' comparisons. The others
// (TestOutputMarkers included) always run.
package docs
