package config

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// repoFile reads a file relative to the repository root.
func repoFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGeneratedFilesUpToDate(t *testing.T) {
	tests := []struct {
		name string
		want []byte
	}{
		{name: ReferenceFile, want: Reference()},
		{name: ExampleFile, want: Example()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := repoFile(t, tt.name); !bytes.Equal(got, tt.want) {
				t.Errorf("%s is stale: run `go run ./internal/config/gen-docs` and commit the result", tt.name)
			}
		})
	}
}

// TestExampleLoadsAsDefaults: the shipped conffile and the example, as
// installed (all commented out), are valid and mean "all defaults".
func TestExampleLoadsAsDefaults(t *testing.T) {
	for _, f := range []string{ConffileFile, ExampleFile} {
		t.Run(f, func(t *testing.T) {
			isolate(t)
			got, err := load(t, string(repoFile(t, f)), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(valuesOf(got), *defaults()) {
				t.Errorf("%s as shipped:\n got %+v\nwant %+v", f, valuesOf(got), *defaults())
			}
		})
	}
}

// TestConffileIsMinimal: the conffile is comments only, names no key (a
// key's wording or default changing must not change it: dpkg would ask
// about an edited copy on every such upgrade), and points at the example.
func TestConffileIsMinimal(t *testing.T) {
	text := string(repoFile(t, ConffileFile))
	for i, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		if line != "##" && !strings.HasPrefix(line, "## ") {
			t.Errorf("%s:%d is not a comment: %q", ConffileFile, i+1, line)
		}
	}
	for _, k := range keys {
		if strings.Contains(text, k.name+":") {
			t.Errorf("%s names the key %s: it would change with the key table", ConffileFile, k.name)
		}
	}
	if !strings.Contains(text, InstalledExample) {
		t.Errorf("%s does not point at the example %s", ConffileFile, InstalledExample)
	}
}

// TestExampleUncommented: with every "# " removed, the example is still
// valid, writes every file key, and every value it shows is the default;
// only the two examples (a profile, an exec driver) add something.
func TestExampleUncommented(t *testing.T) {
	isolate(t)
	var out strings.Builder
	for _, line := range strings.SplitAfter(string(repoFile(t, ExampleFile)), "\n") {
		if strings.HasPrefix(line, "# ") {
			line = strings.TrimPrefix(line, "# ")
		}
		out.WriteString(line)
	}
	path := writeConfig(t, out.String())
	got, err := Load(Options{DefaultPath: path, Hostname: func() (string, error) { return testHostname, nil }})
	if err != nil {
		t.Fatalf("uncommented example: %v", err)
	}

	d, err := readFile(path, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, ok := d.lines[k.name]; !ok && !k.notInFile {
			t.Errorf("key %s is missing from %s", k.name, ExampleFile)
		}
	}

	if len(got.OSUpgrade.Profiles) != 1 || len(got.Exec.Drivers) != 1 {
		t.Errorf("want one example profile and one example exec driver, got %+v and %+v", got.OSUpgrade.Profiles, got.Exec.Drivers)
	}
	rest := valuesOf(got)
	if len(got.Maintenance.Windows) != 2 {
		t.Errorf("want the example's two maintenance windows, got %v", got.Maintenance.Windows)
	}
	rest.OSUpgrade, rest.Exec, rest.Maintenance = OSUpgrade{}, Exec{}, Maintenance{}
	if !reflect.DeepEqual(rest, *defaults()) {
		t.Errorf("uncommented example differs from the defaults:\n got %+v\nwant %+v", rest, *defaults())
	}
}
