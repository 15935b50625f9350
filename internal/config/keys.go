package config

import (
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/lifecycle-agent/lifecycle-agent/internal/notify"
)

// keys is the single source of truth for every configuration key: Load,
// AddFlags, Reference (docs/configuration.md) and Example
// (packaging/config.yaml) all read it, so flags, env vars, docs and the
// shipped file cannot drift apart. Order here is the order in the docs and in
// the example file; keys that share a dotted prefix must be adjacent.
var keys = []*key{
	{
		name: "config", flag: "config", scope: GlobalFlags, kind: kindString, def: DefaultPath,
		notInFile: true,
		doc: "Path of the config file. A missing default file means \"all defaults\"; a missing file " +
			"named by --config or LIFECYCLE_AGENT_CONFIG is an error. Flag and env only.",
	},
	{
		name: "nodeName", flag: "node-name", scope: GlobalFlags, kind: kindString, def: "",
		defDoc: "the host name", check: checkNodeName,
		doc: "Name of this node's Node object. Empty means the host name, lowercased, as the kubelet " +
			"does by default.",
		field: func(c *Config) any { return &c.NodeName },
	},
	{
		name: "kubeconfig", flag: "kubeconfig", scope: GlobalFlags, kind: kindString,
		def: "/etc/kubernetes/kubelet.conf", check: nonEmpty,
		doc: "Kubeconfig used to reach the API server. The kubelet's own gives the agent the identity " +
			"system:node:<nodeName>, which the Node authorizer and NodeRestriction confine to this node.",
		field: func(c *Config) any { return &c.Kubeconfig },
	},
	{
		name: "journalPath", flag: "journal", scope: GlobalFlags, kind: kindString,
		def: "/var/lib/lifecycle-agent/journal.db", check: nonEmpty,
		doc: "The bbolt journal of claimed events and their steps. It must live on local, persistent " +
			"storage: it is what lets a transition resume after a crash or a reboot.",
		field: func(c *Config) any { return &c.JournalPath },
	},
	{
		name: "socketPath", flag: "socket", scope: GlobalFlags, kind: kindString,
		def: "/run/lifecycle-agent/agent.sock", check: checkSocketPath,
		doc:   "Root-only unix socket on which status, request and doctor talk to the running agent.",
		field: func(c *Config) any { return &c.SocketPath },
	},
	{
		name: "metricsAddress", flag: "metrics-address", scope: RunFlags, kind: kindString,
		def: "127.0.0.1:9810", check: checkLoopback,
		doc: "Listen address of the Prometheus /metrics and /healthz endpoints. It must be a loopback " +
			"IP and a port (127.0.0.1:PORT or [::1]:PORT); any other address is refused.",
		field: func(c *Config) any { return &c.MetricsAddress },
	},
	{
		name: "apiTimeout", flag: "api-timeout", scope: RunFlags, kind: kindDuration, def: "10s",
		check: positive,
		doc: "How long run waits for the API server at start before it carries on offline. Journal " +
			"replay and local repairs never wait for the API.",
		field: func(c *Config) any { return &c.APITimeout },
	},
	{
		name: "eventRetention", flag: "event-retention", scope: RunFlags, kind: kindDuration, def: "24h",
		check: nonNegative,
		doc: "How long finished LifecycleEvents are kept for audit before the agent deletes them. " +
			"0 deletes them as soon as they finish.",
		field: func(c *Config) any { return &c.EventRetention },
	},
	{
		name: "logLevel", flag: "log-level", scope: GlobalFlags, kind: kindString, def: LogLevelInfo,
		enum:  []string{LogLevelDebug, LogLevelInfo, LogLevelWarn, LogLevelError},
		doc:   "Least severe log level written.",
		field: func(c *Config) any { return &c.LogLevel },
	},
	{
		name: "logFormat", flag: "log-format", scope: GlobalFlags, kind: kindString, def: LogFormatText,
		enum:  []string{LogFormatText, LogFormatJSON},
		doc:   "Log line format on stderr (the systemd journal).",
		field: func(c *Config) any { return &c.LogFormat },
	},
	{
		name: "host.mode", flag: "host-mode", scope: RunFlags, kind: kindString, def: HostModeReal,
		enum: []string{HostModeReal, HostModeSimulate},
		doc: "How host actions (reboot, shutdown lock, GPU reset, commands) run. real performs them; " +
			"simulate only logs and journals them, to try the agent on a node safely.",
		field: func(c *Config) any { return &c.Host.Mode },
	},
	{
		name: "shutdown.budget", flag: "shutdown-budget", scope: RunFlags, kind: kindDuration, def: "5s",
		check: positive,
		doc: "Time the agent needs between logind's PrepareForShutdown and releasing its delay lock. " +
			"At start it warns when logind's InhibitDelayMaxSec is shorter.",
		field: func(c *Config) any { return &c.Shutdown.Budget },
	},
	{
		name: "shutdown.manageLogindDropIn", kind: kindBool, def: "false",
		doc: "Write a logind drop-in (/etc/systemd/logind.conf.d/) that raises InhibitDelayMaxSec to " +
			"at least shutdown.budget. When false the agent only warns.",
		field: func(c *Config) any { return &c.Shutdown.ManageLogindDropIn },
	},
	{
		name: "drivers.drain.enabled", kind: kindTriBool, defDoc: "on",
		doc:   "true or false forces the drain driver on or off; empty leaves it on.",
		field: func(c *Config) any { return &c.Drivers.Drain.Enabled },
	},
	{
		name: "drivers.uncordon.enabled", kind: kindTriBool, defDoc: "on",
		doc:   "true or false forces the uncordon driver on or off; empty leaves it on.",
		field: func(c *Config) any { return &c.Drivers.Uncordon.Enabled },
	},
	{
		name: "drivers.reboot.enabled", kind: kindTriBool, defDoc: "on",
		doc:   "true or false forces the reboot driver on or off; empty leaves it on.",
		field: func(c *Config) any { return &c.Drivers.Reboot.Enabled },
	},
	{
		name: "drivers.shutdown.enabled", kind: kindTriBool, defDoc: "on",
		doc:   "true or false forces the shutdown driver on or off; empty leaves it on.",
		field: func(c *Config) any { return &c.Drivers.Shutdown.Enabled },
	},
	{
		name: "drivers.os-upgrade.enabled", kind: kindTriBool, defDoc: "on when a profile exists",
		doc: "true or false forces the os-upgrade driver on or off; empty turns it on when " +
			"osUpgrade.profiles has at least one profile.",
		field: func(c *Config) any { return &c.Drivers.OSUpgrade.Enabled },
	},
	{
		name: "drivers.gpu-reset.enabled", kind: kindTriBool, defDoc: "on when NVML is present",
		doc: "true or false forces the gpu-reset driver on or off; empty turns it on when the NVIDIA " +
			"management library (NVML) loads.",
		field: func(c *Config) any { return &c.Drivers.GPUReset.Enabled },
	},
	{
		name: "drain.timeout", kind: kindDuration, def: "0s", check: nonNegative,
		doc: "Longest a drain may wait for its evictions. 0 sets no limit of its own; the event's SLA " +
			"still applies.",
		field: func(c *Config) any { return &c.Drain.Timeout },
	},
	{
		name: "drain.evictRetryDelay", kind: kindDuration, def: "5s", check: atLeast(MinEvictRetryDelay),
		doc: "Longest wait before retrying an eviction that a PodDisruptionBudget refused (HTTP 429): the retry " +
			"comes as soon as the budget allows a disruption again, else after a back-off of 1s doubling up to this. " +
			"At least 500ms: below it each held pod would send more than two evictions a second.",
		field: func(c *Config) any { return &c.Drain.EvictRetryDelay },
	},
	{
		name: "reboot.readyTimeout", kind: kindDuration, def: "10m", check: positive,
		doc: "After a reboot, how long to wait for the kubelet to report the Node Ready before the " +
			"step fails (the cordon then stays or goes as `readiness.onTimeout` says).",
		field: func(c *Config) any { return &c.Reboot.ReadyTimeout },
	},
	{
		name: "needs.reboot.sentinelFile", kind: kindString, def: "/var/run/reboot-required", check: emptyOrAbsolute,
		doc: "While this file exists the node needs a reboot, as kured's --reboot-sentinel: the Node " +
			"condition RebootRequired is True (reason SentinelFile, the message lists <file>.pkgs) and " +
			"lifecycle_agent_reboot_required is 1. Debian's package scripts create the default. Empty, with " +
			"no needs.reboot.sentinelCommand: no sentinel; RebootRequired then says only what the GPUs ask " +
			"(none on a node without GPUs).",
		field: func(c *Config) any { return &c.Needs.Reboot.SentinelFile },
	},
	{
		name: "needs.reboot.sentinelCommand", kind: kindString, def: "",
		doc: "A command, run by /bin/sh -c as kured's --reboot-sentinel-command, whose exit status 0 means " +
			"the node needs a reboot (reason SentinelCommand); when set it replaces the sentinel file. A " +
			"read-only probe: it runs in host.mode simulate too, so it must not change the host.",
		field: func(c *Config) any { return &c.Needs.Reboot.SentinelCommand },
	},
	{
		name: "needs.reboot.commandTimeout", kind: kindDuration, def: "30s", check: positive,
		doc: "Longest a run of needs.reboot.sentinelCommand may take; one that outlives it is killed " +
			"with its children and RebootRequired is Unknown.",
		field: func(c *Config) any { return &c.Needs.Reboot.CommandTimeout },
	},
	{
		name: "needs.reboot.interval", kind: kindDuration, def: "1m", check: positive,
		doc:   "How often the reboot-required sentinel is checked (and once at start).",
		field: func(c *Config) any { return &c.Needs.Reboot.Interval },
	},
	{
		name: "needs.reboot.policy", kind: kindString, def: PolicyReport, enum: []string{PolicyReport, PolicyRequest},
		doc: "What the agent does when RebootRequired turns True. report: only the condition (and the " +
			"metric). request: it also creates its own reboot LifecycleEvent, once per need (journaled), " +
			"in disruption group needs.reboot.group with needs.reboot.maxConcurrent slots, unless the " +
			"group's circuit breaker is open (needs.reboot.breakerFailures). The reboot driver must be enabled.",
		field: func(c *Config) any { return &c.Needs.Reboot.Policy },
	},
	{
		name: "needs.reboot.group", kind: kindString, def: "auto-reboot", check: checkGroup,
		doc: "Disruption group of the automatic reboot requests: the fleet shares its slots (Leases " +
			"<group>-0 …) and its circuit breaker (Lease <group>-breaker). Only with needs.reboot.policy request.",
		field: func(c *Config) any { return &c.Needs.Reboot.Request.Group },
	},
	{
		name: "needs.reboot.maxConcurrent", kind: kindInt, def: "1", check: checkMaxConcurrent,
		doc: "How many nodes of needs.reboot.group may reboot on an automatic request at once (1-1000; " +
			"every agent of the group must use the same value). Only with needs.reboot.policy request.",
		field: func(c *Config) any { return &c.Needs.Reboot.Request.MaxConcurrent },
	},
	{
		name: "needs.reboot.breakerFailures", kind: kindInt, def: "3", check: atLeastOne,
		doc: "Automatic reboot requests of needs.reboot.group that may end Failed or SlaExpired, " +
			"fleet-wide, before every agent of the group stops requesting (the breaker, kept on the Lease " +
			"<group>-breaker; an admin closes it by deleting that Lease). Only with needs.reboot.policy request.",
		field: func(c *Config) any { return &c.Needs.Reboot.Request.BreakerFailures },
	},
	{
		name: "gates.prometheus.url", kind: kindString, def: "", check: checkHTTPURL,
		doc: "Prometheus to ask before a disruptive event starts (its /api/v1/alerts, as kured's " +
			"--prometheus-url): while a firing alert matches gates.prometheus.alertNames and not " +
			"gates.prometheus.ignoreAlerts, the event stays Pending naming the alerts. A Prometheus that " +
			"does not answer blocks too. Empty: no alert gate.",
		field: func(c *Config) any { return &c.Gates.Prometheus.URL },
	},
	{
		name: "gates.prometheus.alertNames", kind: kindString, def: "", check: checkRegexp,
		doc: "Regular expression (RE2, unanchored) an alert's alertname must match to block. Empty: " +
			"every firing alert blocks.",
		field: func(c *Config) any { return &c.Gates.Prometheus.AlertNames },
	},
	{
		name: "gates.prometheus.ignoreAlerts", kind: kindString, def: "", check: checkRegexp,
		doc: "Regular expression of alertnames that never block, as kured's --alert-filter-regexp " +
			"(e.g. ^(Watchdog|RebootRequired)$). Empty: none ignored.",
		field: func(c *Config) any { return &c.Gates.Prometheus.IgnoreAlerts },
	},
	{
		name: "gates.prometheus.timeout", kind: kindDuration, def: "10s", check: positive,
		doc:   "Longest one query of gates.prometheus.url may take; a query that times out blocks.",
		field: func(c *Config) any { return &c.Gates.Prometheus.Timeout },
	},
	{
		name: "gates.blockingPods", kind: kindString, def: "", check: checkSelector,
		doc: "Label selector (app=backup,tier in (db)): while a pod that matches runs on this node, a " +
			"disruptive event stays Pending naming it, as kured's --blocking-pod-selector. Empty: no pod gate.",
		field: func(c *Config) any { return &c.Gates.BlockingPods },
	},
	{
		name: "gates.command", kind: kindString, def: "",
		doc: "A command, run by /bin/sh -c, that must exit 0 before a disruptive event starts; any other " +
			"exit keeps the event Pending with the command's last output line. A read-only probe: it runs " +
			"in host.mode simulate too. Empty: no command gate.",
		field: func(c *Config) any { return &c.Gates.Command },
	},
	{
		name: "gates.commandTimeout", kind: kindDuration, def: "30s", check: positive,
		doc:   "Longest a run of gates.command may take; one that outlives it is killed and blocks.",
		field: func(c *Config) any { return &c.Gates.CommandTimeout },
	},
	{
		name: "readiness.checks", kind: kindStrings, def: "daemonsets,resources,conditions,command", check: checkReadinessChecks,
		doc: "What must be back before the agent uncordons a node at the end of a reboot, an os-upgrade or " +
			"a gpu-reset with drain: daemonsets (every DaemonSet with a Ready pod on the node at claim has " +
			"one again), resources (every extended resource in status.allocatable, e.g. nvidia.com/gpu, " +
			"at least its count at claim), conditions (readiness.conditions, and GPUHealthy True where the " +
			"agent runs the GPU stack), command (readiness.command exits 0; nothing when unset). An event's " +
			"parameters.readinessChecks narrows them (none, or a list). Empty: none by default.",
		field: func(c *Config) any { return &c.Readiness.Checks },
	},
	{
		name: "readiness.daemonSets.namespaces", kind: kindStrings, def: "", check: checkNamespaces,
		doc: "The namespaces whose DaemonSets the daemonsets check requires (e.g. kube-system,gpu-operator). " +
			"Empty: every namespace.",
		field: func(c *Config) any { return &c.Readiness.DaemonSets.Namespaces },
	},
	{
		name: "readiness.daemonSets.selector", kind: kindString, def: "", check: checkSelector,
		doc: "Label selector (app in (cni,nvidia-device-plugin-daemonset)) on the labels of a DaemonSet's " +
			"pod on the node: only the DaemonSets whose pod matches are required by the daemonsets check. " +
			"Empty: every DaemonSet with a Ready pod on the node at claim.",
		field: func(c *Config) any { return &c.Readiness.DaemonSets.Selector },
	},
	{
		name: "readiness.conditions", kind: kindStrings, def: "", check: checkConditionList,
		doc: "Node conditions that must have their healthy status before the uncordon, as Type=Status " +
			"(node-problem-detector's, e.g. KernelDeadlock=False,ReadonlyFilesystem=False).",
		field: func(c *Config) any { return &c.Readiness.Conditions },
	},
	{
		name: "readiness.command", kind: kindString, def: "",
		doc: "A command, run by /bin/sh -c, that must exit 0 before the uncordon (the readiness check " +
			"command). Empty: no command check.",
		field: func(c *Config) any { return &c.Readiness.Command },
	},
	{
		name: "readiness.commandTimeout", kind: kindDuration, def: "30s", check: positive,
		doc:   "Longest one run of readiness.command may take; one that outlives it counts as not ready.",
		field: func(c *Config) any { return &c.Readiness.CommandTimeout },
	},
	{
		name: "readiness.timeout", kind: kindDuration, def: "10m", check: positive,
		doc: "Longest the agent waits for the readiness checks; then the event ends Failed naming what " +
			"never became ready (see readiness.onTimeout).",
		field: func(c *Config) any { return &c.Readiness.Timeout },
	},
	{
		name: "readiness.onTimeout", kind: kindString, def: ReadinessKeepCordoned,
		enum: []string{ReadinessKeepCordoned, ReadinessUncordon},
		doc: "What a readiness timeout (or `reboot.readyTimeout`, or the event's SLA reached during either wait) " +
			"leaves: keepCordoned keeps the node cordoned, its cordon annotation " +
			"naming the event, until an admin uncordons it; uncordon gives the node back anyway (pods may " +
			"then land on a node whose DaemonSets or devices are not back).",
		field: func(c *Config) any { return &c.Readiness.OnTimeout },
	},
	{
		name: "notifications.urls", kind: kindStrings, def: "", check: checkNotifyURLs,
		doc: "Where to tell people when this agent claims an event, when a step fails it and when it " +
			"ends: shoutrrr URLs, as kured's --notify-url (slack://hook:..., teams://..., " +
			"mattermost://host/token, discord://..., generic+https://host/path for a webhook). Sent " +
			"asynchronously, kept in the journal until delivered (a reboot does not lose one), retried " +
			"for 24 h; nothing waits for them. A URL that does not parse is refused at load (named by " +
			"its place, never its text: URLs carry tokens); doctor --notify-test sends a test message. " +
			"In the environment: a comma-separated list. Empty: no notifications.",
		field: func(c *Config) any { return &c.Notifications.URLs },
	},
	{
		name: "notifications.timeout", kind: kindDuration, def: "10s", check: positive,
		doc:   "Longest one send to one URL may take; a send that outlives it fails and is retried.",
		field: func(c *Config) any { return &c.Notifications.Timeout },
	},
	{
		name: "gpu.resetMethod", kind: kindString, def: ResetMethodAuto,
		enum: []string{ResetMethodAuto, ResetMethodNvidiaSMI, ResetMethodNVML},
		doc: "How gpu-reset resets a GPU: nvidia-smi runs nvidia-smi --gpu-reset; nvml detaches each GPU " +
			"from the PCI bus (NVML drain-state and remove) and rescans the bus to bring it back, and is " +
			"used only when named here; auto is nvidia-smi, and an event fails at claim when nvidia-smi " +
			"is not found (never a silent fallback to nvml).",
		field: func(c *Config) any { return &c.GPU.ResetMethod },
	},
	{
		name: "gpu.driverRoot", kind: kindString, def: "", check: emptyOrAbsolute,
		doc: "Root of an NVIDIA driver that is not installed on the host, as the GPU Operator's " +
			"driver container mounts it (/run/nvidia/driver): NVML is then loaded from the " +
			"libnvidia-ml.so.1 under it (usr/lib/x86_64-linux-gnu, usr/lib64, … as the NVIDIA Container " +
			"Toolkit searches). Empty: the host's library. With gpu.nvidiaSMI auto, gpu-reset runs the root's " +
			"nvidia-smi inside it (chroot), which reaches the driver container's persistence daemon.",
		field: func(c *Config) any { return &c.GPU.DriverRoot },
	},
	{
		name: "gpu.nvidiaSMI", kind: kindString, def: NvidiaSMIAuto, check: autoOrAbsolute,
		doc: "The nvidia-smi that gpu-reset runs (the nvidia-smi route, and persistence mode under a " +
			"driver root). auto: with gpu.driverRoot set and <driverRoot>/usr/bin/nvidia-smi present, " +
			"chroot <driverRoot> nvidia-smi (as NVIDIA's NVSentinel runs it on a GPU Operator node; " +
			"persistence mode is then turned off and restored through it, so that the driver " +
			"container's nvidia-persistenced lets go of the GPUs); otherwise nvidia-smi on PATH. An " +
			"absolute path: that binary, run on the host.",
		field: func(c *Config) any { return &c.GPU.NvidiaSMI },
	},
	{
		name: "gpu.autoRemediate", kind: kindBool, def: "false",
		doc: "When true the agent requests a gpu-reset event on its own for a GPU whose health " +
			"signals call for a reset. When false it only reports them.",
		field: func(c *Config) any { return &c.GPU.AutoRemediate },
	},
	{
		name: "gpu.remediation.group", kind: kindString, def: "auto-gpu-reset", check: checkGroup,
		doc: "Disruption group of the gpu-reset events gpu.autoRemediate requests: the fleet shares its " +
			"slots and its circuit breaker (Lease <group>-breaker). Only with gpu.autoRemediate true.",
		field: func(c *Config) any { return &c.GPU.Remediation.Group },
	},
	{
		name: "gpu.remediation.maxConcurrent", kind: kindInt, def: "1", check: checkMaxConcurrent,
		doc: "How many nodes of gpu.remediation.group may reset GPUs on an automatic request at once " +
			"(1-1000). Only with gpu.autoRemediate true.",
		field: func(c *Config) any { return &c.GPU.Remediation.MaxConcurrent },
	},
	{
		name: "gpu.remediation.breakerFailures", kind: kindInt, def: "3", check: atLeastOne,
		doc: "Automatic gpu-reset requests of gpu.remediation.group that may end Failed or SlaExpired, " +
			"fleet-wide, before every agent of the group stops requesting (Lease <group>-breaker; delete " +
			"it to close the breaker). Only with gpu.autoRemediate true.",
		field: func(c *Config) any { return &c.GPU.Remediation.BreakerFailures },
	},
	{
		name: "gpu.services", kind: kindStrings, def: "nvidia-dcgm.service,nvidia-persistenced.service",
		check: checkUnits,
		doc: "systemd units that hold GPUs open: stopped before a reset and started again after it. " +
			"In the environment: a comma-separated list.",
		field: func(c *Config) any { return &c.GPU.Services },
	},
	{
		name: "gpu.operator.components", kind: kindStrings,
		def:   "device-plugin,gpu-feature-discovery,dcgm-exporter,dcgm,operator-validator,mig-manager",
		check: checkComponents,
		doc: "NVIDIA GPU Operator components cleared from the node for a GPU reset: gpu-reset sets each " +
			"one's deploy label (gpu.operator.labelPrefix + component) to gpu.operator.pausedValue, waits " +
			"until its pods are gone, and restores the label exactly after the reset (also on failure). " +
			"Only labels present on the Node are touched. Empty: the GPU Operator is left alone.",
		field: func(c *Config) any { return &c.GPU.Operator.Components },
	},
	{
		name: "gpu.operator.labelPrefix", kind: kindString, def: "nvidia.com/gpu.deploy.", check: nonEmpty,
		doc:   "Prefix of the GPU Operator's per-component deploy labels on the Node.",
		field: func(c *Config) any { return &c.GPU.Operator.LabelPrefix },
	},
	{
		name: "gpu.operator.pausedValue", kind: kindString, def: "false", check: nonEmpty,
		doc: "Value a deploy label is set to while its component is paused. The GPU Operator removes a " +
			"component's pod from a node whose label is not \"true\" (its upgrade controller uses " +
			"paused-for-driver-upgrade).",
		field: func(c *Config) any { return &c.GPU.Operator.PausedValue },
	},
	{
		name: "gpu.operator.podTimeout", kind: kindDuration, def: "5m", check: positive,
		doc:   "How long gpu-reset waits for the paused components' pods to leave the node before the step fails.",
		field: func(c *Config) any { return &c.GPU.Operator.PodTimeout },
	},
	{
		name: "osUpgrade.profiles", kind: kindProfiles, defDoc: "none",
		decode: decodeProfiles, fields: docFields(profileFields),
		doc: "Named OS-upgrade procedures. An os-upgrade event selects one by name; a command never " +
			"comes from the API. File only: no flag, no env.",
		example: `osUpgrade:
  profiles:
    ## Run without a shell unless you call one; $PATH is not searched.
    debian-full-upgrade:
      ## --force-confdef/--force-confold: an edited conffile keeps its
      ## edits and never prompts (there is nobody to answer).
      command: [/bin/sh, -c, "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold full-upgrade"]
      timeout: 1h
      rebootPolicy: if-required
      ## After a power cut mid-upgrade: done when nothing is left to upgrade.
      check: [/bin/sh, -c, "apt-get -s -o Debug::NoLocking=1 full-upgrade | grep -q '^0 upgraded, 0 newly installed'"]
`,
	},
	{
		name: "exec.drivers", kind: kindExecDrivers, defDoc: "none",
		decode: decodeExecDrivers, fields: docFields(execDriverFields),
		doc: "Vendor drivers made of ordered local commands. Each one is published as a " +
			"LifecycleTransition from start to end. File only: no flag, no env.",
		example: `exec:
  drivers:
    - name: example.com/bios-update       ## or just bios-update: lifecycle-agent.x-k8s.io/bios-update
      start: BIOSUpdateStarted
      end: BIOSUpdateComplete
      sla: 2h
      params: [version]
      steps:
        - name: flash
          command: [/usr/local/sbin/bios-flash]
          timeout: 30m
          check: [/usr/local/sbin/bios-flash, --verify]
`,
	},
	{
		name: "maintenance.windows", kind: kindWindows, defDoc: "none (any time)",
		decode: decodeWindows, fields: docFields(windowFields),
		doc: "Weekly windows in which a disruptive event may start, as kured's --reboot-days, " +
			"--start-time, --end-time and --time-zone. Outside every window such an event stays Pending, " +
			"naming the next opening, and the Node says MaintenancePlanned=True reason MaintenanceWindow; " +
			"one that started inside runs to its end. An event with parameter maintenanceWindow=ignore " +
			"does not wait. File only: no flag, no env.",
		example: `maintenance:
  windows:
    ## Weeknights 22:00-04:00 Berlin time, and all of Sunday.
    - days: [mon, tue, wed, thu, fri]
      start: "22:00"
      end: "04:00"
      timeZone: Europe/Berlin
    - days: [sun]
      start: "00:00"
      end: "00:00"
      timeZone: Europe/Berlin
`,
	},
}

