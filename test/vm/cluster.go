package vm

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// NodeName is the Node the guest's agent works for (its host name too).
const NodeName = Hostname

// Guest paths the agent reads.
const (
	GuestKubeconfig = "/etc/kubernetes/kubelet.conf"
	GuestConfig     = "/etc/lifecycle-agent/config.yaml"
	GuestStateDir   = "/var/lib/lifecycle-agent"
	Unit            = "lifecycle-agent.service"
)

// Cluster is a real control plane on the host (test/testenv) with the
// lifecycle manifests installed and a Ready Node vm-node.
type Cluster struct {
	Env       *testenv.Env
	Admin     kubernetes.Interface
	Lifecycle *apiclient.LifecycleClients // as test-admin
	Node      string
	// Dir holds the control plane's files and logs and the guest's
	// kubeconfig; it is the run directory of the test's VM too.
	Dir string
	// Kubeconfig is the host path of the guest's kubeconfig: user
	// system:node:vm-node (a client certificate), server
	// https://kubernetes:6443, the test CA.
	Kubeconfig string
	// Kubelet finishes pods bound to vm-node as a kubelet would (there is
	// none in the guest), so that a drain completes; with RealKubelet it
	// plays SpareNode's kubelet instead.
	Kubelet *testenv.KubeletStandIn
}

// ClusterOptions change what StartClusterWith sets up.
type ClusterOptions struct {
	// RealKubelet: the guest's own kubelet registers vm-node (test/vm
	// realnode_test.go), so no Node vm-node is created and no stand-in
	// plays its kubelet. kube-controller-manager runs (PDB status,
	// ServiceAccounts), and a Node SpareNode with a kubelet stand-in takes
	// the replacements of evicted pods (Cluster.Kubelet is its stand-in).
	RealKubelet bool
	// AuditLog makes kube-apiserver write its audit log of pod creates,
	// deletes and evictions (testenv.Options.AuditLog; AuditEvictions
	// reads it).
	AuditLog bool
}

// SpareNode is the host-side Node (a kubelet stand-in) of a RealKubelet
// cluster, where replacements of evicted pods land.
const SpareNode = "spare-node"

// StartCluster starts the control plane, installs deploy/ and creates the
// Node vm-node with a Ready condition. Everything stops when the test ends.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterOptions{})
}

// StartClusterWith is StartCluster with options.
func StartClusterWith(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	RequireHostTools(t)
	dir := RunDir(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	logf, err := os.Create(filepath.Join(dir, "testenv.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	env, err := testenv.Start(ctx, testenv.Options{Log: logf, Dir: filepath.Join(dir, "testenv"), ControllerManager: opts.RealKubelet, AuditLog: opts.AuditLog})
	if err != nil {
		t.Fatalf("vm: cannot start the test control plane: %v", err)
	}
	t.Cleanup(env.Stop)
	if err := env.InstallManifests(ctx); err != nil {
		t.Fatalf("vm: install manifests: %v", err)
	}
	admin, err := kubernetes.NewForConfig(env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	lc, err := apiclient.NewLifecycleClients(env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Env: env, Admin: admin, Lifecycle: lc, Node: NodeName, Dir: dir}

	standIn := NodeName
	if opts.RealKubelet {
		standIn = SpareNode
		if err := testenv.CreateNode(ctx, env.AdminConfig(), SpareNode, map[string]string{"kubernetes.io/hostname": SpareNode}); err != nil {
			t.Fatalf("vm: create node %s: %v", SpareNode, err)
		}
	} else {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: map[string]string{
			"kubernetes.io/hostname": NodeName, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		}}}
		if _, err = admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("vm: create node: %v", err)
		}
		c.SetNodeReady(t, true)
	}
	// Pods need their ServiceAccount (admission); there is no controller
	// manager to create it.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "default"}}
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("vm: create service account default/default: %v", err)
	}

	cfg := env.NodeConfig(NodeName)
	cfg.Host = GuestAPIServer
	c.Kubeconfig = filepath.Join(dir, "kubelet.conf")
	if err := testenv.WriteKubeconfig(c.Kubeconfig, cfg); err != nil {
		t.Fatalf("vm: write the guest kubeconfig: %v", err)
	}

	kctx, kcancel := context.WithCancel(context.Background())
	t.Cleanup(kcancel)
	if c.Kubelet, err = testenv.RunKubeletStandIn(kctx, env.AdminConfig(), standIn); err != nil {
		t.Fatalf("vm: kubelet stand-in: %v", err)
	}
	Timings.Record("control plane start", time.Since(start))
	t.Logf("vm: control plane at %s (guest: %s), dir %s", env.URL, GuestAPIServer, dir)
	return c
}

