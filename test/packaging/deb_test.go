package packaging

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestControlFields checks both packages' control fields as dpkg and apt
// show them.
func TestControlFields(t *testing.T) {
	agentDeb, pluginDeb := needDeb(t), needPluginDeb(t)
	tests := []struct {
		deb, field string
		want       *regexp.Regexp
	}{
		{agentDeb, "Package", regexp.MustCompile(`^lifecycle-agent$`)},
		{agentDeb, "Version", regexp.MustCompile(`^` + regexp.QuoteMeta(testVersion) + `$`)},
		{agentDeb, "Architecture", regexp.MustCompile(`^amd64$`)},
		{agentDeb, "Section", regexp.MustCompile(`^admin$`)},
		{agentDeb, "Priority", regexp.MustCompile(`^optional$`)},
		{agentDeb, "Maintainer", regexp.MustCompile(`^.+ <[^@ ]+@[^@ ]+>$`)},
		// libc6 as dpkg-shlibdeps computes it, systemd new enough for
		// ProtectClock= without a device policy, a system bus for logind.
		{agentDeb, "Depends", regexp.MustCompile(`^libc6 \(>= 2\.[0-9]+\), systemd \(>= 252\), default-dbus-system-bus \| dbus-system-bus$`)},
		{agentDeb, "Suggests", regexp.MustCompile(`^kubectl-lifecycle$`)},
		{agentDeb, "Homepage", regexp.MustCompile(`^https://`)},
		{agentDeb, "Description", regexp.MustCompile(`^node lifecycle agent for Kubernetes .*\n .+`)},
		// The plugin: a user's tool, installable where no agent may run.
		{pluginDeb, "Package", regexp.MustCompile(`^kubectl-lifecycle$`)},
		{pluginDeb, "Version", regexp.MustCompile(`^` + regexp.QuoteMeta(testVersion) + `$`)},
		{pluginDeb, "Architecture", regexp.MustCompile(`^amd64$`)},
		{pluginDeb, "Depends", regexp.MustCompile(`^libc6 \(>= 2\.[0-9]+\)$`)},
		{pluginDeb, "Recommends", regexp.MustCompile(`^kubectl$`)},
		{pluginDeb, "Description", regexp.MustCompile(`^kubectl plugin .*\n .+`)},
	}
	for _, tc := range tests {
		t.Run(filepath.Base(tc.deb)+"/"+tc.field, func(t *testing.T) {
			got := strings.TrimRight(mustRun(t, "", "dpkg-deb", "--field", tc.deb, tc.field), "\n")
			if !tc.want.MatchString(got) {
				t.Errorf("%s: %q does not match %s", tc.field, got, tc.want)
			}
		})
	}
}

// debEntry is one line of dpkg-deb --contents.
type debEntry struct {
	mode  string // as ls prints it: -rwxr-xr-x
	owner string // root/root
	size  string
}

// contents lists the package's data archive by path (without the leading
// ".", directories with a trailing "/").
func contents(t *testing.T, deb string) map[string]debEntry {
	t.Helper()
	entries := map[string]debEntry{}
	for _, line := range strings.Split(strings.TrimSpace(mustRun(t, "", "dpkg-deb", "--contents", deb)), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			t.Fatalf("dpkg-deb --contents: odd line %q", line)
		}
		entries[strings.TrimPrefix(f[5], ".")] = debEntry{mode: f[0], owner: f[1], size: f[2]}
	}
	return entries
}

