package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	daemon "github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/internal/maintenance"
	"github.com/lifecycle-agent/lifecycle-agent/internal/notify"
)

// Bounds of the checks that do not talk to the API (those use apiTimeout).
const (
	doctorJournalTimeout = 30 * time.Second // the integrity-check subprocess included
	doctorJournalLock    = 2 * time.Second  // a running agent holds the lock: do not wait long
	doctorLogindTimeout  = 5 * time.Second
	doctorNVMLTimeout    = 30 * time.Second // nvmlInit can be slow on a large machine
)

// maxClockSkew is the largest offset from the API server's clock that
// doctor accepts. Leases last 40 s and are renewed every ~13 s, so two nodes
// may disagree by up to ~26 s before one takes a live lease as expired; 5 s
// from the server keeps any two nodes within 10 s of each other, well inside
// that, and above the ±1 s error of a measurement from a Date header.
const maxClockSkew = 5 * time.Second

// fixManifests installs the CRDs, the RBAC and the admission policy (a
// pipe, not bash's <(...): any shell, and sudo, run it).
const fixManifests = "lifecycle-agent manifests | kubectl apply -f -"

type doctorOptions struct {
	Output     string // outText or outJSON
	NotifyTest bool   // send a test message to each of notifications.urls
}

func newDoctorCmd(e *env) *cobra.Command {
	var o doctorOptions
	cmd := &cobra.Command{
		Use:   "doctor [-o text|json]",
		Short: "Check that this node is ready for the agent",
		Long: `Check the configuration, the journal, API access, identity and RBAC
(SelfSubjectReview, SelfSubjectAccessReview), the CRDs, the node-scope
admission policy (with a server-side dry run, which changes nothing), logind
and its InhibitDelayMaxSec against shutdown.budget, NVML and the clock
against the API server's (at most 5s apart), the maintenance windows and
gates, and the notification targets (with --notify-test, by sending each a
test message). Prints one line per check, ✓ or ✗, with a fix for each ✗;
exits 1 when any check fails. Every check is bounded in time: API checks by
apiTimeout, a test message by notifications.timeout.`,
		Args:        noArgs,
		Annotations: needsConfig,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Output, err = outputOf(cmd, o.Output, outText, outJSON); err != nil {
				return err
			}
			return failed(runDoctor(cmd.Context(), e, o))
		},
	}
	addOutputFlags(cmd, &o.Output, outText, outJSON)
	cmd.Flags().BoolVar(&o.NotifyTest, "notify-test", false, "send a test message to each of notifications.urls")
	return cmd
}

// check is one line of doctor's report.
type check struct {
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
	Message string `json:"message"`
	Fix     string `json:"fix,omitempty"`
}

func (c check) String() string {
	mark := "✓"
	if !c.OK {
		mark = "✗"
	}
	s := mark + " " + c.Name + ": " + c.Message
	if c.Fix != "" {
		s += " — fix: " + c.Fix
	}
	return s
}

func pass(name, format string, args ...any) check {
	return check{Name: name, OK: true, Message: oneLine(fmt.Sprintf(format, args...))}
}

func fail(name, fix, format string, args ...any) check {
	return check{Name: name, Message: oneLine(fmt.Sprintf(format, args...)), Fix: fix}
}

// runDoctor is `lifecycle-agent doctor`.
func runDoctor(ctx context.Context, e *env, o doctorOptions) error {
	var checks []check
	report := func(cs ...check) {
		for _, c := range cs {
			checks = append(checks, c)
			if o.Output != outJSON {
				fmt.Fprintln(e.stdout, c)
			}
		}
	}
	report(doctorConfig(e.cfg))
	report(doctorJournal(ctx, e.cfg))
	doctorAPI(ctx, e.cfg, report)
	report(doctorLogind(ctx, e.cfg))
	report(doctorNVML(ctx, e.cfg))
	report(doctorMaintenance(ctx, e.cfg, time.Now())...)
	report(doctorNotify(ctx, e.cfg, o.NotifyTest)...)

	bad := 0
	for _, c := range checks {
		if !c.OK {
			bad++
		}
	}
	if o.Output == outJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			OK     bool    `json:"ok"`
			Checks []check `json:"checks"`
		}{bad == 0, checks}); err != nil {
			return err
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d checks failed", bad, len(checks))
	}
	return nil
}

// doctorConfig names every file the configuration was read from, lowest
// layer first (the package's drop-ins, config.yaml, the admin's drop-ins),
// so an admin sees which drop-in is in play.
func doctorConfig(cfg *config.Config) check {
	src := strings.Join(cfg.Files, ", ")
	if src == "" {
		src = cfg.Path
	}
	if src == "" {
		src = "defaults (no " + config.DefaultPath + ")"
	}
	return pass("config", "%s (node %s)", src, cfg.NodeName)
}