// APIForward is the host address the VM forwards https://kubernetes:6443 to.
func (c *Cluster) APIForward() string {
	u, err := url.Parse(c.Env.URL)
	if err != nil {
		panic(err)
	}
	return u.Host
}

// StartVM boots a VM wired to this cluster (same run directory).
func (c *Cluster) StartVM(t testing.TB) *VM {
	t.Helper()
	return c.StartVMWith(t, Options{})
}

// StartVMWith is StartVM with options (Dir is the cluster's; APIForward
// too unless set, e.g. to a testenv.CutProxy in front of the API server).
func (c *Cluster) StartVMWith(t testing.TB, opts Options) *VM {
	t.Helper()
	if opts.APIForward == "" {
		opts.APIForward = c.APIForward()
	}
	opts.Dir = c.Dir
	return Start(t, opts)
}

// SetNodeReady sets the kubelet's Ready condition on the Node (there is no
// kubelet: the test plays it).
func (c *Cluster) SetNodeReady(t testing.TB, ready bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	status, reason := corev1.ConditionTrue, "KubeletReady"
	if !ready {
		status, reason = corev1.ConditionFalse, "KubeletNotReady"
	}
	for i := 0; ; i++ {
		n, err := c.Admin.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("vm: get node: %v", err)
		}
		now := metav1.Now()
		found := false
		for j := range n.Status.Conditions {
			if n.Status.Conditions[j].Type == corev1.NodeReady {
				n.Status.Conditions[j].Status, n.Status.Conditions[j].Reason = status, reason
				n.Status.Conditions[j].LastHeartbeatTime, n.Status.Conditions[j].LastTransitionTime = now, now
				found = true
			}
		}
		if !found {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason,
				Message: "set by the VM test", LastHeartbeatTime: now, LastTransitionTime: now})
		}
		if _, err = c.Admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err == nil {
			return
		} else if i > 10 {
			t.Fatalf("vm: set node Ready=%v: %v", ready, err)
		}
	}
}

// ProvisionNode writes what the kubelet's provisioning would leave on a
// node: the kubelet kubeconfig (/etc/kubernetes/kubelet.conf, 0600) and the
// agent's config (/etc/lifecycle-agent/config.yaml, 0600, nodeName: vm-node
// plus extraConfig, YAML at the top level).
func (c *Cluster) ProvisionNode(t testing.TB, v *VM, extraConfig string) {
	t.Helper()
	kc, err := os.ReadFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	v.WriteFile(GuestKubeconfig, kc, 0o600)
	v.WriteFile(GuestConfig, []byte("nodeName: "+NodeName+"\n"+extraConfig), 0o600)
}

// FindDeb returns the package under test: $LIFECYCLE_AGENT_DEB, or the
// newest dist/lifecycle-agent_*_amd64.deb. It fails the test when there is
// none.
func FindDeb(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("LIFECYCLE_AGENT_DEB"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("vm: LIFECYCLE_AGENT_DEB=%s: %v", p, err)
		}
		return p
	}
	dist := filepath.Join(testenv.RepoRoot(), "dist")
	if d := os.Getenv("DIST"); d != "" {
		dist = d
	}
	matches, _ := filepath.Glob(filepath.Join(dist, "lifecycle-agent_*_amd64.deb"))
	if len(matches) == 0 {
		t.Fatalf("vm: %s/lifecycle-agent_*_amd64.deb not found: run make deb (or set LIFECYCLE_AGENT_DEB)", dist)
	}
	sort.Slice(matches, func(i, j int) bool {
		a, _ := os.Stat(matches[i])
		b, _ := os.Stat(matches[j])
		return a.ModTime().After(b.ModTime())
	})
	return matches[0]
}