// TestContents checks every file an administrator relies on, with its mode
// and owner, in both packages: the agent's holds no plugin, the plugin's
// nothing that runs or configures a daemon.
func TestContents(t *testing.T) {
	agent := contents(t, needDeb(t))
	plugin := contents(t, needPluginDeb(t))

	wantAgent := map[string]string{ // path: mode
		"/usr/bin/lifecycle-agent":                                   "-rwxr-xr-x",
		"/usr/lib/systemd/system/lifecycle-agent.service":            "-rw-r--r--",
		"/usr/lib/systemd/system/lifecycle-agent-recover.service":    "-rw-r--r--",
		"/usr/lib/lifecycle-agent/recover":                           "-rwxr-xr-x",
		"/etc/lifecycle-agent/":                                      "drwxr-xr-x",
		"/etc/lifecycle-agent/config.yaml":                           "-rw-------",
		"/etc/lifecycle-agent/config.d/":                             "drwxr-xr-x",
		"/usr/lib/lifecycle-agent/config.d/50-package-defaults.yaml": "-rw-r--r--",
		"/etc/systemd/logind.conf.d/":                                "drwxr-xr-x",
		"/usr/share/man/man8/lifecycle-agent.8.gz":                   "-rw-r--r--",
		"/usr/share/man/man8/lifecycle-agent-run.8.gz":               "-rw-r--r--",
		"/usr/share/man/man8/lifecycle-agent-doctor.8.gz":            "-rw-r--r--",
		"/usr/share/bash-completion/completions/lifecycle-agent":     "-rw-r--r--",
		"/usr/share/zsh/vendor-completions/_lifecycle-agent":         "-rw-r--r--",
		"/usr/share/fish/vendor_completions.d/lifecycle-agent.fish":  "-rw-r--r--",
		"/usr/share/doc/lifecycle-agent/copyright":                   "-rw-r--r--",
		"/usr/share/doc/lifecycle-agent/changelog.gz":                "-rw-r--r--",
		"/usr/share/lintian/overrides/lifecycle-agent":               "-rw-r--r--",
	}
	wantPlugin := map[string]string{
		"/usr/bin/kubectl-lifecycle":                          "-rwxr-xr-x",
		"/usr/bin/kubectl_complete-lifecycle":                 "-rwxr-xr-x",
		"/usr/share/man/man1/kubectl-lifecycle.1.gz":          "-rw-r--r--",
		"/usr/share/man/man1/kubectl_complete-lifecycle.1.gz": "-rw-r--r--",
		"/usr/share/doc/kubectl-lifecycle/copyright":          "-rw-r--r--",
		"/usr/share/doc/kubectl-lifecycle/changelog.gz":       "-rw-r--r--",
	}
	for _, pkg := range []struct {
		name string
		got  map[string]debEntry
		want map[string]string
	}{{"lifecycle-agent", agent, wantAgent}, {"kubectl-lifecycle", plugin, wantPlugin}} {
		for path, mode := range pkg.want {
			e, ok := pkg.got[path]
			if !ok {
				t.Errorf("%s: %s missing from the package", pkg.name, path)
				continue
			}
			if e.mode != mode {
				t.Errorf("%s: %s: mode %s, want %s", pkg.name, path, e.mode, mode)
			}
		}
		for path, e := range pkg.got {
			if e.owner != "root/root" {
				t.Errorf("%s: %s: owner %s, want root/root", pkg.name, path, e.owner)
			}
			// State and runtime directories belong to the unit
			// (StateDirectory=, RuntimeDirectory=), not to the package.
			if strings.HasPrefix(path, "/var/") || strings.HasPrefix(path, "/run/") {
				t.Errorf("%s: %s: the package must not ship anything under /var or /run", pkg.name, path)
			}
			// Not /lib: the unit goes under /usr/lib (merged /usr).
			if strings.HasPrefix(path, "/lib/") {
				t.Errorf("%s: %s: ship it under /usr/lib", pkg.name, path)
			}
		}
		// A man page for every program (Debian policy 12.1).
		for path := range pkg.got {
			dir, name := filepath.Split(path)
			if dir != "/usr/bin/" || name == "" {
				continue
			}
			_, in1 := pkg.got["/usr/share/man/man1/"+name+".1.gz"]
			_, in8 := pkg.got["/usr/share/man/man8/"+name+".8.gz"]
			if !in1 && !in8 {
				t.Errorf("%s: %s has no man page in man1 or man8", pkg.name, path)
			}
		}
	}
	// Neither package holds the other's files (dpkg would refuse to
	// install both), and only the agent's has a unit or a conffile.
	for path := range plugin {
		if _, both := agent[path]; both && !strings.HasSuffix(path, "/") {
			t.Errorf("%s is in both packages", path)
		}
		if strings.HasPrefix(path, "/etc/") || strings.Contains(path, "/systemd/") {
			t.Errorf("kubectl-lifecycle: %s: the plugin's package must not configure or run a daemon", path)
		}
	}
	for path := range agent {
		if strings.Contains(path, "kubectl") {
			t.Errorf("lifecycle-agent: %s: the plugin has its own package", path)
		}
	}
}

