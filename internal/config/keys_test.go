package config

import (
	"strings"
	"testing"
	"time"
)

func TestEnvNames(t *testing.T) {
	tests := []struct {
		name string // key
		want string
	}{
		{name: "config", want: "LIFECYCLE_AGENT_CONFIG"},
		{name: "nodeName", want: "LIFECYCLE_AGENT_NODE_NAME"},
		{name: "host.mode", want: "LIFECYCLE_AGENT_HOST_MODE"},
		{name: "shutdown.budget", want: "LIFECYCLE_AGENT_SHUTDOWN_BUDGET"},
		{name: "eventRetention", want: "LIFECYCLE_AGENT_EVENT_RETENTION"},
		{name: "metricsAddress", want: "LIFECYCLE_AGENT_METRICS_ADDRESS"},
		{name: "journalPath", want: "LIFECYCLE_AGENT_JOURNAL_PATH"},
		{name: "socketPath", want: "LIFECYCLE_AGENT_SOCKET_PATH"},
		{name: "apiTimeout", want: "LIFECYCLE_AGENT_API_TIMEOUT"},
		{name: "shutdown.manageLogindDropIn", want: "LIFECYCLE_AGENT_SHUTDOWN_MANAGE_LOGIND_DROP_IN"},
		{name: "drivers.os-upgrade.enabled", want: "LIFECYCLE_AGENT_DRIVERS_OS_UPGRADE_ENABLED"},
		{name: "gpu.resetMethod", want: "LIFECYCLE_AGENT_GPU_RESET_METHOD"},
		{name: "osUpgrade.profiles", want: ""},
		{name: "exec.drivers", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := lookupKey(tt.name)
			if k == nil {
				t.Fatalf("no key %q", tt.name)
			}
			if got := k.env(); got != tt.want {
				t.Errorf("env = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestKeyTable checks the table's own invariants.
func TestKeyTable(t *testing.T) {
	names, flagNames, envs := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, k := range keys {
		if names[k.name] {
			t.Errorf("key %s listed twice", k.name)
		}
		names[k.name] = true
		if k.flag != "" {
			if flagNames[k.flag] {
				t.Errorf("flag --%s used twice", k.flag)
			}
			flagNames[k.flag] = true
			if k.scope != GlobalFlags && k.scope != RunFlags {
				t.Errorf("key %s: flag without a scope", k.name)
			}
		}
		if e := k.env(); e != "" {
			if envs[e] {
				t.Errorf("env %s used twice", e)
			}
			envs[e] = true
		}
		if k.doc == "" {
			t.Errorf("key %s has no description", k.name)
		}
		if k.layered() && k.field == nil {
			t.Errorf("key %s has no field", k.name)
		}
		if k.hasDefault() {
			v, err := k.defaultValue()
			if err == nil {
				err = k.validate(v)
			}
			if err != nil {
				t.Errorf("key %s: default %q is invalid: %v", k.name, k.def, err)
			}
		}
	}
	// The keys of a section are adjacent, so that Example opens it once.
	at := map[string][]int{}
	for i, k := range keys {
		parts := strings.Split(k.name, ".")
		for j := 1; j < len(parts); j++ {
			sec := strings.Join(parts[:j], ".")
			at[sec] = append(at[sec], i)
		}
	}
	for sec, idx := range at {
		if idx[len(idx)-1]-idx[0]+1 != len(idx) {
			t.Errorf("the keys of section %s are not adjacent in the table", sec)
		}
	}
}

func TestAddFlags(t *testing.T) {
	fs := flags(t)
	tests := []struct {
		name string // flag
		def  string
	}{
		{name: "config", def: DefaultPath},
		{name: "node-name", def: ""},
		{name: "kubeconfig", def: "/etc/kubernetes/kubelet.conf"},
		{name: "journal", def: "/var/lib/lifecycle-agent/journal.db"},
		{name: "socket", def: "/run/lifecycle-agent/agent.sock"},
		{name: "metrics-address", def: "127.0.0.1:9810"},
		{name: "host-mode", def: "real"},
		{name: "event-retention", def: (24 * time.Hour).String()},
		{name: "shutdown-budget", def: (5 * time.Second).String()},
		{name: "api-timeout", def: (10 * time.Second).String()},
		{name: "log-level", def: "info"},
		{name: "log-format", def: "text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fs.Lookup(tt.name)
			if f == nil {
				t.Fatalf("flag --%s not registered", tt.name)
			}
			if f.DefValue != tt.def {
				t.Errorf("default = %q, want %q", f.DefValue, tt.def)
			}
			if !strings.Contains(f.Usage, "[env LIFECYCLE_AGENT_") {
				t.Errorf("usage %q does not name the env var", f.Usage)
			}
		})
	}
	// Scopes: run-only flags are not global.
	global := flagsOf(GlobalFlags)
	for _, f := range []string{"config", "node-name", "kubeconfig", "journal", "socket"} {
		if !global[f] {
			t.Errorf("--%s is not global", f)
		}
	}
	for _, f := range []string{"metrics-address", "host-mode", "event-retention", "shutdown-budget"} {
		if global[f] {
			t.Errorf("--%s is global, want run only", f)
		}
	}
}

func flagsOf(scope FlagScope) map[string]bool {
	out := map[string]bool{}
	for _, k := range keys {
		if k.flag != "" && k.scope == scope {
			out[k.flag] = true
		}
	}
	return out
}