// FlagScope says on which commands a configuration flag is registered.
type FlagScope int

// Flag scopes. Not stored anywhere.
const (
	GlobalFlags FlagScope = 1 // persistent on the root command: every command has them
	RunFlags    FlagScope = 2 // on `run` only
)

// key describes one configuration key. See keys.
type key struct {
	name      string    // dotted, case-sensitive, as written in the file
	flag      string    // flag name without "--"; "" for none
	scope     FlagScope // where the flag is registered
	kind      *kind
	def       string   // default in the env-var form, parsed by kind.fromString
	defDoc    string   // default as the docs show it, when def does not say it well
	enum      []string // allowed values, for string keys
	check     func(any) error
	doc       string
	notInFile bool // flag and env only (config)

	// field points at the Config field a layered key fills.
	field func(*Config) any

	// decode reads a structured, file-only key (kindProfiles, kindExecDrivers).
	decode  func(d *fileDecoder, n *yaml.Node, at string) error
	fields  []docField // its sub-keys, for the docs
	example string     // its example for packaging/config.yaml
}

// layered keys go through viper: defaults, file, env and (some) flags.
func (k *key) layered() bool { return k.decode == nil && !k.notInFile }

// env is the environment variable for k: EnvPrefix + the key in upper snake
// case; "." and "-" become "_" (host.mode → LIFECYCLE_AGENT_HOST_MODE).
func (k *key) env() string {
	if k.decode != nil {
		return ""
	}
	var b strings.Builder
	b.WriteString(EnvPrefix)
	prev := rune(0)
	for _, r := range k.name {
		switch {
		case r == '.' || r == '-':
			b.WriteByte('_')
		case unicode.IsUpper(r) && (unicode.IsLower(prev) || unicode.IsDigit(prev)):
			b.WriteByte('_')
			b.WriteRune(r)
		default:
			b.WriteRune(unicode.ToUpper(r))
		}
		prev = r
	}
	return b.String()
}