// TestConffiles checks that dpkg treats the config as a conffile (local
// edits survive upgrades, purge removes it) and nothing else.
func TestConffiles(t *testing.T) {
	deb := needDeb(t)
	ctl := extractControl(t, deb)
	if got, want := string(readFile(t, filepath.Join(ctl, "conffiles"))), "/etc/lifecycle-agent/config.yaml\n"; got != want {
		t.Errorf("conffiles = %q, want %q", got, want)
	}
	md5sums := string(readFile(t, filepath.Join(ctl, "md5sums")))
	for _, p := range []string{"usr/bin/lifecycle-agent", "etc/lifecycle-agent/config.yaml", "usr/lib/systemd/system/lifecycle-agent.service"} {
		if !strings.Contains(md5sums, "  "+p+"\n") {
			t.Errorf("md5sums has no line for %s", p)
		}
	}
	if _, err := os.Stat(filepath.Join(extractControl(t, needPluginDeb(t)), "conffiles")); !os.IsNotExist(err) {
		t.Errorf("kubectl-lifecycle has a conffiles list (%v); it ships no configuration", err)
	}
}

// TestShippedFiles checks that the files in the package are the ones in the
// repository and what the shipped binary generates.
func TestShippedFiles(t *testing.T) {
	deb := needDeb(t)
	root := extract(t, deb)
	same := []struct{ inDeb, inRepo string }{
		{"etc/lifecycle-agent/config.yaml", "packaging/config.yaml"},
		{"usr/lib/lifecycle-agent/config.d/50-package-defaults.yaml", "packaging/config.d/50-package-defaults.yaml"},
		{"usr/share/doc/lifecycle-agent/examples/config.yaml", "packaging/config.example.yaml"},
		{"usr/lib/systemd/system/lifecycle-agent.service", "packaging/systemd/lifecycle-agent.service"},
		{"usr/share/doc/lifecycle-agent/copyright", "packaging/deb/copyright"},
		{"usr/share/lintian/overrides/lifecycle-agent", "packaging/deb/lintian-overrides"},
	}
	for _, s := range same {
		if !bytes.Equal(readFile(t, filepath.Join(root, s.inDeb)), readFile(t, filepath.Join(repoRoot, s.inRepo))) {
			t.Errorf("/%s differs from %s", s.inDeb, s.inRepo)
		}
	}

	agent := filepath.Join(root, "usr/bin/lifecycle-agent")
	completion := mustRun(t, "", agent, "completion", "bash")
	if got := string(readFile(t, filepath.Join(root, "usr/share/bash-completion/completions/lifecycle-agent"))); got != completion {
		t.Errorf("shipped bash completion differs from `lifecycle-agent completion bash`")
	}
	if !strings.Contains(completion, "complete ") || !strings.Contains(completion, "lifecycle-agent") {
		t.Errorf("bash completion does not look like one:\n%.300s", completion)
	}
	for _, sh := range []struct{ shell, path string }{
		{"zsh", "usr/share/zsh/vendor-completions/_lifecycle-agent"},
		{"fish", "usr/share/fish/vendor_completions.d/lifecycle-agent.fish"},
	} {
		if got := string(readFile(t, filepath.Join(root, sh.path))); got != mustRun(t, "", agent, "completion", sh.shell) {
			t.Errorf("/%s differs from `lifecycle-agent completion %s`", sh.path, sh.shell)
		}
	}
	// What kubectl runs for `kubectl lifecycle <TAB>`, with the plugin
	// package's /usr/bin first on PATH: the plugin's subcommands.
	proot := extract(t, needPluginDeb(t))
	cmd := exec.Command(filepath.Join(proot, "usr/bin/kubectl_complete-lifecycle"), "")
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(proot, "usr/bin")+":"+os.Getenv("PATH"))
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), "rollout") || !strings.Contains(string(out), "status") {
		t.Errorf("kubectl_complete-lifecycle '': %v\n%s\nwant the plugin's subcommands", err, out)
	}
	if !bytes.Equal(readFile(t, filepath.Join(proot, "usr/share/doc/kubectl-lifecycle/copyright")), readFile(t, filepath.Join(repoRoot, "packaging/deb/copyright"))) {
		t.Errorf("kubectl-lifecycle: /usr/share/doc/kubectl-lifecycle/copyright differs from packaging/deb/copyright")
	}

	// Man pages and changelog: gzip -9n (no name, no time stamp: the same
	// tree gives the same bytes), and the man page is roff for section 8.
	gz := []string{"usr/share/man/man8/lifecycle-agent.8.gz", "usr/share/doc/lifecycle-agent/changelog.gz"}
	for _, p := range gz {
		f, err := os.Open(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("/%s: %v", p, err)
		}
		body, err := io.ReadAll(zr)
		f.Close()
		if err != nil {
			t.Fatalf("/%s: %v", p, err)
		}
		if zr.Name != "" || !zr.ModTime.IsZero() {
			t.Errorf("/%s: gzip header has name %q, time %v; want neither (gzip -n)", p, zr.Name, zr.ModTime)
		}
		switch {
		case strings.HasSuffix(p, ".8.gz"):
			if !regexp.MustCompile(`(?m)^\.TH "LIFECYCLE-AGENT" "8"`).Match(body) {
				t.Errorf("/%s: no .TH header for section 8:\n%.200s", p, body)
			}
		default:
			first := strings.SplitN(string(body), "\n", 2)[0]
			if want := "lifecycle-agent (" + testVersion + ") "; !strings.HasPrefix(first, want) {
				t.Errorf("/%s: first line %q, want it to start with %q", p, first, want)
			}
		}
	}
}