func doctorJournal(ctx context.Context, cfg *config.Config) check {
	path := cfg.JournalPath
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return pass("journal", "%s not created yet (the agent creates it at start)", path)
	}
	ctx, cancel := context.WithTimeout(ctx, doctorJournalTimeout)
	defer cancel()
	opts := journalOptions()
	opts.LockTimeout = doctorJournalLock
	opts.CheckTimeout = doctorJournalTimeout
	s, err := journal.Verify(ctx, path, opts)
	switch {
	case err == nil:
		return pass("journal", "%s: schema %d, %d events, %d steps, %d outbox, %d history (%d bytes)",
			path, s.SchemaVersion, s.Events, s.Steps, s.Outbox, s.History, s.SizeBytes)
	case errors.Is(err, journal.ErrLocked):
		return pass("journal", "%s is locked by another process (the running agent, which checked it when it opened it)", path)
	}
	msg := strings.TrimPrefix(err.Error(), "journal: verify: ")
	switch {
	case errors.Is(err, journal.ErrSchemaTooNew):
		return fail("journal", "install the lifecycle-agent version that wrote it (or newer); the file is left untouched", "%s", msg)
	case errors.Is(err, journal.ErrCorrupt):
		return fail("journal", "restart the agent (systemctl restart lifecycle-agent): it moves the corrupt file aside and rebuilds from the API server", "%s", msg)
	}
	return fail("journal", "check that root can read "+path+"; details: lifecycle-agent journal verify", "%s", msg)
}

// doctorAPI reports the api, identity, rbac, crds, admission and clock
// checks; after an api failure, only that one.
func doctorAPI(ctx context.Context, cfg *config.Config, report func(...check)) {
	const notChecked = " (identity, rbac, crds, admission and clock not checked)"
	rc, err := apiclient.LoadConfig(cfg.Kubeconfig)
	if err != nil {
		report(fail("api", "set kubeconfig (--kubeconfig or LIFECYCLE_AGENT_KUBECONFIG) to the kubelet's kubeconfig",
			"%s%s", strings.TrimPrefix(err.Error(), "apiclient: "), notChecked))
		return
	}
	d, err := apiclient.NewDoctor(rc, apiclient.DoctorConfig{Timeout: cfg.APITimeout})
	if err != nil {
		report(fail("api", "fix the kubeconfig "+cfg.Kubeconfig, "%v%s", err, notChecked))
		return
	}
	// Each API check gets apiTimeout of its own.
	bounded := func(f func(context.Context) check) check {
		ctx, cancel := context.WithTimeout(ctx, cfg.APITimeout)
		defer cancel()
		return f(ctx)
	}

	var id apiclient.Identity
	c := bounded(func(ctx context.Context) check {
		if id, err = d.WhoAmI(ctx); err != nil {
			c := whoAmIFailure(d.Host(), cfg, err)
			c.Message += notChecked
			return c
		}
		return pass("api", "%s answers (kubeconfig %s)", d.Host(), cfg.Kubeconfig)
	})
	report(c)
	if !c.OK {
		return
	}
	report(doctorIdentity(id, cfg))
	report(bounded(func(ctx context.Context) check {
		acc, err := d.CheckAccess(ctx, apiclient.AgentPermissions(cfg.NodeName))
		if err != nil {
			return apiFailure("rbac", d.Host(), cfg, err)
		}
		return doctorRBAC(acc)
	}))
	report(bounded(func(ctx context.Context) check {
		crds, err := d.ProbeCRDs(ctx)
		if err != nil {
			return apiFailure("crds", d.Host(), cfg, err)
		}
		var served, missing []string
		for _, c := range crds {
			if c.Installed {
				served = append(served, c.Resource)
			} else {
				missing = append(missing, c.Resource+"."+v1alpha1.GroupName)
			}
		}
		if len(missing) > 0 {
			return fail("crds", fixManifests, "%s not installed", strings.Join(missing, ", "))
		}
		return pass("crds", "%s (%s) are served", strings.Join(served, ", "), v1alpha1.SchemeGroupVersion)
	}))
	report(bounded(func(ctx context.Context) check {
		return doctorAdmission(ctx, d, id, cfg)
	}))
	report(bounded(func(ctx context.Context) check {
		s, err := d.ServerClock(ctx)
		if err != nil {
			return apiFailure("clock", d.Host(), cfg, err)
		}
		return doctorClock(s.Offset())
	}))
}