// hasDefault is false for tri-state and file-only keys: unset stays unset.
func (k *key) hasDefault() bool { return k.kind != kindTriBool && k.decode == nil }

// defaultValue is def parsed; keys_test checks that every def parses.
func (k *key) defaultValue() (any, error) { return k.kind.fromString(k.def) }

// validate runs the enum and the key's own check on a typed value.
func (k *key) validate(v any) error {
	if len(k.enum) > 0 {
		s, _ := v.(string)
		if !slices.Contains(k.enum, s) {
			return fmt.Errorf("invalid value %q; want %s", s, orList(k.enum))
		}
	}
	if k.check != nil {
		return k.check(v)
	}
	return nil
}

// typeDoc is the type column of the docs.
func (k *key) typeDoc() string {
	if len(k.enum) > 0 {
		return strings.Join(k.enum, " | ")
	}
	return k.kind.doc
}

// defaultDoc is the default column of the docs.
func (k *key) defaultDoc() string {
	if k.defDoc != "" {
		return k.defDoc
	}
	if k.kind == kindStrings {
		return "[" + strings.ReplaceAll(k.def, ",", ", ") + "]"
	}
	if k.def == "" {
		return `""`
	}
	return k.def
}

// usage is the flag's help line: the first sentence of doc plus the env var.
func (k *key) usage() string {
	s := k.doc
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i+1]
	}
	if len(k.enum) > 0 {
		s += " One of " + strings.Join(k.enum, "|") + "."
	}
	if k.defDoc != "" {
		s += " (default: " + k.defDoc + ")"
	}
	return s + " [env " + k.env() + "]"
}

