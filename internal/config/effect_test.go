package config

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// No accepted key does nothing (issue 13.8). Two halves, walked over every
// key of the table the reference (docs/config-reference.md) is generated
// from, so a key added without them fails here:
//
//  1. TestEveryKeyReachesItsField: a non-default value for the key (its
//     LIFECYCLE_AGENT_* variable) changes its Config field and no other.
//  2. TestEveryKeyIsRead: that field is read by the agent's code outside
//     this package (a selector ending in its path, e.g. .Drain.Timeout, in
//     cmd/ or internal/, tests excluded), and so are the fields of the
//     structured keys (osUpgrade.profiles, exec.drivers).
//
// What each read does is proven by the behaviour tests (test/e2e
// TestDrainTimeout, TestShutdownDriverDisabled, ...); these two make sure
// that no key is parsed, validated, documented and then dropped.

// otherValue is a valid value other than the default, in env-var form.
var otherValue = map[string]string{
	"nodeName":                        "node-b",
	"kubeconfig":                      "/etc/kubernetes/other.conf",
	"journalPath":                     "/var/lib/lifecycle-agent/other.db",
	"socketPath":                      "/run/lifecycle-agent/other.sock",
	"metricsAddress":                  "127.0.0.1:9911",
	"gpu.services":                    "nvidia-fabricmanager.service",
	"gpu.operator.components":         "dcgm",
	"gpu.operator.labelPrefix":        "example.com/gpu.deploy.",
	"gpu.operator.pausedValue":        "paused",
	"needs.reboot.sentinelFile":       "/run/lifecycle-agent-test/reboot-required",
	"needs.reboot.sentinelCommand":    "test -e /run/lifecycle-agent-test/reboot-required",
	"gpu.driverRoot":                  "/run/nvidia/driver",
	"gpu.nvidiaSMI":                   "/usr/local/bin/nvidia-smi",
	"readiness.checks":                "daemonsets",
	"readiness.conditions":            "KernelDeadlock=False",
	"readiness.daemonSets.namespaces": "kube-system",
	"readiness.daemonSets.selector":   "app=cni",
	"readiness.command":               "/usr/local/bin/node-ok",
	"readiness.commandTimeout":        "1m",
	"readiness.timeout":               "20m",
	"readiness.onTimeout":             "uncordon",
	"gates.prometheus.url":            "http://127.0.0.1:9090",
	"gates.prometheus.alertNames":     "^Node",
	"gates.prometheus.ignoreAlerts":   "^Watchdog$",
	"gates.blockingPods":              "app=backup",
	"gates.command":                   "test -e /run/lifecycle-agent-test/ok",
	"notifications.urls":              "generic+https://hooks.example/lifecycle",
	"needs.reboot.group":              "rack-12-reboot",
	"gpu.remediation.group":           "rack-12-gpu",
}

// notALayeredField are the keys without a Config field of their own, and
// why they still do something.
var notALayeredField = map[string]string{
	"config":             "names the file read (TestLoad* in load_test.go)",
	"osUpgrade.profiles": "structured; its fields are checked by TestEveryKeyIsRead",
	"exec.drivers":       "structured; its fields are checked by TestEveryKeyIsRead",
	"maintenance.windows": "structured; parsed into maintenance.Window values that internal/agent hands to the engine " +
		"(Maintenance.Windows is checked by TestEveryKeyIsRead; test/e2e TestMaintenanceWindow proves the effect)",
}

func (k *key) otherValue(t *testing.T) string {
	if v, ok := otherValue[k.name]; ok {
		return v
	}
	switch k.kind {
	case kindBool:
		if k.def == "true" {
			return "false"
		}
		return "true"
	case kindTriBool:
		return "true"
	case kindInt:
		i, err := strconv.Atoi(k.def)
		if err != nil {
			t.Fatalf("key %s: default %q: %v", k.name, k.def, err)
		}
		return strconv.Itoa(i + 1)
	case kindDuration:
		d, err := time.ParseDuration(k.def)
		if err != nil {
			t.Fatalf("key %s: default %q: %v", k.name, k.def, err)
		}
		return (d + 7*time.Second).String()
	case kindString:
		for _, e := range k.enum {
			if e != k.def {
				return e
			}
		}
	}
	t.Fatalf("key %s: no other value known: add one to otherValue", k.name)
	return ""
}

// fieldPath is the path of Go field names from Config to the field p
// points at (p is k.field(c)).
func fieldPath(c *Config, p any) []string {
	target := reflect.ValueOf(p).Pointer()
	var walk func(v reflect.Value, path []string) []string
	walk = func(v reflect.Value, path []string) []string {
		for i := range v.NumField() {
			f := v.Field(i)
			name := v.Type().Field(i).Name
			if f.CanAddr() && f.Addr().Pointer() == target && reflect.TypeOf(p).Elem() == f.Type() {
				return append(path, name)
			}
			if f.Kind() == reflect.Struct {
				if got := walk(f, append(append([]string(nil), path...), name)); got != nil {
					return got
				}
			}
		}
		return nil
	}
	return walk(reflect.ValueOf(c).Elem(), nil)
}

