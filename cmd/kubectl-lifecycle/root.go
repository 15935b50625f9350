package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/exitcode"
)

// Exit codes: the one table of both binaries (internal/exitcode; every
// --help ends with it, doc.go and docs/plugin.md list it for users).
const (
	exitOK          = exitcode.OK
	exitFailed      = exitcode.Failed      // an event (or a rollout node) failed, or an API error (not unreachable: 6)
	exitUsage       = exitcode.Usage       // bad arguments or flags; a driver the node does not offer
	exitSlaExpired  = exitcode.SlaExpired  // the event ended SlaExpired
	exitTimeout     = exitcode.Timeout     // --timeout passed before the end; the work goes on
	exitCancelled   = exitcode.Cancelled   // the event was deleted before it ended
	exitUnavailable = exitcode.Unavailable // the API server did not answer: retry later
	exitInterrupted = exitcode.Interrupted // SIGINT or SIGTERM; the work goes on
)

// exitError carries an exit code and the one-line message printed as
// "error: <msg>". Every RunE returns nil or an *exitError.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func fail(code int, format string, args ...any) *exitError {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

func usageErr(format string, args ...any) *exitError { return fail(exitUsage, format, args...) }

// options are shared by every command.
type options struct {
	flags  *genericclioptions.ConfigFlags
	out    io.Writer
	errOut io.Writer
	clock  clock.Clock

	cl *clients
}

// clients are built on first use, from the kubeconfig flags.
type clients struct {
	lc   *apiclient.LifecycleClients
	core kubernetes.Interface
}

func (o *options) clients() (*clients, error) {
	if o.cl != nil {
		return o.cl, nil
	}
	if err := o.haveKubeconfig(); err != nil {
		return nil, err
	}
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, fail(exitFailed, "kubeconfig: %v", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "kubectl-lifecycle/" + version
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	lc, err := apiclient.NewLifecycleClients(cfg)
	if err != nil {
		return nil, fail(exitFailed, "%v", err)
	}
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fail(exitFailed, "%v", err)
	}
	o.cl = &clients{lc: lc, core: core}
	return o.cl, nil
}

// haveKubeconfig refuses to go on when no kubeconfig names a cluster and
// neither --server nor an in-cluster service account says where one is:
// client-go would fall back to http://localhost:8080 and the user would
// read a refused connection to a server they never named.
func (o *options) haveKubeconfig() error {
	if o.flags.APIServer != nil && *o.flags.APIServer != "" {
		return nil
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return nil // in a pod: client-go uses the service account
	}
	raw, err := o.flags.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return fail(exitFailed, "kubeconfig: %v", err)
	}
	if len(raw.Clusters) > 0 {
		return nil
	}
	where := clientcmd.RecommendedHomeFile
	if o.flags.KubeConfig != nil && *o.flags.KubeConfig != "" {
		where = *o.flags.KubeConfig
	} else if env := os.Getenv(clientcmd.RecommendedConfigPathEnvVar); env != "" {
		where = "$KUBECONFIG (" + env + ")"
	}
	return fail(exitFailed, "no cluster to talk to: no kubeconfig at %s names one; pass --kubeconfig FILE or set KUBECONFIG (an admin's kubeconfig: the plugin creates and reads LifecycleEvents)", where)
}

// runE adapts a command body: plain errors become exit 1, a cancelled
// context (SIGINT, SIGTERM) becomes exit 130.
func (o *options) runE(f func(ctx context.Context, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := f(cmd.Context(), args)
		var ee *exitError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ee):
			return ee
		case cmd.Context().Err() != nil:
			return fail(exitInterrupted, "interrupted")
		case missingAPI(err):
			return fail(exitFailed, "%v: this cluster does not serve the %s API (the CRDs LifecycleEvent and LifecycleTransition are not installed); install them with the manifests: lifecycle-agent manifests | kubectl apply -f - (docs/install.md)", err, v1alpha1.GroupName)
		case unreachable(err):
			return fail(exitUnavailable, "%v: the API server did not answer; retry later", err)
		case apierrors.IsForbidden(err):
			return fail(exitFailed, "%v; a plugin user needs the ClusterRole lifecycle-agent:operator (in lifecycle-agent manifests), e.g. kubectl create clusterrolebinding lifecycle-operators --clusterrole=lifecycle-agent:operator --user=NAME", err)
		}
		return fail(exitFailed, "%v", err)
	}
}

