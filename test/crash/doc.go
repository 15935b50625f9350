// Package crash proves the agent's crash safety (STYLE.md rule 9, DESIGN.md
// §4) on the real binary against the real control plane (test/testenv with
// kube-controller-manager).
//
// TestMain builds bin/lifecycle-agent with every gofail failpoint of
// internal/engine and internal/journal compiled in, without touching the
// working tree: the module's source files are copied into a fixed directory
// under the user cache, `gofail enable` (pinned in hack/tools) rewrites the
// `// gofail:` comments there, the copy requires go.etcd.io/gofail, and the
// binary is built from the copy and cached under
// ~/.cache/lifecycle-agent/failpoint-bin/<hash of the sources>.
//
// TestCrashSafety then drains a node (three pods behind a
// PodDisruptionBudget, a kubelet stand-in, replacements on a spare node)
// once per failpoint — the list is grepped from the `// gofail: var NAME`
// comments, so it cannot drift — with GOFAIL_FAILPOINTS='<name>=1*panic',
// waits for the process to die at that boundary, restarts the agent without
// failpoints on the same journal, and asserts what a user would see: the
// event Succeeded, the node is cordoned by it, each pod was evicted at most
// once (the apiserver's audit log: pods/eviction creates answered 201), and
// status.steps agree with the journal's history (`lifecycle-agent journal
// export`). It does the same for agents SIGKILLed after a random delay
// (seeded; CRASH_SEED=<n> replays a run, CRASH_KILLS=<n> sets how many).
// A failpoint the drain never reached is reported; fewer than 80% fired
// fails the test. Skipped under -short (make test-unit).
package crash