// AddFlags registers the configuration flags of scope on fs, with the
// defaults and help text from the key table. Load reads them back from the
// parsed flag set; only flags the user set override env and file.
func AddFlags(fs *pflag.FlagSet, scope FlagScope) {
	for _, k := range keys {
		if k.flag == "" || k.scope != scope {
			continue
		}
		switch k.kind {
		case kindDuration:
			d, _ := time.ParseDuration(k.def)
			fs.Duration(k.flag, d, k.usage())
		case kindBool:
			b, _ := strconv.ParseBool(k.def)
			fs.Bool(k.flag, b, k.usage())
		default:
			fs.String(k.flag, k.def, k.usage())
		}
	}
}

// lookupKey finds a key by its dotted name.
func lookupKey(name string) *key {
	for _, k := range keys {
		if k.name == name {
			return k
		}
	}
	return nil
}

// --- checks -----------------------------------------------------------

func checkNotifyURLs(v any) error {
	_, err := notify.Parse(v.([]string))
	return err
}

func checkRegexp(v any) error {
	if _, err := regexp.Compile(v.(string)); err != nil {
		return fmt.Errorf("invalid regular expression: %v", err)
	}
	return nil
}

func checkSelector(v any) error {
	if _, err := labels.Parse(v.(string)); err != nil {
		return fmt.Errorf("invalid label selector: %v", err)
	}
	return nil
}