// unreachable reports whether err says the API server could not be
// reached or did not answer in time (not an answer that refused us).
func unreachable(err error) bool {
	var ne net.Error
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.As(err, &ne) && ne.Timeout() ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err)
}

// missingAPI reports whether err is the API server's 404 for a resource it
// does not serve at all in our group (no CRD), not for one missing object.
func missingAPI(err error) bool {
	var st apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &st) {
		return false
	}
	s := st.Status()
	return s.Details != nil && s.Details.Group == v1alpha1.GroupName &&
		strings.HasPrefix(s.Message, "the server could not find the requested resource")
}

// execute runs the command line and returns the exit code.
func execute(ctx context.Context, args []string, out, errOut io.Writer, clk clock.Clock) int {
	o := &options{out: out, errOut: errOut, clock: clk}
	root := newRootCmd(o)
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errOut)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		// Errors cobra found before a command ran: unknown command, bad
		// flag, wrong number of arguments.
		fmt.Fprintf(errOut, "error: %v\nSee '%s --help' for usage.\n", err, commandPath(cmd))
		return exitUsage
	}
	if ee.msg != "" {
		fmt.Fprintf(errOut, "error: %s\n", ee.msg)
	}
	if ee.code == exitUsage {
		fmt.Fprintf(errOut, "See '%s --help' for usage.\n", commandPath(cmd))
	}
	return ee.code
}

func commandPath(cmd *cobra.Command) string {
	if cmd == nil {
		return "kubectl lifecycle"
	}
	return cmd.CommandPath() // "kubectl lifecycle …" (CommandDisplayNameAnnotation)
}

func newRootCmd(o *options) *cobra.Command {
	root := &cobra.Command{
		Use:   "kubectl-lifecycle",
		Short: "Run and follow node lifecycle transitions (drain, reboot, uncordon, ...) done by lifecycle-agent",
		Long: `kubectl lifecycle runs node lifecycle transitions through the lifecycle-agent
on each node: it creates LifecycleEvents, follows them step by step, and rolls
a transition across many nodes under a disruption budget.

The agents do the work; this plugin only asks and reports. An event it
created keeps running when the plugin exits.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations: map[string]string{
			cobra.CommandDisplayNameAnnotation: "kubectl lifecycle",
		},
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
		Version:           version,
	}
	root.SetVersionTemplate("kubectl-lifecycle {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr("%v", err) })
	o.flags = genericclioptions.NewConfigFlags(true)
	o.flags.Namespace = nil // both kinds are cluster-scoped
	o.flags.CacheDir = nil  // no discovery
	o.flags.AddFlags(root.PersistentFlags())

	root.AddCommand(
		newTransitionsCmd(o),
		newRunCmd(o),
		newShorthandCmd(o, "drain", "Drain a node: cordon it and evict its pods (run drain NODE --wait)"),
		newShorthandCmd(o, "uncordon", "Make a node schedulable again, if lifecycle-agent cordoned it (run uncordon NODE --wait)"),
		newShorthandCmd(o, "reboot", "Drain, reboot and uncordon a node (run reboot NODE --wait)"),
		newStatusCmd(o),
		newCancelCmd(o),
		newHistoryCmd(o),
		newRolloutCmd(o),
		newVersionCmd(o),
	)
	exitcode.AddToHelp(root)
	return root
}

// argsBetween accepts min..max positional arguments (max < 0: no limit).
func argsBetween(min, max int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || (max >= 0 && len(args) > max) {
			want := fmt.Sprintf("%d", min)
			switch {
			case max < 0:
				want = fmt.Sprintf("at least %d", min)
			case max != min:
				want = fmt.Sprintf("%d to %d", min, max)
			}
			return usageErr("%s takes %s argument(s), got %d: usage: %s", cmd.Name(), want, len(args), cmd.UseLine())
		}
		return nil
	}
}

// parseParams turns repeated --param k=v into a map.
func parseParams(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageErr("--param %q: want NAME=VALUE", kv)
		}
		if _, dup := m[k]; dup {
			return nil, usageErr("--param %s given twice", k)
		}
		m[k] = v
	}
	return m, nil
}

// timeoutC fires once d has passed on the injected clock; nil (never) when
// d is 0.
func (o *options) timeoutC(d time.Duration) <-chan time.Time {
	if d <= 0 {
		return nil
	}
	return o.clock.After(d)
}
