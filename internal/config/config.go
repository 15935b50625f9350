package config

import (
	"log/slog"
	"strings"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/maintenance"
)

// DefaultPath is the config file read when neither --config nor
// LIFECYCLE_AGENT_CONFIG names one. Its absence is not an error.
const DefaultPath = "/etc/lifecycle-agent/config.yaml"

// DropInDir holds the administrator's drop-ins (*.yaml), read after
// DefaultPath and winning over it. A config file named elsewhere reads the
// config.d beside it instead.
const DropInDir = "/etc/lifecycle-agent/config.d"

// VendorDir holds the package's defaults (*.yaml), read before DefaultPath
// and only with it. They are not conffiles: the package changes them on
// upgrade without asking. A drop-in of the same name in DropInDir masks
// one.
const VendorDir = "/usr/lib/lifecycle-agent/config.d"

// EnvPrefix starts every environment variable the agent reads.
const EnvPrefix = "LIFECYCLE_AGENT_"

// DriverPrefix is the domain of the built-in drivers and of exec drivers
// whose name carries no vendor domain.
const DriverPrefix = "lifecycle-agent.x-k8s.io/"

// Built-in driver names, as they appear under drivers.<name>.enabled and
// after DriverPrefix.
const (
	DriverDrain     = "drain"
	DriverUncordon  = "uncordon"
	DriverReboot    = "reboot"
	DriverShutdown  = "shutdown"
	DriverOSUpgrade = "os-upgrade"
	DriverGPUReset  = "gpu-reset"
)

// Values of host.mode.
const (
	HostModeReal     = "real"
	HostModeSimulate = "simulate"
)

// Values of gpu.resetMethod.
const (
	ResetMethodAuto      = "auto"
	ResetMethodNvidiaSMI = "nvidia-smi"
	ResetMethodNVML      = "nvml"
	// NvidiaSMIAuto is gpu.nvidiaSMI's default: the driver root's, else PATH's.
	NvidiaSMIAuto = "auto"
)

// Values of osUpgrade.profiles.<name>.rebootPolicy.
const (
	RebootAlways     = "always"
	RebootNever      = "never"
	RebootIfRequired = "if-required"
)

// Values of logLevel and logFormat.
const (
	LogLevelDebug = "debug"
	LogLevelInfo  = "info"
	LogLevelWarn  = "warn"
	LogLevelError = "error"

	LogFormatText = "text"
	LogFormatJSON = "json"
)

// Config is the agent's validated configuration. Load fills every field;
// the zero value is not meaningful.
type Config struct {
	// Path is the config file that was read, or "" when the default file
	// does not exist.
	Path string
	// Files lists every file read, lowest layer first: vendor drop-ins,
	// Path, then the administrator's drop-ins.
	Files []string

	NodeName       string
	Kubeconfig     string
	JournalPath    string
	SocketPath     string
	MetricsAddress string
	APITimeout     time.Duration
	EventRetention time.Duration
	LogLevel       string
	LogFormat      string

	Host          Host
	Shutdown      Shutdown
	Drivers       Drivers
	Drain         Drain
	Reboot        Reboot
	Needs         Needs
	GPU           GPU
	OSUpgrade     OSUpgrade
	Exec          Exec
	Maintenance   Maintenance
	Gates         Gates
	Readiness     Readiness
	Notifications Notifications

	// sources maps each layered key to where its value came from.
	sources map[string]string
}

// Host is the host.* section.
type Host struct {
	Mode string // HostModeReal or HostModeSimulate
}

// Shutdown is the shutdown.* section.
type Shutdown struct {
	Budget             time.Duration
	ManageLogindDropIn bool
}

// Drivers is the drivers.* section: one switch per built-in driver.
type Drivers struct {
	Drain     DriverSwitch
	Uncordon  DriverSwitch
	Reboot    DriverSwitch
	Shutdown  DriverSwitch
	OSUpgrade DriverSwitch
	GPUReset  DriverSwitch
}