func checkHTTPURL(v any) error {
	s := v.(string)
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("invalid URL %q: want http://host:port or https://host:port", s)
	}
	return nil
}

func nonEmpty(v any) error {
	if v.(string) == "" {
		return fmt.Errorf("must not be empty")
	}
	return nil
}

func checkReadinessChecks(v any) error {
	for _, c := range v.([]string) {
		switch c {
		case "daemonsets", "resources", "conditions", "command":
		default:
			return fmt.Errorf("%q: want daemonsets, resources, conditions or command", c)
		}
	}
	return nil
}

func checkNamespaces(v any) error {
	for _, ns := range v.([]string) {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
		}
	}
	return nil
}

func checkConditionList(v any) error {
	for _, c := range v.([]string) {
		t, st, ok := strings.Cut(c, "=")
		if !ok || t == "" || (st != "True" && st != "False" && st != "Unknown") {
			return fmt.Errorf("%q: want Type=True, Type=False or Type=Unknown", c)
		}
	}
	return nil
}

func autoOrAbsolute(v any) error {
	if p := v.(string); p != NvidiaSMIAuto && !strings.HasPrefix(p, "/") {
		return fmt.Errorf("must be %s or an absolute path, got %q", NvidiaSMIAuto, p)
	}
	return nil
}