// whoAmIFailure is the "api" check's failure: SelfSubjectReview is built
// into Kubernetes (authentication.k8s.io/v1 since 1.28) and allowed to
// every authenticated user, so the manifests are never its fix.
func whoAmIFailure(server string, cfg *config.Config, err error) check {
	var pe *apiclient.ProbeError
	if errors.As(err, &pe) {
		switch pe.Kind {
		case apiclient.FailNotFound:
			return fail("api", "upgrade the control plane: the agent needs kube-apiserver 1.30 or newer (docs/install.md)",
				"%s serves no SelfSubjectReview (authentication.k8s.io/v1, built in since Kubernetes 1.28): %s", server, pe.Msg)
		case apiclient.FailForbidden:
			return fail("api", "restore the built-in ClusterRoleBinding system:basic-user (it lets every authenticated user ask who it is), or set kubeconfig to the kubelet's",
				"%s: %s", pe.Op, pe.Msg)
		}
	}
	return apiFailure("api", server, cfg, err)
}

// apiFailure turns a failed request into a check with a fix for its cause.
func apiFailure(name, server string, cfg *config.Config, err error) check {
	var pe *apiclient.ProbeError
	if !errors.As(err, &pe) {
		return fail(name, "check the API server's log", "%v", err)
	}
	switch pe.Kind {
	case apiclient.FailUnreachable:
		return fail(name, "check the server address in "+cfg.Kubeconfig+" and that the API server is up and reachable from this node",
			"%s unreachable: %s", server, pe.Msg)
	case apiclient.FailTLS:
		return fail(name, "check certificate-authority-data in "+cfg.Kubeconfig+" against the API server's CA",
			"%s: %s", server, pe.Msg)
	case apiclient.FailUnauthorized:
		return fail(name, "renew the kubelet's client credentials, or set kubeconfig to valid ones",
			"%s refused the credentials in %s: %s", server, cfg.Kubeconfig, pe.Msg)
	case apiclient.FailForbidden:
		return fail(name, "use the kubelet's kubeconfig, and "+fixManifests, "%s: %s", pe.Op, pe.Msg)
	case apiclient.FailNotFound:
		return fail(name, fixManifests, "%s: %s", pe.Op, pe.Msg)
	}
	return fail(name, "check the API server's log", "%s: %s", pe.Op, pe.Msg)
}

func doctorIdentity(id apiclient.Identity, cfg *config.Config) check {
	who := fmt.Sprintf("%s (groups %s)", id.Username, strings.Join(id.Groups, ", "))
	want := apiclient.NodeUserPrefix + cfg.NodeName
	node, isNode := id.NodeName()
	switch {
	case isNode && node == cfg.NodeName:
		return pass("identity", "%s", who)
	case isNode:
		return fail("identity", fmt.Sprintf("use this node's kubelet kubeconfig, or set nodeName: %s (--node-name) if this host is %s", node, node),
			"%s, but nodeName is %s", who, cfg.NodeName)
	}
	return fail("identity", "use the kubelet's kubeconfig or set kubeconfig",
		"%s is not %s in group %s", who, want, apiclient.NodesGroup)
}

// doctorRBAC summarizes the access reviews in one line; a ✗ lists what is
// missing as "<resource> <verb>/<verb> [in <namespace>]".
func doctorRBAC(acc []apiclient.Access) check {
	type key struct{ path, ns string }
	var order []key
	verbs := map[key][]string{}
	for _, a := range acc {
		if a.Allowed {
			continue
		}
		k := key{a.ResourcePath(), a.Namespace}
		if _, ok := verbs[k]; !ok {
			order = append(order, k)
		}
		verbs[k] = append(verbs[k], a.Verb)
	}
	if len(order) == 0 {
		return pass("rbac", "all %d permissions the agent needs are granted", len(acc))
	}
	var missing []string
	for _, k := range order {
		s := k.path + " " + strings.Join(verbs[k], "/")
		if k.ns != "" {
			s += " in " + k.ns
		}
		missing = append(missing, s)
	}
	return fail("rbac", fixManifests, "missing %s", strings.Join(missing, ", "))
}