// InstallDeb copies the package into the guest and installs it with dpkg
// -i, keeping the configuration files already there (a provisioned node).
// It returns dpkg's output.
func InstallDeb(t testing.TB, v *VM, deb string) string {
	t.Helper()
	return dpkgInstall(t, v, deb, "--force-confdef --force-confold ", " 2>&1", "dpkg -i")
}

// dpkgInstall copies deb into the guest and runs dpkg -i with opts before
// and redirect after the path; timing names the Timings entry.
func dpkgInstall(t testing.TB, v *VM, deb, opts, redirect, timing string) string {
	t.Helper()
	dst := "/root/pkgs/" + filepath.Base(deb)
	v.MustRun("mkdir -p /root/pkgs")
	v.CopyIn(deb, dst)
	start := time.Now()
	out := v.MustRun("DEBIAN_FRONTEND=noninteractive dpkg -i " + opts + shellQuote(dst) + redirect)
	Timings.Record(timing, time.Since(start))
	return out
}

// UpgradeDeb installs a newer package over the installed one as an
// unattended upgrade does: plain dpkg -i, no --force-conf* option and no
// terminal (stdin /dev/null), so that a conffile prompt would fail it. It
// returns dpkg's output.
func UpgradeDeb(t testing.TB, v *VM, deb string) string {
	t.Helper()
	return dpkgInstall(t, v, deb, "", " </dev/null 2>&1", "dpkg -i (upgrade)")
}

// WaitAgentActive waits until systemd reports the agent's unit active (it is
// Type=notify: active means READY=1 was sent).
func WaitAgentActive(t testing.TB, v *VM, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, "lifecycle-agent.service active", func() (bool, string) {
		out, _, _, err := v.Try("systemctl is-active " + Unit)
		if err != nil {
			return false, err.Error()
		}
		return strings.TrimSpace(out) == "active", strings.TrimSpace(out)
	}, func() string {
		out, _, _, _ := v.Try("systemctl --no-pager status " + Unit + "; journalctl --no-pager -n 30 -u " + Unit)
		return out
	})
}

// Eventually polls cond every 250 ms until it reports true, or fails the
// test after timeout with cond's last word and, if given, more detail.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string), detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		if time.Now().After(deadline) {
			var more []string
			for _, d := range detail {
				more = append(more, d())
			}
			t.Fatalf("vm: timed out after %s waiting for %s; last: %s\n%s", timeout, what, last, strings.Join(more, "\n"))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Event returns the LifecycleEvent name, as admin.
func (c *Cluster) Event(t testing.TB, name string) *v1alpha1.LifecycleEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev, err := c.Lifecycle.Events.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("vm: get event %s: %v", name, err)
	}
	return ev
}

// CreateEvent creates a LifecycleEvent for this node, as admin.
func (c *Cluster) CreateEvent(t testing.TB, name, transition string, params map[string]string) *v1alpha1.LifecycleEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev := &v1alpha1.LifecycleEvent{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.LifecycleEventSpec{TransitionName: transition, BindingNode: c.Node, Parameters: params},
	}
	ev, err := c.Lifecycle.Events.Create(ctx, ev, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("vm: create event %s: %v", name, err)
	}
	t.Logf("vm: created LifecycleEvent %s (transition %s, node %s)", name, transition, c.Node)
	return ev
}

