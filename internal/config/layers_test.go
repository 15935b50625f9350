package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// tree is a config tree in a temporary directory laid out as installed:
// etc/config.yaml (the config file), etc/config.d/ (the admin's drop-ins)
// and vendor/ (the package's drop-ins).
type tree struct {
	root, etc, conf, dropIns, vendor string
}

func newTree(t *testing.T) *tree {
	t.Helper()
	root := t.TempDir()
	tr := &tree{root: root, etc: filepath.Join(root, "etc"), vendor: filepath.Join(root, "vendor")}
	tr.conf = filepath.Join(tr.etc, "config.yaml")
	tr.dropIns = filepath.Join(tr.etc, "config.d")
	for _, d := range []string{tr.etc, tr.dropIns, tr.vendor} {
		must(t, os.MkdirAll(d, 0o755))
	}
	return tr
}

// write writes body to the file rel (relative to the tree's root) at mode
// 0600 and returns its path.
func (tr *tree) write(t *testing.T, rel, body string) string {
	t.Helper()
	path := filepath.Join(tr.root, rel)
	must(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

// load runs Load on the tree as the default config, with args as flags.
func (tr *tree) load(t *testing.T, args ...string) (*Config, error) {
	t.Helper()
	return Load(Options{
		Flags:       flags(t, args...),
		DefaultPath: tr.conf,
		VendorDir:   tr.vendor,
		Hostname:    func() (string, error) { return testHostname, nil },
	})
}

// TestDropInOrder: vendor drop-ins < config.yaml < admin drop-ins < env <
// flags, each directory in lexical order, and Source names the file and
// line that won.
func TestDropInOrder(t *testing.T) {
	isolate(t)
	tr := newTree(t)
	v10 := tr.write(t, "vendor/10-a.yaml", "eventRetention: 48h\nlogLevel: debug\napiTimeout: 20s\n")
	v20 := tr.write(t, "vendor/20-b.yaml", "\neventRetention: 72h\n")
	tr.write(t, "etc/config.yaml", "logLevel: warn\nlogFormat: json\n")
	a10 := tr.write(t, "etc/config.d/10-x.yaml", "logFormat: text\nreadiness:\n  checks: [conditions]\n")
	a9 := tr.write(t, "etc/config.d/9-y.yaml", "readiness:\n  checks: [daemonsets, resources]\n  timeout: 3m\n")

	cfg, err := tr.load(t)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key, source string
		got, want   any
	}{
		{"eventRetention", v20 + ":2", cfg.EventRetention, 72 * time.Hour},
		{"apiTimeout", v10 + ":3", cfg.APITimeout, 20 * time.Second},
		{"logLevel", tr.conf + ":1", cfg.LogLevel, LogLevelWarn},
		// "10-x" sorts before "9-y": names, not numbers.
		{"logFormat", a10 + ":1", cfg.LogFormat, LogFormatText},
		{"readiness.checks", a9 + ":2", cfg.Readiness.Checks, []string{"daemonsets", "resources"}},
		{"readiness.timeout", a9 + ":3", cfg.Readiness.Timeout, 3 * time.Minute},
		{"socketPath", "default", cfg.SocketPath, "/run/lifecycle-agent/agent.sock"},
	}
	for _, tt := range tests {
		if !reflect.DeepEqual(tt.got, tt.want) {
			t.Errorf("%s = %v, want %v", tt.key, tt.got, tt.want)
		}
		if src := cfg.Source(tt.key); src != tt.source {
			t.Errorf("Source(%s) = %q, want %q", tt.key, src, tt.source)
		}
	}
	if want := []string{v10, v20, tr.conf, a10, a9}; !reflect.DeepEqual(cfg.Files, want) {
		t.Errorf("Files = %q, want %q", cfg.Files, want)
	}
	if cfg.Path != tr.conf {
		t.Errorf("Path = %q, want %q", cfg.Path, tr.conf)
	}

	// Env and flags still win over every file.
	t.Setenv("LIFECYCLE_AGENT_LOG_FORMAT", "json")
	cfg, err = tr.load(t, "--event-retention", "1h")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LogFormat != LogFormatJSON || cfg.Source("logFormat") != "env LIFECYCLE_AGENT_LOG_FORMAT" {
		t.Errorf("logFormat = %q from %q, want json from the env", cfg.LogFormat, cfg.Source("logFormat"))
	}
	if cfg.EventRetention != time.Hour || cfg.Source("eventRetention") != "flag --event-retention" {
		t.Errorf("eventRetention = %v from %q, want 1h from the flag", cfg.EventRetention, cfg.Source("eventRetention"))
	}
}

// TestDropInWithoutConfigFile: the drop-ins are read when the default
// config file does not exist.
func TestDropInWithoutConfigFile(t *testing.T) {
	isolate(t)
	tr := newTree(t)
	v := tr.write(t, "vendor/50-package-defaults.yaml", "logLevel: debug\n")
	a := tr.write(t, "etc/config.d/50-site.yaml", "logFormat: json\n")
	cfg, err := tr.load(t)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Path != "" || cfg.LogLevel != LogLevelDebug || cfg.LogFormat != LogFormatJSON {
		t.Errorf("Path %q, logLevel %q, logFormat %q; want no file, debug, json", cfg.Path, cfg.LogLevel, cfg.LogFormat)
	}
	if want := []string{v, a}; !reflect.DeepEqual(cfg.Files, want) {
		t.Errorf("Files = %q, want %q", cfg.Files, want)
	}
}

// TestDropInMask: an admin drop-in named as a vendor one replaces it
// entirely, even when empty; other vendor files still count.
func TestDropInMask(t *testing.T) {
	isolate(t)
	tr := newTree(t)
	tr.write(t, "vendor/50-package-defaults.yaml", "logLevel: debug\neventRetention: 48h\n")
	v60 := tr.write(t, "vendor/60-more.yaml", "apiTimeout: 20s\n")
	mask := tr.write(t, "etc/config.d/50-package-defaults.yaml", "eventRetention: 1h\n")
	cfg, err := tr.load(t)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LogLevel != LogLevelInfo || cfg.Source("logLevel") != "default" {
		t.Errorf("logLevel = %q from %q: the masked vendor file was read", cfg.LogLevel, cfg.Source("logLevel"))
	}
	if cfg.EventRetention != time.Hour || cfg.Source("eventRetention") != mask+":1" {
		t.Errorf("eventRetention = %v from %q, want 1h from %s:1", cfg.EventRetention, cfg.Source("eventRetention"), mask)
	}
	if cfg.APITimeout != 20*time.Second {
		t.Errorf("apiTimeout = %v: the unmasked vendor file was not read", cfg.APITimeout)
	}
	if want := []string{v60, mask}; !reflect.DeepEqual(cfg.Files, want) {
		t.Errorf("Files = %q, want %q", cfg.Files, want)
	}

	// Empty: back to the built-in defaults.
	must(t, os.WriteFile(mask, nil, 0o600))
	if cfg, err = tr.load(t); err != nil {
		t.Fatal(err)
	}
	if cfg.LogLevel != LogLevelInfo || cfg.EventRetention != 24*time.Hour {
		t.Errorf("logLevel %q, eventRetention %v; want the built-in defaults", cfg.LogLevel, cfg.EventRetention)
	}
}

// TestDropInIgnored: only *.yaml files not starting with a dot are read;
// dpkg's leftovers, other suffixes and hidden files are ignored however
// broken they are.
func TestDropInIgnored(t *testing.T) {
	isolate(t)
	tr := newTree(t)
	for _, rel := range []string{
		"vendor/50-package-defaults.yaml.dpkg-new",
		"vendor/50-package-defaults.yaml.dpkg-tmp",
		"etc/config.d/50-site.yaml.dpkg-dist",
		"etc/config.d/50-site.yaml.dpkg-old",
		"etc/config.d/50-site.yaml.dpkg-bak",
		"etc/config.d/50-site.yaml~",
		"etc/config.d/50-site.yml",
		"etc/config.d/.50-site.yaml.swp",
		"etc/config.d/.hidden.yaml",
		"etc/config.d/README",
	} {
		p := tr.write(t, rel, "not: [valid\n")
		must(t, os.Chmod(p, 0o666)) // not even checked
	}
	must(t, os.Mkdir(filepath.Join(tr.dropIns, "sub"), 0o755))
	site := tr.write(t, "etc/config.d/50-site.yaml", "logLevel: error\n")
	cfg, err := tr.load(t)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LogLevel != LogLevelError || !reflect.DeepEqual(cfg.Files, []string{site}) {
		t.Errorf("logLevel %q, Files %q; want error from %s alone", cfg.LogLevel, cfg.Files, site)
	}
}

// TestDropInErrors: a drop-in gets the config file's validation and
// ownership check, and the error names the drop-in, the line and the key.
func TestDropInErrors(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, tr *tree)
		want  string // ROOT is the tree's root
	}{
		{
			name: "unknown key in an admin drop-in",
			setup: func(t *testing.T, tr *tree) {
				tr.write(t, "etc/config.d/50-site.yaml", "logLevel: warn\nhost:\n  mdoe: real\n")
			},
			want: `config: ROOT/etc/config.d/50-site.yaml:3: unknown key "host.mdoe" (did you mean "host.mode"?)`,
		},
		{
			name: "bad value in a vendor drop-in",
			setup: func(t *testing.T, tr *tree) {
				tr.write(t, "vendor/50-package-defaults.yaml", "\n\neventRetention: banana\n")
			},
			want: `config: ROOT/vendor/50-package-defaults.yaml:3: key eventRetention: invalid duration "banana"`,
		},
		{
			name: "bad exec driver in a drop-in",
			setup: func(t *testing.T, tr *tree) {
				tr.write(t, "etc/config.d/50-site.yaml", "exec:\n  drivers:\n    - name: drain\n")
			},
			want: `config: ROOT/etc/config.d/50-site.yaml:3: key exec.drivers[0]: missing required key "start"`,
		},
		{
			name: "group-writable admin drop-in",
			setup: func(t *testing.T, tr *tree) {
				must(t, os.Chmod(tr.write(t, "etc/config.d/50-site.yaml", "logLevel: warn\n"), 0o664))
			},
			want: "config: ROOT/etc/config.d/50-site.yaml: file is group- or world-writable (mode 0664); run chmod 600 ROOT/etc/config.d/50-site.yaml",
		},
		{
			name: "world-writable vendor drop-in",
			setup: func(t *testing.T, tr *tree) {
				must(t, os.Chmod(tr.write(t, "vendor/50-package-defaults.yaml", ""), 0o646))
			},
			want: "config: ROOT/vendor/50-package-defaults.yaml: file is group- or world-writable (mode 0646); run chmod 600 ROOT/vendor/50-package-defaults.yaml",
		},
		{
			name: "world-writable drop-in directory",
			setup: func(t *testing.T, tr *tree) {
				tr.write(t, "etc/config.d/50-site.yaml", "")
				must(t, os.Chmod(tr.dropIns, 0o777))
			},
			want: "config: ROOT/etc/config.d: directory of the config file is group- or world-writable (mode 0777); run chmod go-w ROOT/etc/config.d",
		},
		{
			name: "drop-in not owned by root, when root",
			setup: func(t *testing.T, tr *tree) {
				if os.Geteuid() != 0 {
					t.Skip("needs root to chown")
				}
				must(t, os.Chown(tr.write(t, "etc/config.d/50-site.yaml", ""), 4242, 4242))
			},
			want: "config: ROOT/etc/config.d/50-site.yaml: file is owned by uid 4242, not root; run chown root:root ROOT/etc/config.d/50-site.yaml",
		},
		{
			name:  "a directory named like a drop-in",
			setup: func(t *testing.T, tr *tree) { must(t, os.Mkdir(filepath.Join(tr.dropIns, "50-site.yaml"), 0o755)) },
			want:  "config: ROOT/etc/config.d/50-site.yaml: not a regular file",
		},
		{
			name: "config.d is not a directory",
			setup: func(t *testing.T, tr *tree) {
				must(t, os.Remove(tr.dropIns))
				tr.write(t, "etc/config.d", "")
			},
			want: "config: ROOT/etc/config.d: cannot read drop-in directory: not a directory",
		},
		{
			name: "a key inert without its switch, set in a vendor drop-in",
			setup: func(t *testing.T, tr *tree) {
				tr.write(t, "vendor/50-package-defaults.yaml", "needs:\n  reboot:\n    group: racks\n")
			},
			want: "config: ROOT/vendor/50-package-defaults.yaml:3: key needs.reboot.group: does nothing unless needs.reboot.policy is request; set that too, or remove this",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			isolate(t)
			tr := newTree(t)
			tt.setup(t, tr)
			_, err := tr.load(t)
			want := strings.ReplaceAll(tt.want, "ROOT", tr.root)
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("error = %v\nwant %s", err, want)
			}
			if _, ok := err.(*Error); !ok {
				t.Errorf("error is a %T, want *Error", err)
			}
		})
	}
}