func doctorAdmission(ctx context.Context, d *apiclient.Doctor, id apiclient.Identity, cfg *config.Config) check {
	p, err := d.ProbeNodeScopePolicy(ctx, id)
	var pe *apiclient.ProbeError
	switch {
	case errors.As(err, &pe) && pe.Kind == apiclient.FailForbidden:
		if _, isNode := id.NodeName(); !isNode {
			return fail("admission", "run doctor with the kubelet's kubeconfig: the probe needs a node identity (or read access to ValidatingAdmissionPolicies)",
				"cannot check policy %s as %s: %s", apiclient.NodeScopePolicy, id.Username, pe.Msg)
		}
		return fail("admission", fixManifests, "cannot probe policy %s: %s", apiclient.NodeScopePolicy, pe.Msg)
	case err != nil:
		return apiFailure("admission", d.Host(), cfg, err)
	case !p.Enforced:
		return fail("admission", fixManifests, "%s: ValidatingAdmissionPolicy %s is not in force", p.Detail, apiclient.NodeScopePolicy)
	case p.Via == "dry-run":
		return pass("admission", "ValidatingAdmissionPolicy %s refuses writes for other nodes (dry run)", apiclient.NodeScopePolicy)
	}
	return pass("admission", "ValidatingAdmissionPolicy %s and its binding are installed", apiclient.NodeScopePolicy)
}

// doctorClock judges the offset of the API server's clock from ours.
func doctorClock(offset time.Duration) check {
	abs := offset.Abs()
	limit := fmt.Sprintf("(limit %s)", maxClockSkew)
	if abs < time.Second {
		return pass("clock", "within 1s of the API server's %s", limit)
	}
	dir := "behind" // the server is ahead of us
	if offset < 0 {
		dir = "ahead of"
	}
	msg := fmt.Sprintf("%s %s the API server's %s", abs.Round(time.Second), dir, limit)
	if abs > maxClockSkew {
		return fail("clock", "sync the clock: timedatectl set-ntp true (chrony or systemd-timesyncd), and check the API server's clock", "%s", msg)
	}
	return pass("clock", "%s", msg)
}