// DriverSwitch is drivers.<name>. Enabled is nil when the operator left it
// unset, which means "the driver's default" (see Config.DriverEnabled).
type DriverSwitch struct {
	Enabled *bool
}

// Drain is the drain.* section.
type Drain struct {
	Timeout         time.Duration // 0: no limit of its own
	EvictRetryDelay time.Duration
}

// Reboot is the reboot.* section.
type Reboot struct {
	ReadyTimeout time.Duration
}

// Needs is the needs.* section: work the node detects it needs
// (internal/needs).
type Needs struct {
	Reboot NeedsReboot
}

// NeedsReboot is needs.reboot.*: the reboot-required sentinel.
type NeedsReboot struct {
	SentinelFile    string // "" with SentinelCommand "": off
	SentinelCommand string // /bin/sh -c; exit 0: a reboot is needed; replaces SentinelFile
	CommandTimeout  time.Duration
	Interval        time.Duration
	Policy          string // PolicyReport or PolicyRequest
	Request         AutoRequest
}

// Policies of a need (needs.reboot.policy).
const (
	PolicyReport  = "report"  // the condition only
	PolicyRequest = "request" // also an event of our own (internal/needs.Requester)
)

// AutoRequest is where the agent's own requests go: a disruption group, its
// slots and its circuit breaker (needs.reboot.*, gpu.remediation.*).
type AutoRequest struct {
	Group           string
	MaxConcurrent   int
	BreakerFailures int
}

// GPU is the gpu.* section.
type GPU struct {
	ResetMethod   string // ResetMethodAuto, ResetMethodNvidiaSMI or ResetMethodNVML
	DriverRoot    string // "" the host's driver; else where libnvidia-ml.so.1 is looked up
	NvidiaSMI     string // NvidiaSMIAuto or an absolute path
	AutoRemediate bool
	Remediation   AutoRequest // gpu.remediation.*: used with AutoRemediate
	Services      []string    // systemd units stopped around a reset
	Operator      GPUOperator
}

// GPUOperator is the gpu.operator.* section.
type GPUOperator struct {
	Components  []string
	LabelPrefix string
	PausedValue string
	PodTimeout  time.Duration
}

// Maintenance is the maintenance.* section: when a disruptive event may
// start (internal/maintenance).
type Maintenance struct {
	Windows maintenance.Windows // from the file only; none: any time
}

// Readiness is the readiness.* section: the checks before the uncordon
// that ends a disruptive event (internal/readiness).
type Readiness struct {
	Checks         []string // daemonsets, resources, conditions, command
	Conditions     []string // Type=Status: a Node condition and its healthy status
	Command        string   // /bin/sh -c; exit 0 passes; "": off
	CommandTimeout time.Duration
	Timeout        time.Duration
	OnTimeout      string // ReadinessKeepCordoned or ReadinessUncordon
	DaemonSets     ReadinessDaemonSets
}

// ReadinessDaemonSets is readiness.daemonSets.*: which DaemonSets the
// daemonsets check requires (all with a Ready pod at claim by default).
type ReadinessDaemonSets struct {
	Namespaces []string // "": every namespace
	Selector   string   // label selector on the DaemonSet's pod; "": all
}

// Values of readiness.onTimeout.
const (
	ReadinessKeepCordoned = "keepCordoned"
	ReadinessUncordon     = "uncordon"
)

// Gates is the gates.* section: what must hold before a disruptive event
// starts (internal/maintenance).
type Gates struct {
	Prometheus     GatesPrometheus
	BlockingPods   string // label selector; "": off
	Command        string // /bin/sh -c; exit 0 passes; "": off
	CommandTimeout time.Duration
}

// Notifications is the notifications.* section (internal/notify).
type Notifications struct {
	URLs    []string // shoutrrr URLs; none: off. They carry tokens: never log them.
	Timeout time.Duration
}