func emptyOrAbsolute(v any) error {
	if p := v.(string); p != "" && !strings.HasPrefix(p, "/") {
		return fmt.Errorf("must be an absolute path (or empty), got %q", p)
	}
	return nil
}

func positive(v any) error {
	if d := v.(time.Duration); d <= 0 {
		return fmt.Errorf("must be positive, got %s", d)
	}
	return nil
}

// MinEvictRetryDelay is drain.evictRetryDelay's floor.
const MinEvictRetryDelay = 500 * time.Millisecond

// atLeast refuses a duration below floor.
func atLeast(floor time.Duration) func(any) error {
	return func(v any) error {
		if d := v.(time.Duration); d < floor {
			return fmt.Errorf("must be at least %s, got %s", floor, d)
		}
		return nil
	}
}

func atLeastOne(v any) error {
	if i := v.(int); i < 1 {
		return fmt.Errorf("must be at least 1, got %d", i)
	}
	return nil
}

// checkMaxConcurrent is a disruption budget's maxConcurrent: 1-1000, as the
// LifecycleEvent's spec.disruption.maxConcurrent.
func checkMaxConcurrent(v any) error {
	if i := v.(int); i < 1 || i > 1000 {
		return fmt.Errorf("must be 1-1000, got %d", i)
	}
	return nil
}