func doctorLogind(ctx context.Context, cfg *config.Config) check {
	l, err := host.New(host.Config{CallTimeout: doctorLogindTimeout})
	if err != nil {
		return fail("logind", "report a bug", "%v", err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(ctx, doctorLogindTimeout)
	defer cancel()
	delay, err := l.InhibitDelayMax(ctx)
	if err != nil {
		return fail("logind", "the agent needs systemd-logind on the system bus: systemctl status dbus systemd-logind",
			"no logind: %v", err)
	}
	return doctorLogindDelay(delay, cfg.Shutdown, l.DropInPath())
}

// doctorLogindDelay compares logind's InhibitDelayMaxSec with shutdown.budget.
func doctorLogindDelay(delay time.Duration, sh config.Shutdown, dropIn string) check {
	shown := delay.String()
	if delay == time.Duration(math.MaxInt64) {
		shown = "infinity"
	}
	if delay < sh.Budget {
		fix := "set shutdown.manageLogindDropIn: true or raise InhibitDelayMaxSec in /etc/systemd/logind.conf.d/"
		if sh.ManageLogindDropIn {
			fix = "restart the agent, which writes " + dropIn + " and reloads logind, or raise InhibitDelayMaxSec in /etc/systemd/logind.conf.d/"
		}
		return fail("logind", fix, "InhibitDelayMaxSec %s is below the shutdown budget %s", shown, sh.Budget)
	}
	return pass("logind", "InhibitDelayMaxSec %s ≥ shutdown budget %s", shown, sh.Budget)
}

func doctorNVML(ctx context.Context, cfg *config.Config) check {
	explicit := cfg.Drivers.GPUReset.Enabled
	type result struct {
		gpus int
		err  error
	}
	lib, err := daemon.NVMLLibrary(cfg)
	if err != nil {
		return fail("nvml", "start the GPU Operator's driver pod (nvidia-driver-daemonset), or fix or unset gpu.driverRoot", "%v", err)
	}
	done := make(chan result, 1)
	go func() {
		m, err := devices.New(devices.Config{LibraryPath: lib})
		if err != nil {
			done <- result{err: err}
			return
		}
		if err := m.Init(); err != nil {
			done <- result{err: err}
			return
		}
		defer m.Shutdown()
		gpus, err := m.List()
		done <- result{gpus: len(gpus), err: err}
	}()
	ctx, cancel := context.WithTimeout(ctx, doctorNVMLTimeout)
	defer cancel()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		return fail("nvml", "check the NVIDIA driver: nvidia-smi", "NVML did not answer within %s", doctorNVMLTimeout)
	}
	switch {
	case errors.Is(r.err, devices.ErrNoNVML):
		if explicit != nil && *explicit {
			return fail("nvml", "install the NVIDIA driver (libnvidia-ml.so.1) or set drivers.gpu-reset.enabled: false",
				"no NVML, but drivers.gpu-reset.enabled is true")
		}
		return pass("nvml", "no NVML: gpu-reset driver off")
	case r.err != nil:
		return fail("nvml", "check the NVIDIA driver: nvidia-smi", "%v", r.err)
	}
	state := "on"
	if !cfg.DriverEnabled(config.DriverGPUReset, true, false) {
		state = "off (drivers.gpu-reset.enabled: false)"
	}
	gpus := fmt.Sprintf("%d GPUs", r.gpus)
	if r.gpus == 1 {
		gpus = "1 GPU"
	}
	return pass("nvml", "%s; gpu-reset driver %s", gpus, state)
}

// doctorMaintenance reports the maintenance windows and evaluates each
// configured gate once, as the engine would before a disruptive event: a
// gate that cannot be evaluated fails (it would hold every such event); one
// that blocks now passes, naming what blocks. Nothing configured: no line.
func doctorMaintenance(ctx context.Context, cfg *config.Config, now time.Time) []check {
	var out []check
	if ws := cfg.Maintenance.Windows; len(ws) > 0 {
		if msg := ws.Wait(now); msg != "" {
			out = append(out, pass("window", "closed now: %s", strings.TrimPrefix(msg, "waiting for a maintenance window: ")))
		} else {
			out = append(out, pass("window", "open now: disruptive events may start"))
		}
	}
	var pods maintenance.PodLister
	if cfg.Gates.BlockingPods != "" {
		api, err := doctorPodLister(cfg)
		if err != nil {
			out = append(out, fail("gate pods", "fix the kubeconfig (see the api line)", "cannot be evaluated: %v", err))
		} else {
			pods = api
		}
	}
	gates, err := daemon.Gates(cfg, pods, slog.New(slog.DiscardHandler))
	if err != nil {
		return append(out, fail("gates", "fix gates.* in "+cfg.Path, "%v", err))
	}
	fixes := map[string]string{
		"command":    "run it by hand (/bin/sh -c '" + cfg.Gates.Command + "') as root; until it can run, disruptive events wait",
		"pods":       "the node's identity must list pods on this node (Node authorizer); see the api and rbac lines",
		"prometheus": "gates.prometheus.url must serve Prometheus' HTTP API (/api/v1/alerts) to this node; until it answers, disruptive events wait",
	}
	for _, g := range gates {
		if g.Name() == "pods" && pods == nil {
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, doctorGateTimeout)
		b, err := g.Check(gctx)
		cancel()
		name := "gate " + g.Name()
		switch {
		case err != nil:
			out = append(out, fail(name, fixes[g.Name()], "cannot be evaluated: %v", err))
		case len(b) > 0:
			out = append(out, pass(name, "evaluates; blocks disruptive events now: %s", strings.Join(b, "; ")))
		default:
			out = append(out, pass(name, "evaluates; passes now"))
		}
	}
	return out
}

// doctorGateTimeout bounds one gate's evaluation (each gate has its own
// timeout too: gates.commandTimeout, gates.prometheus.timeout).
const doctorGateTimeout = 45 * time.Second

func doctorPodLister(cfg *config.Config) (maintenance.PodLister, error) {
	rc, err := apiclient.LoadConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return apiclient.New(rc, cfg.NodeName, cfg.APITimeout)
}

// doctorNotify reports notifications.urls: one line naming the targets,
// or with test, one per target after a test message to it.
func doctorNotify(ctx context.Context, cfg *config.Config, test bool) []check {
	if len(cfg.Notifications.URLs) == 0 {
		if test {
			return []check{fail("notify", "set notifications.urls in "+cfg.Path, "--notify-test: notifications.urls is empty")}
		}
		return nil
	}
	ts, err := notify.Parse(cfg.Notifications.URLs)
	if err != nil { // refused at load already
		return []check{fail("notify", "fix notifications.urls in "+cfg.Path, "%v", err)}
	}
	if !test {
		names := make([]string, len(ts))
		for i, t := range ts {
			names[i] = t.String()
		}
		return []check{pass("notify", "%d target(s): %s (not contacted; --notify-test sends each a test message)",
			len(ts), strings.Join(names, ", "))}
	}
	n := &notify.Notifier{Timeout: cfg.Notifications.Timeout}
	text := fmt.Sprintf("lifecycle-agent doctor --notify-test on node %s: this target gets the node's lifecycle notices", cfg.NodeName)
	var out []check
	for _, t := range ts {
		name := "notify " + t.String()
		if err := n.Test(ctx, t, "lifecycle-agent: node "+cfg.NodeName, text); err != nil {
			out = append(out, fail(name, "check the URL's credentials and that this node reaches the service; until then notices wait in the journal (24 h)",
				"test message not taken: %v", err))
			continue
		}
		out = append(out, pass(name, "test message sent"))
	}
	return out
}
