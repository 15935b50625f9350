package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
)

// testHostname is what os.Hostname returns in tests.
const testHostname = "Node-A.Example"

// isolate clears every LIFECYCLE_AGENT_* variable the table knows for the
// duration of t (viper and Load ignore empty variables).
func isolate(t *testing.T) {
	t.Helper()
	for _, k := range keys {
		if e := k.env(); e != "" {
			t.Setenv(e, "")
		}
	}
}

// writeConfig writes a config file with mode 0600 in a fresh directory.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// flags returns a parsed flag set with every config flag registered.
func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	AddFlags(fs, GlobalFlags)
	AddFlags(fs, RunFlags)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

// load runs Load on an isolated environment; file "" means no file at the
// default path.
func load(t *testing.T, file string, fs *pflag.FlagSet) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "absent.yaml")
	if file != "" {
		path = writeConfig(t, file)
	}
	return Load(Options{
		Flags:       fs,
		DefaultPath: path,
		Hostname:    func() (string, error) { return testHostname, nil },
	})
}

func ptr[T any](v T) *T { return &v }
