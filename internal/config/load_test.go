package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// defaults is what Load returns with no file, no env and no flags.
func defaults() *Config {
	return &Config{
		NodeName:       "node-a.example",
		Kubeconfig:     "/etc/kubernetes/kubelet.conf",
		JournalPath:    "/var/lib/lifecycle-agent/journal.db",
		SocketPath:     "/run/lifecycle-agent/agent.sock",
		MetricsAddress: "127.0.0.1:9810",
		APITimeout:     10 * time.Second,
		EventRetention: 24 * time.Hour,
		LogLevel:       "info",
		LogFormat:      "text",
		Host:           Host{Mode: "real"},
		Shutdown:       Shutdown{Budget: 5 * time.Second},
		Drain:          Drain{EvictRetryDelay: 5 * time.Second},
		Reboot:         Reboot{ReadyTimeout: 10 * time.Minute},
		Readiness: Readiness{Checks: []string{"daemonsets", "resources", "conditions", "command"}, Conditions: []string{}, DaemonSets: ReadinessDaemonSets{Namespaces: []string{}},
			CommandTimeout: 30 * time.Second, Timeout: 10 * time.Minute, OnTimeout: "keepCordoned"},
		Needs: Needs{Reboot: NeedsReboot{SentinelFile: "/var/run/reboot-required", CommandTimeout: 30 * time.Second, Interval: time.Minute,
			Policy: "report", Request: AutoRequest{Group: "auto-reboot", MaxConcurrent: 1, BreakerFailures: 3}}},
		GPU: GPU{
			ResetMethod: "auto", NvidiaSMI: "auto",
			Remediation: AutoRequest{Group: "auto-gpu-reset", MaxConcurrent: 1, BreakerFailures: 3},
			Services:    []string{"nvidia-dcgm.service", "nvidia-persistenced.service"},
			Operator: GPUOperator{
				Components:  []string{"device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "operator-validator", "mig-manager"},
				LabelPrefix: "nvidia.com/gpu.deploy.",
				PausedValue: "false",
				PodTimeout:  5 * time.Minute,
			},
		},
		Gates:         Gates{Prometheus: GatesPrometheus{Timeout: 10 * time.Second}, CommandTimeout: 30 * time.Second},
		Notifications: Notifications{URLs: []string{}, Timeout: 10 * time.Second},
	}
}

// valuesOf drops what Load records besides values.
func valuesOf(c *Config) Config {
	out := *c
	out.Path, out.Files, out.sources = "", nil, nil
	return out
}

func TestDefaults(t *testing.T) {
	isolate(t)
	got, err := load(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := defaults(); !reflect.DeepEqual(valuesOf(got), *want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", valuesOf(got), *want)
	}
	if got.Path != "" {
		t.Errorf("Path = %q for an absent default file, want empty", got.Path)
	}
	for _, k := range []string{"nodeName", "eventRetention", "host.mode", "gpu.services"} {
		if s := got.Source(k); s != "default" {
			t.Errorf("Source(%s) = %q, want default", k, s)
		}
	}
}

// TestPrecedence sets a key in every combination of layers and checks that
// flag > env > file > default, both for the value and for Source.
func TestPrecedence(t *testing.T) {
	type value struct {
		file, env, flag string // "" = layer does not set the key
	}
	keysUnderTest := []struct {
		name     string // key
		fileYAML func(v string) string
		vals     value
		get      func(*Config) any
		def      any
		parse    func(string) any
	}{
		{
			name: "nodeName", fileYAML: func(v string) string { return "nodeName: " + v + "\n" },
			vals: value{"from-file", "from-env", "from-flag"},
			get:  func(c *Config) any { return c.NodeName }, def: "node-a.example",
			parse: func(s string) any { return s },
		},
		{
			name: "eventRetention", fileYAML: func(v string) string { return "eventRetention: " + v + "\n" },
			vals: value{"1h", "2h", "3h"},
			get:  func(c *Config) any { return c.EventRetention }, def: 24 * time.Hour,
			parse: func(s string) any { d, _ := time.ParseDuration(s); return d },
		},
		{
			name: "host.mode", fileYAML: func(v string) string { return "host:\n  mode: " + v + "\n" },
			vals: value{"simulate", "real", "simulate"},
			get:  func(c *Config) any { return c.Host.Mode }, def: "real",
			parse: func(s string) any { return s },
		},
		{
			name: "shutdown.budget", fileYAML: func(v string) string { return "shutdown:\n  budget: " + v + "\n" },
			vals: value{"10s", "20s", "30s"},
			get:  func(c *Config) any { return c.Shutdown.Budget }, def: 5 * time.Second,
			parse: func(s string) any { d, _ := time.ParseDuration(s); return d },
		},
		{
			name: "journalPath", fileYAML: func(v string) string { return "journalPath: " + v + "\n" },
			vals: value{"/f/journal.db", "/e/journal.db", "/x/journal.db"},
			get:  func(c *Config) any { return c.JournalPath }, def: "/var/lib/lifecycle-agent/journal.db",
			parse: func(s string) any { return s },
		},
		{
			name: "metricsAddress", fileYAML: func(v string) string { return "metricsAddress: \"" + v + "\"\n" },
			vals: value{"127.0.0.1:1", "[::1]:2", "127.0.0.2:3"},
			get:  func(c *Config) any { return c.MetricsAddress }, def: "127.0.0.1:9810",
			parse: func(s string) any { return s },
		},
	}
	layers := []struct {
		name            string
		file, env, flag bool
		want            string // which layer wins: default, file, env, flag
	}{
		{name: "none", want: "default"},
		{name: "file", file: true, want: "file"},
		{name: "env", env: true, want: "env"},
		{name: "flag", flag: true, want: "flag"},
		{name: "file+env", file: true, env: true, want: "env"},
		{name: "file+flag", file: true, flag: true, want: "flag"},
		{name: "env+flag", env: true, flag: true, want: "flag"},
		{name: "file+env+flag", file: true, env: true, flag: true, want: "flag"},
	}
	for _, k := range keysUnderTest {
		key := lookupKey(k.name)
		for _, l := range layers {
			t.Run(k.name+"/"+l.name, func(t *testing.T) {
				isolate(t)
				file := ""
				if l.file {
					file = k.fileYAML(k.vals.file)
				}
				if l.env {
					t.Setenv(key.env(), k.vals.env)
				}
				var args []string
				if l.flag {
					args = []string{"--" + key.flag + "=" + k.vals.flag}
				}
				cfg, err := load(t, file, flags(t, args...))
				if err != nil {
					t.Fatal(err)
				}
				want, wantSrc := k.def, "default"
				switch l.want {
				case "file":
					want, wantSrc = k.parse(k.vals.file), cfg.Path+":"
				case "env":
					want, wantSrc = k.parse(k.vals.env), "env "+key.env()
				case "flag":
					want, wantSrc = k.parse(k.vals.flag), "flag --"+key.flag
				}
				if got := k.get(cfg); got != want {
					t.Errorf("%s = %v, want %v (from %s)", k.name, got, want, l.want)
				}
				if src := cfg.Source(k.name); !strings.HasPrefix(src, wantSrc) {
					t.Errorf("Source(%s) = %q, want %q", k.name, src, wantSrc)
				}
			})
		}
	}
}

func TestEnvOnlyKeys(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want func(*Config)
	}{
		{
			name: "list from a comma-separated variable",
			env:  map[string]string{"LIFECYCLE_AGENT_GPU_SERVICES": "a.service, b.service,"},
			want: func(c *Config) { c.GPU.Services = []string{"a.service", "b.service"} },
		},
		{
			name: "tri-state driver switch",
			env:  map[string]string{"LIFECYCLE_AGENT_DRIVERS_OS_UPGRADE_ENABLED": "true", "LIFECYCLE_AGENT_DRIVERS_DRAIN_ENABLED": "false"},
			want: func(c *Config) { c.Drivers.OSUpgrade.Enabled = ptr(true); c.Drivers.Drain.Enabled = ptr(false) },
		},
		{
			name: "bool and nested durations",
			env: map[string]string{
				"LIFECYCLE_AGENT_SHUTDOWN_MANAGE_LOGIND_DROP_IN": "true",
				"LIFECYCLE_AGENT_DRAIN_EVICT_RETRY_DELAY":        "1s",
				"LIFECYCLE_AGENT_REBOOT_READY_TIMEOUT":           "1m",
			},
			want: func(c *Config) {
				c.Shutdown.ManageLogindDropIn = true
				c.Drain.EvictRetryDelay = time.Second
				c.Reboot.ReadyTimeout = time.Minute
			},
		},
		{
			name: "empty variable is ignored",
			env:  map[string]string{"LIFECYCLE_AGENT_NODE_NAME": ""},
			want: func(c *Config) {},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			isolate(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			got, err := load(t, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			want := defaults()
			tt.want(want)
			if !reflect.DeepEqual(valuesOf(got), *want) {
				t.Errorf("got  %+v\nwant %+v", valuesOf(got), *want)
			}
		})
	}
}

// TestInvalid checks the exact one-line message of each refusal. FILE in
// want stands for the config file's path.
func TestInvalid(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		env   map[string]string
		flags []string
		want  string
	}{
		{
			name: "unknown nested key",
			file: "host:\n  mdoe: real\n",
			want: `config: FILE:2: unknown key "host.mdoe" (did you mean "host.mode"?)`,
		},
		{
			name: "unknown top-level key, wrong case",
			file: "nodename: a\n",
			want: `config: FILE:1: unknown key "nodename" (did you mean "nodeName"?)`,
		},
		{
			name: "unknown key without a near match",
			file: "logLevel: info\nbananas: 3\n",
			want: `config: FILE:2: unknown key "bananas"`,
		},
		{
			name: "unknown driver",
			file: "drivers:\n  frobnicate:\n    enabled: true\n",
			want: `config: FILE:2: unknown key "drivers.frobnicate"`,
		},
		{
			name: "config is not a file key",
			file: "config: /x.yaml\n",
			want: `config: FILE:1: unknown key "config"`,
		},
		{
			name: "bad duration",
			file: "eventRetention: banana\n",
			want: `config: FILE:1: key eventRetention: invalid duration "banana" (want a number and a unit, e.g. 90s, 10m, 24h)`,
		},
		{
			name: "duration without a unit",
			file: "shutdown:\n  budget: 30\n",
			want: `config: FILE:2: key shutdown.budget: invalid duration "30" (want a number and a unit, e.g. 90s, 10m, 24h)`,
		},
		{
			name: "negative duration",
			file: "eventRetention: -1h\n",
			want: `config: FILE:1: key eventRetention: must not be negative, got -1h0m0s`,
		},
		{
			name: "zero where positive is needed",
			file: "apiTimeout: 0\n",
			want: `config: FILE:1: key apiTimeout: must be positive, got 0s`,
		},
		{
			name: "evictRetryDelay below its floor",
			file: "drain:\n  evictRetryDelay: 100ms\n",
			want: `config: FILE:2: key drain.evictRetryDelay: must be at least 500ms, got 100ms`,
		},
		{
			name: "number for an enum",
			file: "host:\n  mode: 5\n",
			want: `config: FILE:2: key host.mode: want real or simulate, got number 5`,
		},
		{
			name: "bad enum value",
			file: "host:\n  mode: banana\n",
			want: `config: FILE:2: key host.mode: invalid value "banana"; want real or simulate`,
		},
		{
			name: "number for a string",
			file: "nodeName: 42\n",
			want: `config: FILE:1: key nodeName: want a string, got number 42`,
		},
		{
			name: "yes is not a bool",
			file: "gpu:\n  autoRemediate: yes\n",
			want: `config: FILE:2: key gpu.autoRemediate: want true or false, got "yes"`,
		},
		{
			name: "scalar for a section",
			file: "host: real\n",
			want: `config: FILE:1: key host: want a mapping of keys, got "real"`,
		},
		{
			name: "scalar for a list",
			file: "gpu:\n  services: nvidia-dcgm.service\n",
			want: `config: FILE:2: key gpu.services: want a list of strings, got "nvidia-dcgm.service"`,
		},
		{
			name: "bad unit name",
			file: "gpu:\n  services: [nvidia-dcgm]\n",
			want: `config: FILE:2: key gpu.services: invalid systemd unit name "nvidia-dcgm": want e.g. nvidia-dcgm.service`,
		},
		{
			name: "unknown notification service, its token not shown",
			file: "notifications:\n  urls:\n    - generic+https://hooks.example/x\n    - slakc://hook:s3cr3t@webhook\n",
			want: `config: FILE:3: key notifications.urls: URL #2: unknown notification service "slakc" (the services are shoutrrr's: bark, discord, generic, googlechat, gotify, hangouts, ifttt, join, lark, logger, matrix, mattermost, notifiarr, ntfy, opsgenie, pagerduty, pushbullet, pushover, rocketchat, signal, slack, smtp, teams, telegram, wecom, zulip)`,
		},
		{
			name: "metrics on all interfaces",
			file: "metricsAddress: 0.0.0.0:9810\n",
			want: `config: FILE:1: key metricsAddress: address "0.0.0.0:9810" is not loopback: metrics listen on 127.0.0.1 or [::1] only`,
		},
		{
			name: "metrics on a host name",
			file: "metricsAddress: localhost:9810\n",
			want: `config: FILE:1: key metricsAddress: invalid address "localhost:9810": want a loopback IP and port such as 127.0.0.1:9810`,
		},
		{
			name: "bad node name",
			file: "nodeName: Node_A\n",
			want: `config: FILE:1: key nodeName: invalid node name "Node_A": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`,
		},
		{
			name: "key given twice",
			file: "logLevel: info\nlogLevel: debug\n",
			want: `config: FILE:2: key logLevel: given twice (first at line 1)`,
		},
		{
			name: "two documents",
			file: "logLevel: info\n---\nlogLevel: debug\n",
			want: `config: FILE: more than one YAML document (---); keep one`,
		},
		{
			name: "not a mapping",
			file: "- logLevel\n",
			want: `config: FILE:1: the file must be a mapping of keys, got a list`,
		},
		{
			name: "broken YAML",
			file: "logLevel: [\n",
			want: `config: FILE: invalid YAML: line 1: did not find expected node content`,
		},
		{
			name: "profile command not absolute",
			file: "osUpgrade:\n  profiles:\n    up:\n      command: [apt-get, upgrade]\n",
			want: `config: FILE:4: key osUpgrade.profiles.up.command: command "apt-get" is not an absolute path ($PATH is not searched)`,
		},
		{
			name: "profile without command",
			file: "osUpgrade:\n  profiles:\n    up:\n      timeout: 1h\n",
			want: `config: FILE:4: key osUpgrade.profiles.up: missing required key "command"`,
		},
		{
			name: "profile bad reboot policy",
			file: "osUpgrade:\n  profiles:\n    up:\n      command: [/bin/true]\n      rebootPolicy: sometimes\n",
			want: `config: FILE:5: key osUpgrade.profiles.up.rebootPolicy: want always, never or if-required, got "sometimes"`,
		},
		{
			name: "profile unknown field",
			file: "osUpgrade:\n  profiles:\n    up:\n      command: [/bin/true]\n      reboot: always\n",
			want: `config: FILE:5: unknown key "osUpgrade.profiles.up.reboot"`,
		},
		{
			name: "profile bad name",
			file: "osUpgrade:\n  profiles:\n    Up_Grade:\n      command: [/bin/true]\n",
			want: `config: FILE:3: key osUpgrade.profiles: invalid profile name "Up_Grade": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`,
		},
		{
			name: "exec driver shadows a built-in",
			file: execDriver("name: reboot", "start: A", "end: B"),
			want: `config: FILE:3: key exec.drivers[0].name: "lifecycle-agent.x-k8s.io/reboot" is a built-in driver; choose another name`,
		},
		{
			name: "exec driver shadows a built-in's transition from another domain",
			file: execDriver("name: example.com/drain", "start: A", "end: B"),
			want: `config: FILE:3: key exec.drivers[0].name: "example.com/drain" would publish its transition as <node>-drain, the built-in drain driver's; choose another name`,
		},
		{
			name: "two exec drivers with one short name",
			file: "exec:\n  drivers:\n    - name: a.example.com/fw\n      start: A\n      end: B\n      steps:\n        - name: s\n          command: [/bin/true]\n    - name: b.example.com/fw\n      start: A\n      end: B\n      steps:\n        - name: s\n          command: [/bin/true]\n",
			want: `config: FILE:9: key exec.drivers[1].name: driver "b.example.com/fw" has the short name "fw" of the driver at line 3: both would publish the transition <node>-fw`,
		},
		{
			name: "exec driver same start and end",
			file: execDriver("name: fw", "start: A", "end: A"),
			want: `config: FILE:5: key exec.drivers[0].end: must differ from start (A)`,
		},
		{
			name: "exec driver state not CamelCase",
			file: execDriver("name: fw", "start: fw-started", "end: B"),
			want: `config: FILE:4: key exec.drivers[0].start: invalid state "fw-started": want CamelCase letters and digits, at most 63, e.g. DrainStarted`,
		},
		{
			name: "exec driver bad vendor domain",
			file: execDriver("name: Example_com/fw", "start: A", "end: B"),
			want: `config: FILE:3: key exec.drivers[0].name: invalid driver name "Example_com/fw": vendor domain "Example_com": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`,
		},
		{
			name: "exec driver param repeated",
			file: execDriver("name: fw", "start: A", "end: B", "params: [version, version]"),
			want: `config: FILE:6: key exec.drivers[0].params: parameter "version" listed twice`,
		},
		{
			name: "exec driver without steps",
			file: "exec:\n  drivers:\n    - name: fw\n      start: A\n      end: B\n",
			want: `config: FILE:3: key exec.drivers[0]: missing required key "steps"`,
		},
		{
			name: "exec step unknown field",
			file: "exec:\n  drivers:\n    - name: fw\n      start: A\n      end: B\n      steps:\n        - name: s\n          command: [/bin/true]\n          tiemout: 5m\n",
			want: `config: FILE:9: unknown key "exec.drivers[0].steps[0].tiemout" (did you mean "exec.drivers[0].steps[0].timeout"?)`,
		},
		{
			name: "exec step names repeated",
			file: "exec:\n  drivers:\n    - name: fw\n      start: A\n      end: B\n      steps:\n        - {name: s, command: [/bin/true]}\n        - {name: s, command: [/bin/false]}\n",
			want: `config: FILE:8: key exec.drivers[0].steps[1].name: step "s" is defined twice (first at line 7)`,
		},
		{
			name: "exec driver defined twice",
			file: "exec:\n  drivers:\n    - {name: fw, start: A, end: B, steps: [{name: s, command: [/bin/true]}]}\n" +
				"    - {name: lifecycle-agent.x-k8s.io/fw, start: C, end: D, steps: [{name: s, command: [/bin/true]}]}\n",
			want: `config: FILE:4: key exec.drivers[1].name: driver "lifecycle-agent.x-k8s.io/fw" is defined twice (first at line 3)`,
		},
		{
			name: "maintenance window with an unknown day",
			file: "maintenance:\n  windows:\n    - days: [mon, funday]\n      start: \"22:00\"\n      end: \"04:00\"\n",
			want: `config: FILE:3: key maintenance.windows[0].days: unknown day "funday"; want sun, mon, tue, wed, thu, fri or sat`,
		},
		{
			name: "maintenance window with a 12-hour time",
			file: "maintenance:\n  windows:\n    - start: \"22:00\"\n      end: 4am\n",
			want: `config: FILE:4: key maintenance.windows[0].end: invalid time of day "4am"; want HH:MM (24-hour), e.g. 22:00`,
		},
		{
			name: "maintenance window without a start",
			file: "maintenance:\n  windows:\n    - end: \"04:00\"\n",
			want: `config: FILE:3: key maintenance.windows[0]: missing required key "start"`,
		},
		{
			name: "maintenance window in the host's local zone",
			file: "maintenance:\n  windows:\n    - {start: \"22:00\", end: \"04:00\", timeZone: Local}\n",
			want: `config: FILE:3: key maintenance.windows[0].timeZone: want an IANA time zone name such as UTC or Europe/Berlin ("Local" is refused: it differs between hosts)`,
		},
		{
			name: "maintenance window in an unknown zone",
			file: "maintenance:\n  windows:\n    - {start: \"22:00\", end: \"04:00\", timeZone: Europe/Atlantis}\n",
			want: `config: FILE:3: key maintenance.windows[0].timeZone: unknown time zone "Europe/Atlantis" (want an IANA name such as Europe/Berlin)`,
		},
		{
			name: "alert gate with an invalid regular expression",
			file: "gates:\n  prometheus:\n    url: http://prometheus:9090\n    ignoreAlerts: \"^(Watchdog\"\n",
			want: "config: FILE:4: key gates.prometheus.ignoreAlerts: invalid regular expression: error parsing regexp: missing closing ): `^(Watchdog`",
		},
		{
			name: "alert gate without a scheme",
			file: "gates:\n  prometheus:\n    url: prometheus:9090\n",
			want: `config: FILE:3: key gates.prometheus.url: invalid URL "prometheus:9090": want http://host:port or https://host:port`,
		},
		{
			name: "readiness DaemonSet selector that does not parse",
			file: "readiness:\n  daemonSets:\n    selector: \"app in (cni\"\n",
			want: `config: FILE:3: key readiness.daemonSets.selector: invalid label selector: unable to parse requirement: found '', expected: ',' or ')'`,
		},
		{
			name: "readiness DaemonSet namespace that is not a name",
			file: "readiness:\n  daemonSets:\n    namespaces: [kube-system, Kube_System]\n",
			want: `config: FILE:3: key readiness.daemonSets.namespaces: namespace "Kube_System": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`,
		},
		{
			name: "pod gate with an invalid selector",
			env:  map[string]string{"LIFECYCLE_AGENT_GATES_BLOCKING_PODS": "app in backup"},
			want: `config: env LIFECYCLE_AGENT_GATES_BLOCKING_PODS: key gates.blockingPods: invalid label selector: unable to parse requirement: found 'backup' expected: '('`,
		},
		{
			name: "request key while the policy reports",
			file: "needs:\n  reboot:\n    maxConcurrent: 5\n",
			want: `config: FILE:3: key needs.reboot.maxConcurrent: does nothing unless needs.reboot.policy is request; set that too, or remove this`,
		},
		{
			name: "reboot requests without the reboot driver",
			file: "drivers:\n  reboot:\n    enabled: false\nneeds:\n  reboot:\n    policy: request\n",
			want: `config: FILE:6: key needs.reboot.policy: request needs the reboot driver, and drivers.reboot.enabled is false; enable it, or use report`,
		},
		{
			name: "remediation group without autoRemediate",
			env:  map[string]string{"LIFECYCLE_AGENT_GPU_REMEDIATION_GROUP": "rack-1"},
			want: `config: env LIFECYCLE_AGENT_GPU_REMEDIATION_GROUP: key gpu.remediation.group: does nothing unless gpu.autoRemediate is true; set that too, or remove this`,
		},
		{
			name: "maxConcurrent as a string",
			file: "needs:\n  reboot:\n    policy: request\n    maxConcurrent: \"2\"\n",
			want: `config: FILE:4: key needs.reboot.maxConcurrent: want a whole number, got "2"`,
		},
		{
			name: "maxConcurrent out of range",
			file: "needs:\n  reboot:\n    policy: request\n    maxConcurrent: 0\n",
			want: `config: FILE:4: key needs.reboot.maxConcurrent: must be 1-1000, got 0`,
		},
		{
			name: "breakerFailures not a number from env",
			env:  map[string]string{"LIFECYCLE_AGENT_NEEDS_REBOOT_POLICY": "request", "LIFECYCLE_AGENT_NEEDS_REBOOT_BREAKER_FAILURES": "three"},
			want: `config: env LIFECYCLE_AGENT_NEEDS_REBOOT_BREAKER_FAILURES: key needs.reboot.breakerFailures: want a whole number, got "three"`,
		},
		{
			name: "group named like a node Lease",
			file: "needs:\n  reboot:\n    policy: request\n    group: node-a\n",
			want: `config: FILE:4: key needs.reboot.group: "node-a": node-… names the node Leases`,
		},
		{
			name: "bad duration from env",
			env:  map[string]string{"LIFECYCLE_AGENT_EVENT_RETENTION": "banana"},
			want: `config: env LIFECYCLE_AGENT_EVENT_RETENTION: key eventRetention: invalid duration "banana" (want a number and a unit, e.g. 90s, 10m, 24h)`,
		},
		{
			name: "bad enum from env",
			env:  map[string]string{"LIFECYCLE_AGENT_HOST_MODE": "Simulate"},
			want: `config: env LIFECYCLE_AGENT_HOST_MODE: key host.mode: invalid value "Simulate"; want real or simulate`,
		},
		{
			name: "bad bool from env",
			env:  map[string]string{"LIFECYCLE_AGENT_DRIVERS_GPU_RESET_ENABLED": "maybe"},
			want: `config: env LIFECYCLE_AGENT_DRIVERS_GPU_RESET_ENABLED: key drivers.gpu-reset.enabled: want true or false, got "maybe"`,
		},
		{
			name:  "bad enum from flag",
			flags: []string{"--log-format=xml"},
			want:  `config: flag --log-format: key logFormat: invalid value "xml"; want text or json`,
		},
		{
			name:  "metrics on a public address from flag",
			flags: []string{"--metrics-address=10.0.0.1:9810"},
			want:  `config: flag --metrics-address: key metricsAddress: address "10.0.0.1:9810" is not loopback: metrics listen on 127.0.0.1 or [::1] only`,
		},
		{
			name: "the file is refused even when env overrides the bad key",
			file: "host:\n  mode: banana\n",
			env:  map[string]string{"LIFECYCLE_AGENT_HOST_MODE": "real"},
			want: `config: FILE:2: key host.mode: invalid value "banana"; want real or simulate`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			isolate(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			path := filepath.Join(t.TempDir(), "absent.yaml")
			if tt.file != "" {
				path = writeConfig(t, tt.file)
			}
			_, err := Load(Options{Flags: flags(t, tt.flags...), DefaultPath: path})
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			want := strings.ReplaceAll(tt.want, "FILE", path)
			if err.Error() != want {
				t.Errorf("error:\n got %s\nwant %s", err, want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Errorf("error is %T, want *config.Error", err)
			}
		})
	}
}

func execDriver(lines ...string) string {
	s := "exec:\n  drivers:\n    - " + lines[0] + "\n"
	for _, l := range lines[1:] {
		s += "      " + l + "\n"
	}
	return s + "      steps:\n        - {name: s, command: [/bin/true]}\n"
}

func TestConfigPath(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string) (args []string)
		wantErr string // "" = no error; DIR stands for the temp dir
		want    string // Path of the loaded file, DIR-relative
	}{
		{
			name:  "missing default file is fine",
			setup: func(t *testing.T, dir string) []string { return nil },
		},
		{
			name: "missing file named by --config",
			setup: func(t *testing.T, dir string) []string {
				return []string{"--config", filepath.Join(dir, "nope.yaml")}
			},
			wantErr: "config: DIR/nope.yaml: cannot read config file: no such file or directory",
		},
		{
			name: "missing file named by the env var",
			setup: func(t *testing.T, dir string) []string {
				t.Setenv("LIFECYCLE_AGENT_CONFIG", filepath.Join(dir, "nope.yaml"))
				return nil
			},
			wantErr: "config: DIR/nope.yaml: cannot read config file: no such file or directory",
		},
		{
			name: "--config beats the env var",
			setup: func(t *testing.T, dir string) []string {
				os.WriteFile(filepath.Join(dir, "flag.yaml"), []byte("logLevel: debug\n"), 0o600)
				t.Setenv("LIFECYCLE_AGENT_CONFIG", filepath.Join(dir, "nope.yaml"))
				return []string{"--config=" + filepath.Join(dir, "flag.yaml")}
			},
			want: "flag.yaml",
		},
		{
			name: "a directory is not a config file",
			setup: func(t *testing.T, dir string) []string {
				os.Mkdir(filepath.Join(dir, "d"), 0o700)
				return []string{"--config=" + filepath.Join(dir, "d")}
			},
			wantErr: "config: DIR/d: not a regular file",
		},
		{
			name: "empty file is all defaults",
			setup: func(t *testing.T, dir string) []string {
				os.WriteFile(filepath.Join(dir, "empty.yaml"), nil, 0o600)
				return []string{"--config=" + filepath.Join(dir, "empty.yaml")}
			},
			want: "empty.yaml",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			isolate(t)
			dir := t.TempDir()
			args := tt.setup(t, dir)
			cfg, err := Load(Options{
				Flags:       flags(t, args...),
				DefaultPath: filepath.Join(dir, "default-absent.yaml"),
				Hostname:    func() (string, error) { return testHostname, nil },
			})
			if tt.wantErr != "" {
				want := strings.ReplaceAll(tt.wantErr, "DIR", dir)
				if err == nil || err.Error() != want {
					t.Fatalf("error = %v, want %s", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := ""
			if tt.want != "" {
				want = filepath.Join(dir, tt.want)
			}
			if cfg.Path != want {
				t.Errorf("Path = %q, want %q", cfg.Path, want)
			}
		})
	}
}

func TestFilePermissions(t *testing.T) {
	tests := []struct {
		name     string
		fileMode os.FileMode
		dirMode  os.FileMode
		fileUID  int // -1: leave as created
		rootOnly bool
		want     string // "" = accepted; FILE and DIR are substituted
	}{
		{name: "0600 accepted", fileMode: 0o600, dirMode: 0o755, fileUID: -1},
		{name: "0644 accepted", fileMode: 0o644, dirMode: 0o755, fileUID: -1},
		{name: "0400 accepted", fileMode: 0o400, dirMode: 0o700, fileUID: -1},
		{
			name: "group-writable refused", fileMode: 0o664, dirMode: 0o755, fileUID: -1,
			want: "config: FILE: file is group- or world-writable (mode 0664); run chmod 600 FILE",
		},
		{
			name: "world-writable refused", fileMode: 0o602, dirMode: 0o755, fileUID: -1,
			want: "config: FILE: file is group- or world-writable (mode 0602); run chmod 600 FILE",
		},
		{
			name: "world-writable directory refused", fileMode: 0o600, dirMode: 0o777, fileUID: -1,
			want: "config: DIR: directory of the config file is group- or world-writable (mode 0777); run chmod go-w DIR",
		},
		{name: "sticky world-writable directory accepted", fileMode: 0o600, dirMode: 0o777 | os.ModeSticky, fileUID: -1},
		{
			name: "not owned by root refused when root", fileMode: 0o600, dirMode: 0o755, fileUID: 4242, rootOnly: true,
			want: "config: FILE: file is owned by uid 4242, not root; run chown root:root FILE",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.rootOnly && os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			isolate(t)
			dir := filepath.Join(t.TempDir(), "etc")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, "config.yaml")
			if err := os.WriteFile(file, []byte("logLevel: debug\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			must(t, os.Chmod(file, tt.fileMode))
			must(t, os.Chmod(dir, tt.dirMode))
			if tt.fileUID >= 0 {
				must(t, os.Chown(file, tt.fileUID, tt.fileUID))
			}
			_, err := Load(Options{Flags: flags(t, "--config", file), Hostname: func() (string, error) { return "n", nil }})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			want := strings.NewReplacer("FILE", file, "DIR", dir).Replace(tt.want)
			if err == nil || err.Error() != want {
				t.Fatalf("error = %v\nwant %s", err, want)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestNodeNameFromHostname(t *testing.T) {
	tests := []struct {
		name     string
		hostname string
		err      error
		want     string
		wantErr  string
	}{
		{name: "lowercased and trimmed", hostname: " GPU-Node-07 \n", want: "gpu-node-07"},
		{name: "fqdn kept", hostname: "n1.rack12.example", want: "n1.rack12.example"},
		{
			name: "invalid host name", hostname: "bad_host",
			wantErr: `config: key nodeName: host name "bad_host" is not a valid node name; set --node-name or LIFECYCLE_AGENT_NODE_NAME`,
		},
		{
			name: "host name unreadable", err: errors.New("uts: boom"),
			wantErr: `config: key nodeName: cannot read the host name: uts: boom; set --node-name or LIFECYCLE_AGENT_NODE_NAME`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			isolate(t)
			cfg, err := Load(Options{
				DefaultPath: filepath.Join(t.TempDir(), "absent.yaml"),
				Hostname:    func() (string, error) { return tt.hostname, tt.err },
			})
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error = %v\nwant %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.NodeName != tt.want {
				t.Errorf("NodeName = %q, want %q", cfg.NodeName, tt.want)
			}
		})
	}
}

func TestSections(t *testing.T) {
	isolate(t)
	cfg, err := load(t, `
osUpgrade:
  profiles:
    minimal:
      command: [/usr/local/sbin/upgrade, 5]
    full:
      command: [/usr/bin/systemd-run, --wait, /usr/local/sbin/upgrade]
      timeout: 2h
      rebootPolicy: always
exec:
  drivers:
    - name: fw
      start: FirmwareUpdateStarted
      end: FirmwareUpdateComplete
      steps:
        - name: flash
          command: [/usr/local/sbin/flash]
    - name: example.com/bios
      start: BIOSStarted
      end: BIOSComplete
      sla: 1h
      params: [version, force_flash]
      steps:
        - name: stage
          command: [/usr/local/sbin/bios, stage]
          timeout: 1m
          check: [/usr/local/sbin/bios, staged]
        - name: apply
          command: [/usr/local/sbin/bios, apply]
          check: []
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantProfiles := map[string]OSUpgradeProfile{
		"minimal": {Command: []string{"/usr/local/sbin/upgrade", "5"}, Timeout: time.Hour, RebootPolicy: "if-required"},
		"full":    {Command: []string{"/usr/bin/systemd-run", "--wait", "/usr/local/sbin/upgrade"}, Timeout: 2 * time.Hour, RebootPolicy: "always"},
	}
	if !reflect.DeepEqual(cfg.OSUpgrade.Profiles, wantProfiles) {
		t.Errorf("profiles:\n got %+v\nwant %+v", cfg.OSUpgrade.Profiles, wantProfiles)
	}
	wantDrivers := []ExecDriver{
		{
			Name: "fw", Start: "FirmwareUpdateStarted", End: "FirmwareUpdateComplete",
			Steps: []ExecStep{{Name: "flash", Command: []string{"/usr/local/sbin/flash"}, Timeout: 10 * time.Minute}},
		},
		{
			Name: "example.com/bios", Start: "BIOSStarted", End: "BIOSComplete", SLA: time.Hour,
			Params: []string{"version", "force_flash"},
			Steps: []ExecStep{
				{Name: "stage", Command: []string{"/usr/local/sbin/bios", "stage"}, Timeout: time.Minute, Check: []string{"/usr/local/sbin/bios", "staged"}},
				{Name: "apply", Command: []string{"/usr/local/sbin/bios", "apply"}, Timeout: 10 * time.Minute, Check: []string{}},
			},
		},
	}
	if !reflect.DeepEqual(cfg.Exec.Drivers, wantDrivers) {
		t.Errorf("exec drivers:\n got %+v\nwant %+v", cfg.Exec.Drivers, wantDrivers)
	}
	if got := cfg.Exec.Drivers[0].FullName(); got != "lifecycle-agent.x-k8s.io/fw" {
		t.Errorf("FullName = %q", got)
	}
	if got := cfg.Exec.Drivers[1].FullName(); got != "example.com/bios" {
		t.Errorf("FullName = %q", got)
	}
	if src := cfg.Source("exec.drivers"); src != cfg.Path+":11" {
		t.Errorf("Source(exec.drivers) = %q", src)
	}
}

func TestMaintenanceSections(t *testing.T) {
	isolate(t)
	cfg, err := load(t, `
maintenance:
  windows:
    - days: [Mon, friday]
      start: "22:00"
      end: "04:00"
      timeZone: Europe/Berlin
    - start: "12:00:30"
      end: "13:00"
gates:
  prometheus:
    url: https://prometheus.monitoring:9090
    alertNames: "^Node"
    ignoreAlerts: "^(Watchdog|RebootRequired)$"
  blockingPods: "app=backup,tier in (db)"
  command: "test -e /run/ok"
  commandTimeout: 5s
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	ws := cfg.Maintenance.Windows
	if len(ws) != 2 {
		t.Fatalf("windows: %+v", ws)
	}
	if got, want := ws[0].String(), "mon,fri 22:00-04:00 Europe/Berlin"; got != want {
		t.Errorf("window 0 = %q, want %q", got, want)
	}
	if got, want := ws[1].String(), "every day 12:00:30-13:00 UTC"; got != want {
		t.Errorf("window 1 = %q, want %q", got, want)
	}
	want := Gates{Prometheus: GatesPrometheus{URL: "https://prometheus.monitoring:9090", AlertNames: "^Node",
		IgnoreAlerts: "^(Watchdog|RebootRequired)$", Timeout: 10 * time.Second},
		BlockingPods: "app=backup,tier in (db)", Command: "test -e /run/ok", CommandTimeout: 5 * time.Second}
	if cfg.Gates != want {
		t.Errorf("gates:\n got %+v\nwant %+v", cfg.Gates, want)
	}
	if src := cfg.Source("maintenance.windows"); src != cfg.Path+":3" {
		t.Errorf("Source(maintenance.windows) = %q", src)
	}
}

func TestDriverEnabled(t *testing.T) {
	tests := []struct {
		name       string
		file       string
		driver     string
		nvml, prof bool
		want       bool
	}{
		{name: "drain on by default", driver: "drain", want: true},
		{name: "full name works", driver: "lifecycle-agent.x-k8s.io/reboot", want: true},
		{name: "gpu-reset off without NVML", driver: "gpu-reset", want: false},
		{name: "gpu-reset on with NVML", driver: "gpu-reset", nvml: true, want: true},
		{name: "os-upgrade off without profile", driver: "os-upgrade", want: false},
		{name: "os-upgrade on with profile", driver: "os-upgrade", prof: true, want: true},
		{name: "explicit off wins", file: "drivers:\n  drain:\n    enabled: false\n", driver: "drain", want: false},
		{name: "explicit on wins over no NVML", file: "drivers:\n  gpu-reset:\n    enabled: true\n", driver: "gpu-reset", want: true},
		{name: "explicit off wins over NVML", file: "drivers:\n  gpu-reset:\n    enabled: false\n", driver: "gpu-reset", nvml: true, want: false},
		{name: "empty value is unset", file: "drivers:\n  shutdown:\n    enabled:\n", driver: "shutdown", want: true},
		{name: "unknown driver off", driver: "frobnicate", want: false},
		{
			name:   "exec driver on when configured",
			file:   "exec:\n  drivers:\n    - {name: fw, start: A, end: B, steps: [{name: s, command: [/bin/true]}]}\n",
			driver: "fw", want: true,
		},
		{
			name:   "exec driver by full name",
			file:   "exec:\n  drivers:\n    - {name: example.com/fw, start: A, end: B, steps: [{name: s, command: [/bin/true]}]}\n",
			driver: "example.com/fw", want: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			isolate(t)
			cfg, err := load(t, tt.file, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.DriverEnabled(tt.driver, tt.nvml, tt.prof); got != tt.want {
				t.Errorf("DriverEnabled(%q, nvml=%v, profile=%v) = %v, want %v", tt.driver, tt.nvml, tt.prof, got, tt.want)
			}
		})
	}
}