func TestEveryKeyReachesItsField(t *testing.T) {
	isolate(t)
	base, err := load(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.field == nil {
			if _, ok := notALayeredField[k.name]; !ok {
				t.Errorf("key %s has no Config field: give it one or say in notALayeredField why it does something", k.name)
			}
			continue
		}
		t.Run(k.name, func(t *testing.T) {
			isolate(t)
			base := base
			if dep, ok := inertUnless[k.name]; ok { // its switch on in both
				t.Setenv(lookupKey(dep[0]).env(), dep[1])
				var err error
				if base, err = load(t, "", nil); err != nil {
					t.Fatal(err)
				}
			}
			v := k.otherValue(t)
			t.Setenv(k.env(), v)
			got, err := load(t, "", nil)
			if err != nil {
				t.Fatalf("%s=%s: %v", k.env(), v, err)
			}
			path := fieldPath(got, k.field(got))
			if path == nil {
				t.Fatalf("key %s: its field is not inside Config", k.name)
			}
			was, now := reflect.ValueOf(k.field(base)).Elem().Interface(), reflect.ValueOf(k.field(got)).Elem().Interface()
			if reflect.DeepEqual(was, now) {
				t.Errorf("%s=%s left Config.%s at %v", k.env(), v, strings.Join(path, "."), was)
			}
			for _, o := range keys {
				if o == k || o.field == nil {
					continue
				}
				if a, b := reflect.ValueOf(o.field(base)).Elem().Interface(), reflect.ValueOf(o.field(got)).Elem().Interface(); !reflect.DeepEqual(a, b) {
					t.Errorf("%s=%s changed key %s too (%v → %v)", k.env(), v, o.name, a, b)
				}
			}
		})
	}
}

// addSelectorTails adds to seen, for every selector chain under n, its last
// two names ("Drain.Timeout") and its last name ("Timeout").
func addSelectorTails(seen map[string]bool, n ast.Node) {
	ast.Inspect(n, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok {
			seen[s.Sel.Name] = true
			if x, ok := s.X.(*ast.SelectorExpr); ok {
				seen[x.Sel.Name+"."+s.Sel.Name] = true
			}
		}
		return true
	})
}

// selectorTails collects, from every non-test Go file under the given
// directories, each selector chain's last two names ("Drain.Timeout") and
// last name ("Timeout").
func selectorTails(t *testing.T, root string, dirs []string, skip string) map[string]bool {
	seen := map[string]bool{}
	fset := token.NewFileSet()
	for _, d := range dirs {
		err := filepath.WalkDir(filepath.Join(root, d), func(path string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() {
				if path == filepath.Join(root, skip) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			addSelectorTails(seen, f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return seen
}

// configMethods maps each method of Config declared in this package's
// non-test files to the selector tails its body reads.
func configMethods(t *testing.T) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Body == nil || len(fn.Recv.List) != 1 {
				continue
			}
			recv := fn.Recv.List[0].Type
			if st, ok := recv.(*ast.StarExpr); ok {
				recv = st.X
			}
			if id, ok := recv.(*ast.Ident); !ok || id.Name != "Config" {
				continue
			}
			seen := map[string]bool{}
			addSelectorTails(seen, fn.Body)
			out[fn.Name.Name] = seen
		}
	}
	return out
}

func TestEveryKeyIsRead(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", root, err)
	}
	read := selectorTails(t, root, []string{"cmd", "internal"}, filepath.Join("internal", "config"))
	// A field read by a method of Config (DriverEnabled, SlogLevel) counts
	// when that method is called from outside.
	for method, fields := range configMethods(t) {
		if read[method] {
			for f := range fields {
				read[f] = true
			}
		}
	}
	c := &Config{}
	for _, k := range keys {
		if k.field == nil {
			continue
		}
		path := fieldPath(c, k.field(c))
		if path == nil {
			t.Errorf("key %s: its field is not inside Config", k.name)
			continue
		}
		n := len(path)
		ok := read[path[n-1]]
		if n > 1 {
			// .Drain.Timeout read; or, a level deeper, the struct that
			// holds the field (.Drivers.Drain, copied into a variable) and
			// the field's name (sw.Enabled).
			ok = read[path[n-2]+"."+path[n-1]] || n > 2 && read[path[n-3]+"."+path[n-2]] && read[path[n-1]]
		}
		if !ok {
			t.Errorf("key %s: nothing outside internal/config reads Config.%s: the key would do nothing", k.name, strings.Join(path, "."))
		}
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[OSUpgradeProfile](), reflect.TypeFor[ExecDriver](), reflect.TypeFor[ExecStep]()} {
		for i := range typ.NumField() {
			if name := typ.Field(i).Name; !read[name] {
				t.Errorf("%s.%s: nothing outside internal/config reads it", typ.Name(), name)
			}
		}
	}
	if !read["Maintenance.Windows"] {
		t.Errorf("Config.Maintenance.Windows: nothing outside internal/config reads it")
	}
	if !read["OSUpgrade.Profiles"] || !read["Exec.Drivers"] {
		t.Errorf("osUpgrade.profiles or exec.drivers: nothing outside internal/config reads them")
	}
}