// TestBinary runs the binaries shipped in the packages, and checks how
// they were built: the kustomize tag, cgo and -trimpath, PIE; the agent
// never BIND_NOW (it would die at start on go-nvml's unresolved symbols),
// the plugin, which has no go-nvml, BIND_NOW as Debian's hardening wants.
func TestBinary(t *testing.T) {
	agent := filepath.Join(extract(t, needDeb(t)), "usr/bin/lifecycle-agent")
	plugin := filepath.Join(extract(t, needPluginDeb(t)), "usr/bin/kubectl-lifecycle")

	out := mustRun(t, "", agent, "--version")
	if want := "lifecycle-agent " + testVersion + " (commit "; !strings.HasPrefix(out, want) {
		t.Errorf("--version = %q, want it to start with %q", out, want)
	}
	if out, want := mustRun(t, "", plugin, "--version"), "kubectl-lifecycle "+testVersion; !strings.HasPrefix(out, want) {
		t.Errorf("kubectl-lifecycle --version = %q, want it to start with %q", out, want)
	}

	for _, b := range []struct {
		path    string
		bindNow bool
	}{{agent, false}, {plugin, true}} {
		name := filepath.Base(b.path)
		dyn := mustRun(t, "", "readelf", "-d", "-W", b.path)
		if now := regexp.MustCompile(`BIND_NOW|Flags:.*\bNOW\b`).MatchString(dyn); now != b.bindNow {
			t.Errorf("%s: BIND_NOW %v, want %v:\n%s", name, now, b.bindNow, dyn)
		}
		if !regexp.MustCompile(`\(FLAGS_1\).*\bPIE\b`).MatchString(dyn) {
			t.Errorf("%s is not PIE:\n%s", name, dyn)
		}
		info := mustRun(t, "", "go", "version", "-m", b.path)
		for _, want := range []string{"-tags=kustomize_disable_go_plugin_support", "CGO_ENABLED=1", "-trimpath=true", "-buildmode=pie"} {
			if !strings.Contains(info, want) {
				t.Errorf("%s: go version -m has no %q:\n%s", name, want, info)
			}
		}
	}
}

// TestLintian runs bookworm's lintian on both packages: no error and no
// warning. Intended findings are overridden, each with its reason, in
// packaging/deb/lintian-overrides.
func TestLintian(t *testing.T) {
	debs := []string{needDeb(t), needPluginDeb(t)}
	needTools(t, "lintian")
	out, err := runIn(context.Background(), "", nil, 5*time.Minute,
		"lintian", append([]string{"--fail-on", "error,warning", "--display-level", ">=warning"}, debs...)...)
	if err != nil {
		t.Fatalf("lintian: %v\n%s", err, out)
	}
	// lintian prints a note when run as root; anything else is a finding.
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" && !strings.Contains(line, "running with root privileges") {
			t.Errorf("lintian: %s", line)
		}
	}
}

// TestBadVersion checks that a version dpkg would refuse, or a Debian
// revision on this native package, is refused before anything is built.
func TestBadVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("packaging tests are skipped in -short mode")
	}
	for _, v := range []string{"0.1.0-1", "v0.1.0", "0.1.0 beta"} {
		out, err := runIn(context.Background(), repoRoot, []string{"DIST=" + t.TempDir()}, time.Minute, "hack/build-deb.sh", v)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "bad package version") {
			t.Errorf("build-deb.sh %q: err %v, output %q; want exit 2 naming the bad version", v, err, out)
		}
	}
}
