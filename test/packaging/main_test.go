package packaging

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// testVersion is the package version the tests build.
const testVersion = "0.1.0"

// tools the tests run, with the Debian package that provides each.
var tools = map[string]string{
	"make":            "make",
	"dpkg":            "dpkg",
	"dpkg-deb":        "dpkg",
	"dpkg-query":      "dpkg",
	"dpkg-shlibdeps":  "dpkg-dev",
	"readelf":         "binutils",
	"lintian":         "lintian",
	"systemd-analyze": "systemd",
	"shellcheck":      "shellcheck",
	"unshare":         "util-linux",
	"man":             "man-db",
}

var (
	repoRoot string // the repository root, from this package's directory
	tmpRoot  string // removed by TestMain

	buildOnce     sync.Once
	debPath       string // lifecycle-agent, the node agent
	pluginDebPath string // kubectl-lifecycle, the plugin's own package
	buildErr      error

	toolsMu sync.Mutex
)

func TestMain(m *testing.M) {
	var err error
	if repoRoot, err = filepath.Abs("../.."); err == nil {
		tmpRoot, err = os.MkdirTemp("", "lifecycle-agent-packaging-")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(tmpRoot)
	os.Exit(code)
}

// needDeb builds the packages once (make deb into a temporary DIST) and
// returns the agent's path. It skips in -short mode.
func needDeb(t *testing.T) string {
	t.Helper()
	buildDebs(t)
	return debPath
}

// needPluginDeb is needDeb for the kubectl plugin's package.
func needPluginDeb(t *testing.T) string {
	t.Helper()
	buildDebs(t)
	return pluginDebPath
}

func buildDebs(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the Debian packages; skipped in -short mode")
	}
	needTools(t, "make", "dpkg-deb", "dpkg-shlibdeps", "readelf")
	buildOnce.Do(func() {
		dist := filepath.Join(tmpRoot, "dist")
		var out []byte
		out, buildErr = runIn(context.Background(), repoRoot, nil, 20*time.Minute,
			"make", "--no-print-directory", "deb", "DEB_VERSION="+testVersion, "DIST="+dist)
		if buildErr != nil {
			buildErr = fmt.Errorf("make deb: %w\n%s", buildErr, out)
			return
		}
		debPath = filepath.Join(dist, "lifecycle-agent_"+testVersion+"_amd64.deb")
		pluginDebPath = filepath.Join(dist, "kubectl-lifecycle_"+testVersion+"_amd64.deb")
		for _, p := range []string{debPath, pluginDebPath} {
			if _, err := os.Stat(p); err != nil {
				buildErr = fmt.Errorf("make deb did not write %s: %w\n%s", p, err, out)
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

// extract unpacks the package's files (dpkg-deb -x) into a new directory.
func extract(t *testing.T, deb string) string {
	t.Helper()
	dir := t.TempDir()
	mustRun(t, "", "dpkg-deb", "-x", deb, dir)
	return dir
}

// extractControl unpacks the package's control area (dpkg-deb -e).
func extractControl(t *testing.T, deb string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "DEBIAN")
	mustRun(t, "", "dpkg-deb", "-e", deb, dir)
	return dir
}

// needTools makes sure the commands exist: a missing one is installed from
// Debian when the test runs as root with apt-get; otherwise the test fails
// naming the package to install.
func needTools(t *testing.T, names ...string) {
	t.Helper()
	toolsMu.Lock()
	defer toolsMu.Unlock()
	var pkgs []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			pkgs = append(pkgs, tools[n])
		}
	}
	if len(pkgs) == 0 {
		return
	}
	if _, err := exec.LookPath("apt-get"); err != nil || os.Geteuid() != 0 {
		t.Fatalf("missing commands; install the Debian packages: %s", strings.Join(pkgs, " "))
	}
	t.Logf("installing Debian packages %v", pkgs)
	env := []string{"DEBIAN_FRONTEND=noninteractive"}
	if out, err := runIn(context.Background(), "", env, 10*time.Minute, "apt-get", "update", "-qq"); err != nil {
		t.Fatalf("apt-get update: %v\n%s", err, out)
	}
	args := append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)
	if out, err := runIn(context.Background(), "", env, 10*time.Minute, "apt-get", args...); err != nil {
		t.Fatalf("apt-get install %v: %v\n%s", pkgs, err, out)
	}
}

// runIn runs a command in dir (the current directory when empty) with env
// added to the environment, and returns its combined output.
func runIn(ctx context.Context, dir string, env []string, timeout time.Duration, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.Bytes(), err
}

// mustRun runs a command (2 minutes at most) and fails the test when it
// fails; it returns the combined output.
func mustRun(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	out, err := runIn(context.Background(), dir, nil, 2*time.Minute, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// readFile returns a file's content or fails the test.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