// TestDropInSections: osUpgrade.profiles, exec.drivers and
// maintenance.windows are replaced whole by the last file that gives them
// a value (an empty list clears them; a key left empty does not), and
// Source names that file and line.
func TestDropInSections(t *testing.T) {
	isolate(t)
	tr := newTree(t)
	v := tr.write(t, "vendor/50-package-defaults.yaml", `maintenance:
  windows:
    - {start: "01:00", end: "02:00"}
    - {start: "03:00", end: "04:00"}
osUpgrade:
  profiles:
    vendor: {command: [/bin/true]}
`)
	tr.write(t, "etc/config.yaml", "exec:\n  drivers:\n"+`    - {name: bios, start: S, end: E, steps: [{name: s, command: [/bin/true]}]}`+"\n")
	a := tr.write(t, "etc/config.d/50-site.yaml", `osUpgrade:
  profiles:
    site: {command: [/bin/false]}
exec:
  drivers: []
maintenance:
  windows:
`)
	cfg, err := tr.load(t)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cfg.OSUpgrade.Profiles["vendor"]; ok || len(cfg.OSUpgrade.Profiles) != 1 {
		t.Errorf("profiles = %v, want the drop-in's alone", cfg.OSUpgrade.Profiles)
	}
	if len(cfg.Exec.Drivers) != 0 {
		t.Errorf("exec.drivers = %v, want none: the drop-in's [] clears them", cfg.Exec.Drivers)
	}
	if len(cfg.Maintenance.Windows) != 2 {
		t.Errorf("windows = %v, want the vendor's two: an empty key in the drop-in changes nothing", cfg.Maintenance.Windows)
	}
	for key, want := range map[string]string{
		"osUpgrade.profiles":  a + ":2",
		"exec.drivers":        a + ":5",
		"maintenance.windows": v + ":2",
	} {
		if src := cfg.Source(key); src != want {
			t.Errorf("Source(%s) = %q, want %q", key, src, want)
		}
	}
}