// WaitTransition waits until the agent has published the transition name.
func (c *Cluster) WaitTransition(t testing.TB, name string, timeout time.Duration) *v1alpha1.LifecycleTransition {
	t.Helper()
	var lt *v1alpha1.LifecycleTransition
	Eventually(t, timeout, "LifecycleTransition "+name, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		lt, err = c.Lifecycle.Transitions.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	}, func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := c.Lifecycle.Transitions.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		var names []string
		for _, x := range l.Items {
			names = append(names, x.Name)
		}
		return fmt.Sprintf("transitions published: %v", names)
	})
	return lt
}

// WaitEvent waits until the event satisfies cond, returning the last copy.
// Unlike WatchEvent it keeps waiting when the event has ended (cond may be
// about the end state).
func (c *Cluster) WaitEvent(t testing.TB, name string, timeout time.Duration, what string, cond func(*v1alpha1.LifecycleEvent) bool) *v1alpha1.LifecycleEvent {
	t.Helper()
	var ev *v1alpha1.LifecycleEvent
	Eventually(t, timeout, "event "+name+": "+what, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e, err := c.Lifecycle.Events.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ev = e
		return cond(e), DescribeEvent(e)
	})
	return ev
}

// endedEarly fails the test at once when the event reached an end state
// while a wait expected something else of it.
func endedEarly(t testing.TB, e *v1alpha1.LifecycleEvent, what string) {
	t.Helper()
	if e.Status.ClaimStatus.Finished() {
		t.Fatalf("vm: event %s ended while waiting for %s: %s", e.Name, what, DescribeEvent(e))
	}
}

// Node returns the Node, as admin.
func (c *Cluster) NodeObject(t testing.TB) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := c.Admin.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("vm: get node: %v", err)
	}
	return n
}

// NodeCondition returns the Node's condition of type typ (nil if none).
func NodeCondition(n *corev1.Node, typ string) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// DescribeEvent is a one-line summary of an event's status for messages.
func DescribeEvent(e *v1alpha1.LifecycleEvent) string {
	var steps []string
	for _, s := range e.Status.Steps {
		steps = append(steps, fmt.Sprintf("%s=%s/%d", s.Name, s.State, s.Attempt))
	}
	return fmt.Sprintf("claimStatus=%q step=%q steps=[%s] message=%q", e.Status.ClaimStatus, e.Status.CurrentStep, strings.Join(steps, " "), e.Status.Message)
}

// WatchEvent waits, with a watch (for the least latency: a power cut
// aimed at a given step), until the event satisfies cond, and returns it.
// An event that reaches an end state without satisfying cond fails the test
// at once.
func (c *Cluster) WatchEvent(t testing.TB, name string, timeout time.Duration, what string, cond func(*v1alpha1.LifecycleEvent) bool) *v1alpha1.LifecycleEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	sel := metav1.ListOptions{FieldSelector: "metadata.name=" + name}
	last := "(not seen)"
	for ctx.Err() == nil {
		l, err := c.Lifecycle.Events.List(ctx, sel)
		if err != nil {
			last = err.Error()
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for i := range l.Items {
			last = DescribeEvent(&l.Items[i])
			if cond(&l.Items[i]) {
				return &l.Items[i]
			}
			endedEarly(t, &l.Items[i], what)
		}
		sel.ResourceVersion = l.ResourceVersion
		w, err := c.Lifecycle.Events.Watch(ctx, sel)
		if err != nil {
			continue
		}
		for ev := range w.ResultChan() {
			if e, ok := ev.Object.(*v1alpha1.LifecycleEvent); ok {
				last = DescribeEvent(e)
				if cond(e) {
					w.Stop()
					return e
				}
				endedEarly(t, e, what)
				sel.ResourceVersion = e.ResourceVersion
			}
		}
		w.Stop()
		sel.ResourceVersion = ""
	}
	t.Fatalf("vm: timed out after %s waiting for event %s: %s; last: %s", timeout, name, what, last)
	return nil
}

// Step returns the event's status step name (nil if none).
func Step(e *v1alpha1.LifecycleEvent, name string) *v1alpha1.StepStatus {
	for i := range e.Status.Steps {
		if e.Status.Steps[i].Name == name {
			return &e.Status.Steps[i]
		}
	}
	return nil
}
