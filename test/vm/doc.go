// Package vm boots a real Debian bookworm systemd VM under QEMU and drives it
// for the agent's host-integration tests: install the .deb, reboot through
// logind, power off gracefully, cut the power (QMP system_reset) at chosen
// points of a transition, upgrade the package mid-transition, remove and
// purge it.
//
// TestRealNode (issue 18) makes the VM a real Kubernetes node: the image
// carries a kubelet at the control plane's version, containerd 2, runc and
// the CNI plugins, and two local images (hack/nodebin.sh, cached), all
// disabled until the test enables them. The kubelet registers vm-node with
// the agent's credentials; replacements of evicted pods land on a host-side
// stand-in node (SpareNode). Its four scenarios share one VM session (one
// control plane, boot, package install and kubelet join; each starts from
// a Ready, uncordoned node with none of its pods and leaves it so). The
// join is a cold boot: the agent installed and active, containerd and the
// kubelet enabled, then the reset button, so that systemd starts both in
// the units' order, as on a node's first power-on; the logind drop-in race
// is checked there (the agent's file follows 99-kubelet.conf, and the
// boot's journal shows the agent started first):
//
//   - (i) DrainAndUncordon drains real pods behind a PDB (their SIGTERM and
//     exit recorded on a hostPath) and uncordons.
//   - (k) RebootWithPods reboots with real pods and a DaemonSet pod whose
//     readiness lags, the kubelet's graceful node shutdown off (kubeadm's
//     default) and the kubelet starting 20 s late, so the old boot's
//     Ready=True is still on the Node when the agent comes back: wait-ready
//     must wait for status.nodeInfo.bootID of the new boot, and
//     wait-workloads-ready holds the cordon until the DaemonSet pod is Ready.
//   - (l) PowerCutMidDrain cuts the power (QMP system_reset) while a reboot
//     event drains real pods behind a PDB, one pod stopping and two
//     waiting: the new boot's kubelet finishes the stopping pod, the
//     resumed drain evicts the others, the event reboots and ends Succeeded
//     with the node uncordoned; each pod got one SIGTERM, and
//     kube-apiserver's audit log (ClusterOptions.AuditLog) counts the
//     evictions.
//   - (j) Poweroff powers the real node off with the kubelet's graceful node
//     shutdown on: both delay locks held while logind waits (a watcher in
//     the guest records logind's inhibitors), the agent's conditions and
//     cordon on the API server and the pods' SIGTERM and exit before the
//     power-off, then the shutdown closed out and the new boot's Ready.
//
// The image comes from hack/vm/build-image.sh (debootstrap, cached outside
// the clone by a stamp of its inputs; ~3 min cold, 0 s warm) and every Start
// boots a fresh qcow2 overlay on it through hack/vm/run-vm.sh launch, so the
// cached image is never dirtied. /dev/kvm is not usable on the development
// and CI machines: QEMU runs under TCG, a boot takes 12-25 s.
//
// Network: QEMU user networking with restrict=on. The guest reaches exactly
// two things: its own sshd from the host (hostfwd 127.0.0.1:<random> -> :22)
// and, when Options.APIForward is set, the host's test kube-apiserver on
// 127.0.0.1 through guestfwd 10.0.2.100:6443 (hack/vm/relay, one process per
// connection). The image's /etc/hosts names 10.0.2.100 `kubernetes`, a DNS
// name in the test apiserver's serving certificate (test/testenv), so the
// guest's kubeconfig says https://kubernetes:6443 and TLS verifies normally.
//
// Every test's run directory (serial console log, QEMU log, relay log, the
// control plane's logs, the guest's journal on failure) is kept and printed
// when the test fails, and removed when it passes. LIFECYCLE_AGENT_VM_KEEP=1
// keeps it always.
//
// Nothing here skips: missing host tools fail the test with the Debian
// packages to install; a missing .deb fails the scenario tests with "run
// make deb". Only -short skips, saying so.
//
// Environment:
//
//	VM_CACHE_DIR                image cache (default ~/.cache/lifecycle-agent/vm)
//	VM_BOOT_TIMEOUT             seconds to wait for a boot (default 300)
//	VM_MEM, VM_SMP, VM_ACCEL    passed to run-vm.sh
//	LIFECYCLE_AGENT_DEB         the package under test (default: the newest dist/lifecycle-agent_*_amd64.deb)
//	LIFECYCLE_AGENT_VM_DIR      parent of the run directories (default $TMPDIR)
//	LIFECYCLE_AGENT_VM_KEEP     1: keep run directories of passing tests too
package vm