// TestDropInExplicitConfig: a config file named by --config or
// LIFECYCLE_AGENT_CONFIG reads the config.d beside it, and the vendor
// drop-ins only when it is the default config file.
func TestDropInExplicitConfig(t *testing.T) {
	isolate(t)
	tr := newTree(t)
	tr.write(t, "vendor/50-package-defaults.yaml", "logLevel: debug\n")
	tr.write(t, "etc/config.yaml", "")
	other := filepath.Join(tr.root, "other")
	must(t, os.MkdirAll(filepath.Join(other, "config.d"), 0o755))
	otherConf := tr.write(t, "other/test.yaml", "")
	otherDrop := tr.write(t, "other/config.d/50-x.yaml", "logFormat: json\n")

	cfg, err := tr.load(t, "--config", otherConf)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LogLevel != LogLevelInfo || cfg.LogFormat != LogFormatJSON || !reflect.DeepEqual(cfg.Files, []string{otherConf, otherDrop}) {
		t.Errorf("--config elsewhere: logLevel %q, logFormat %q, Files %q; want info (no vendor), json (its config.d)", cfg.LogLevel, cfg.LogFormat, cfg.Files)
	}

	t.Setenv("LIFECYCLE_AGENT_CONFIG", tr.etc+"/./config.yaml")
	if cfg, err = tr.load(t); err != nil {
		t.Fatal(err)
	}
	if cfg.LogLevel != LogLevelDebug {
		t.Errorf("LIFECYCLE_AGENT_CONFIG naming the default file: logLevel %q, want the vendor's debug", cfg.LogLevel)
	}
}

// TestVendorDefaultsShipped: the package's defaults file, as shipped,
// loads as a vendor drop-in.
func TestVendorDefaultsShipped(t *testing.T) {
	isolate(t)
	tr := newTree(t)
	tr.write(t, "vendor/"+filepath.Base(VendorDefaultsFile), string(repoFile(t, VendorDefaultsFile)))
	cfg, err := tr.load(t)
	if err != nil {
		t.Fatalf("%s: %v", VendorDefaultsFile, err)
	}
	if len(cfg.Files) != 1 {
		t.Errorf("Files = %q, want the vendor file", cfg.Files)
	}
	if filepath.Join(VendorDir, filepath.Base(VendorDefaultsFile)) != InstalledVendorDefaults {
		t.Errorf("%s is not installed in %s", InstalledVendorDefaults, VendorDir)
	}
}