// checkGroup is a disruption group's name, as spec.disruption.group takes
// it; node-… is the node Leases' prefix.
func checkGroup(v any) error {
	s := v.(string)
	switch {
	case len(s) < 1 || len(s) > 56:
		return fmt.Errorf("must be 1-56 characters, got %d", len(s))
	case !groupPattern.MatchString(s):
		return fmt.Errorf("%q: want lowercase letters, digits and '-', starting and ending with a letter or digit", s)
	case strings.HasPrefix(s, "node-"):
		return fmt.Errorf("%q: node-… names the node Leases", s)
	}
	return nil
}

var groupPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func nonNegative(v any) error {
	if d := v.(time.Duration); d < 0 {
		return fmt.Errorf("must not be negative, got %s", d)
	}
	return nil
}

// checkNodeName accepts "" (the host name is used) or a DNS-1123 subdomain.
func checkNodeName(v any) error {
	s := v.(string)
	if s == "" {
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
		return fmt.Errorf("invalid node name %q: %s", s, errs[0])
	}
	return nil
}

// maxSocketPath is sizeof(sockaddr_un.sun_path) on Linux minus the NUL.
const maxSocketPath = 107

func checkSocketPath(v any) error {
	s := v.(string)
	if s == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(s) > maxSocketPath {
		return fmt.Errorf("unix socket path is %d bytes long; at most %d fit", len(s), maxSocketPath)
	}
	return nil
}