// GatesPrometheus is gates.prometheus.*.
type GatesPrometheus struct {
	URL          string // "": off
	AlertNames   string // regexp on alertname; "": every alert
	IgnoreAlerts string // regexp on alertname; "": none ignored
	Timeout      time.Duration
}

// OSUpgrade is the osUpgrade.* section. It comes from the file only.
type OSUpgrade struct {
	Profiles map[string]OSUpgradeProfile
}

// OSUpgradeProfile is one osUpgrade.profiles.<name> entry.
type OSUpgradeProfile struct {
	Command      []string // argv; Command[0] is an absolute path
	Timeout      time.Duration
	RebootPolicy string // RebootAlways, RebootNever or RebootIfRequired
	// Check (optional) tells, after the node went down while Command ran,
	// whether the upgrade completed: exit 0 yes, 1..125 no (run it again).
	Check []string
}

// Exec is the exec.* section. It comes from the file only.
type Exec struct {
	Drivers []ExecDriver
}

// ExecDriver is one vendor driver defined in exec.drivers.
type ExecDriver struct {
	Name   string        // as written: "<name>" or "<vendor-domain>/<name>"
	Start  string        // CamelCase state
	End    string        // CamelCase state
	SLA    time.Duration // 0: none
	Params []string      // parameter names an event may pass
	Steps  []ExecStep
}

// ExecStep is one ordered step of an ExecDriver.
type ExecStep struct {
	Name    string
	Command []string // argv; Command[0] is an absolute path
	Timeout time.Duration
	Check   []string // optional argv; exit 0 means the step already took effect
}

// FullName is the driver name published in LifecycleTransition.spec.driver.
func (d ExecDriver) FullName() string {
	if strings.Contains(d.Name, "/") {
		return d.Name
	}
	return DriverPrefix + d.Name
}

// DriverEnabled reports whether the driver called name (short, e.g. "drain",
// or full, e.g. "lifecycle-agent.x-k8s.io/drain") runs on this node.
// An explicit drivers.<name>.enabled wins; unset means the driver default:
// on for drain, uncordon, reboot and shutdown; gpu-reset when nvmlPresent;
// os-upgrade when hasProfile (normally len(c.OSUpgrade.Profiles) > 0).
// Exec drivers are enabled by being configured. Unknown names are disabled.
func (c *Config) DriverEnabled(name string, nvmlPresent, hasProfile bool) bool {
	short := strings.TrimPrefix(name, DriverPrefix)
	var sw DriverSwitch
	def := true
	switch short {
	case DriverDrain:
		sw = c.Drivers.Drain
	case DriverUncordon:
		sw = c.Drivers.Uncordon
	case DriverReboot:
		sw = c.Drivers.Reboot
	case DriverShutdown:
		sw = c.Drivers.Shutdown
	case DriverOSUpgrade:
		sw, def = c.Drivers.OSUpgrade, hasProfile
	case DriverGPUReset:
		sw, def = c.Drivers.GPUReset, nvmlPresent
	default:
		for _, d := range c.Exec.Drivers {
			if d.FullName() == name || d.FullName() == DriverPrefix+name {
				return true
			}
		}
		return false
	}
	if sw.Enabled != nil {
		return *sw.Enabled
	}
	return def
}

// Source says where the value of a layered key (e.g. "host.mode") came
// from: "flag --host-mode", "env LIFECYCLE_AGENT_HOST_MODE", "<file>:<line>"
// (the config file or the drop-in that won) or "default". It returns "" for
// keys it does not know, and "<file>:<line>" for the file-only sections
// osUpgrade.profiles, exec.drivers and maintenance.windows when a file gives
// them a value, "" when none does.
func (c *Config) Source(key string) string { return c.sources[key] }

// SlogLevel is LogLevel as a slog.Level.
func (c *Config) SlogLevel() slog.Level {
	switch c.LogLevel {
	case LogLevelDebug:
		return slog.LevelDebug
	case LogLevelWarn:
		return slog.LevelWarn
	case LogLevelError:
		return slog.LevelError
	}
	return slog.LevelInfo
}