// checkLoopback accepts only a loopback IP literal and a port 1-65535, so
// that metrics never listen beyond the host by accident.
func checkLoopback(v any) error {
	s := v.(string)
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return fmt.Errorf("invalid address %q: want a loopback IP and port such as 127.0.0.1:9810", s)
	}
	if !ap.Addr().IsLoopback() {
		return fmt.Errorf("address %q is not loopback: metrics listen on 127.0.0.1 or [::1] only", s)
	}
	if ap.Port() == 0 {
		return fmt.Errorf("address %q has port 0: want a fixed port such as 127.0.0.1:9810", s)
	}
	return nil
}

var unitRE = regexp.MustCompile(`^[A-Za-z0-9:_.\\@-]+\.(service|socket|target|timer|path|mount|automount|swap|device|scope|slice)$`)

func checkUnits(v any) error {
	for _, u := range v.([]string) {
		if !unitRE.MatchString(u) {
			return fmt.Errorf("invalid systemd unit name %q: want e.g. nvidia-dcgm.service", u)
		}
	}
	return nil
}

var componentRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`)

func checkComponents(v any) error {
	for _, c := range v.([]string) {
		if c == "driver" || c == "container-toolkit" {
			return fmt.Errorf("component %q cannot be paused for a GPU reset (it installs the driver or the runtime)", c)
		}
		if !componentRE.MatchString(c) {
			return fmt.Errorf("invalid component %q: want e.g. device-plugin", c)
		}
	}
	return nil
}

// orList renders [a b c] as "a, b or c".
func orList(list []string) string {
	if len(list) == 1 {
		return list[0]
	}
	return strings.Join(list[:len(list)-1], ", ") + " or " + list[len(list)-1]
}
