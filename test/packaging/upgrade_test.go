package packaging

import (
	"context"
	"crypto/md5"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
)

// conffilePrompt is how dpkg starts the question it asks about a conffile
// both the admin and the package changed; "end of file on stdin at
// conffile prompt" is how it fails when nobody can answer.
const conffilePrompt = "Configuration file '"

// Where the package puts its configuration, relative to a root.
var (
	confRel    = strings.TrimPrefix(config.DefaultPath, "/")
	dropInRel  = strings.TrimPrefix(config.DropInDir, "/")
	vendorRel  = strings.TrimPrefix(config.VendorDir, "/")
	defaultRel = strings.TrimPrefix(config.InstalledVendorDefaults, "/")
)

// TestUpgradeKeepsAdminConfig installs the package with dpkg into an empty
// root (dpkg --root, maintainer scripts run chrootless against recording
// stubs of the systemd helpers), lets the admin edit config.yaml and add a
// drop-in, and upgrades with plain dpkg -i (no --force-conf*, stdin not a
// terminal) to a version whose vendor defaults changed. No question may be
// asked, the admin's files stay as written, the new defaults file is in
// place, and the configuration the agent loads from that tree takes each
// value from the right layer. The same upgrade to a package whose conffile
// changed must hit dpkg's prompt: that shows the check would see one.
//
// Version B is version A repacked (dpkg-deb -R, a new version and vendor
// defaults file, md5sums recomputed, dpkg-deb -b): dpkg's conffile
// handling depends only on what the two packages hold.
func TestUpgradeKeepsAdminConfig(t *testing.T) {
	debA := needDeb(t)
	needTools(t, "dpkg", "dpkg-deb", "dpkg-query")
	if os.Geteuid() != 0 {
		t.Skip("dpkg --root installs files owned by root: run as root")
	}
	for _, e := range os.Environ() {
		if name, _, _ := strings.Cut(e, "="); strings.HasPrefix(name, config.EnvPrefix) {
			t.Setenv(name, "") // Load below ignores empty variables
		}
	}

	vendorA := string(readFile(t, filepath.Join(extract(t, debA), defaultRel)))
	vendorB := vendorA + "eventRetention: 48h\nlogLevel: debug\napiTimeout: 15s\n"
	debB := repack(t, debA, "0.1.1", map[string]string{defaultRel: vendorB})

	root, stubLog := dpkgRoot(t)
	if out, err := dpkgInstall(root, debA); err != nil || strings.Contains(out, conffilePrompt) {
		t.Fatalf("dpkg -i %s: %v\n%s", filepath.Base(debA), err, out)
	}

	// The admin's edits: config.yaml (the conffile) and a drop-in.
	conf := filepath.Join(root, confRel)
	edited := string(readFile(t, conf)) + "logLevel: warn\napiTimeout: 20s\n"
	writeRoot(t, conf, edited)
	dropIn := filepath.Join(root, dropInRel, "50-site.yaml")
	const site = "logFormat: json\napiTimeout: 30s\n"
	writeRoot(t, dropIn, site)

	out, err := dpkgInstall(root, debB)
	if strings.Contains(out, conffilePrompt) {
		t.Fatalf("upgrade to %s asked about a conffile:\n%s", filepath.Base(debB), out)
	}
	if err != nil {
		t.Fatalf("dpkg -i %s: %v\n%s", filepath.Base(debB), err, out)
	}
	if got := strings.TrimSpace(mustRun(t, "", "dpkg-query", "--admindir", filepath.Join(root, "var/lib/dpkg"),
		"-W", "-f", "${Version} ${db:Status-Status}", "lifecycle-agent")); got != "0.1.1 installed" {
		t.Errorf("after the upgrade: %q, want 0.1.1 installed", got)
	}

	for path, want := range map[string]string{conf: edited, dropIn: site, filepath.Join(root, defaultRel): vendorB} {
		if got := string(readFile(t, path)); got != want {
			t.Errorf("%s after the upgrade:\n%s\nwant:\n%s", path, got, want)
		}
	}
	// Nothing set aside: dpkg had no conffile decision to make.
	for _, dir := range []string{filepath.Dir(conf), filepath.Join(root, dropInRel), filepath.Join(root, vendorRel)} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.Contains(e.Name(), ".dpkg-") || strings.Contains(e.Name(), ".ucf-") {
				t.Errorf("%s left %s", filepath.Base(debB), filepath.Join(dir, e.Name()))
			}
		}
	}

	// The configuration the agent loads from that tree, layer by layer.
	cfg, err := config.Load(config.Options{
		DefaultPath: conf,
		VendorDir:   filepath.Join(root, vendorRel),
		Hostname:    func() (string, error) { return "pkg-node", nil },
	})
	if err != nil {
		t.Fatalf("loading the upgraded tree: %v", err)
	}
	vendorFile := filepath.Join(root, defaultRel)
	vendorLines := strings.Count(vendorA, "\n")
	confLines := strings.Count(edited, "\n")
	for _, c := range []struct {
		key, source string
		got, want   any
	}{
		{"eventRetention", fmt.Sprintf("%s:%d", vendorFile, vendorLines+1), cfg.EventRetention, 48 * time.Hour},
		{"logLevel", fmt.Sprintf("%s:%d", conf, confLines-1), cfg.LogLevel, config.LogLevelWarn},
		{"logFormat", dropIn + ":1", cfg.LogFormat, config.LogFormatJSON},
		{"apiTimeout", dropIn + ":2", cfg.APITimeout, 30 * time.Second},
		{"socketPath", "default", cfg.SocketPath, "/run/lifecycle-agent/agent.sock"},
	} {
		if !reflect.DeepEqual(c.got, c.want) || cfg.Source(c.key) != c.source {
			t.Errorf("%s = %v from %q, want %v from %q", c.key, c.got, cfg.Source(c.key), c.want, c.source)
		}
	}
	if want := []string{vendorFile, conf, dropIn}; !reflect.DeepEqual(cfg.Files, want) {
		t.Errorf("files read: %q, want %q", cfg.Files, want)
	}
	if calls := string(readFile(t, stubLog)); strings.Contains(calls, "deb-systemd-invoke") || strings.Contains(calls, "systemctl") {
		t.Errorf("with dpkg --root the scripts started or reloaded something:\n%s", calls)
	}

	// The control: the same upgrade to a package whose conffile changed
	// too must stop at dpkg's question.
	t.Run("a changed conffile would prompt", func(t *testing.T) {
		debC := repack(t, debA, "0.1.1", map[string]string{
			defaultRel: vendorB,
			confRel:    string(readFile(t, filepath.Join(extract(t, debA), confRel))) + "## changed\n",
		})
		root, _ := dpkgRoot(t)
		if out, err := dpkgInstall(root, debA); err != nil {
			t.Fatalf("dpkg -i %s: %v\n%s", filepath.Base(debA), err, out)
		}
		conf := filepath.Join(root, confRel)
		writeRoot(t, conf, string(readFile(t, conf))+"logLevel: warn\n")
		out, err := dpkgInstall(root, debC)
		if err == nil || !strings.Contains(out, conffilePrompt) || !strings.Contains(out, "end of file on stdin at conffile prompt") {
			t.Fatalf("upgrade over an edited conffile that the package changed: err %v, output:\n%s\nwant dpkg's conffile prompt, failing on stdin; this host's dpkg configuration may answer it (force-conf* in /etc/dpkg/dpkg.cfg.d)", err, out)
		}
	})
}

// dpkgRoot makes an empty root for dpkg --root (its database only) and a
// directory of recording stubs for the systemd helpers the maintainer
// scripts call; it returns the root and the stubs' log.
func dpkgRoot(t *testing.T) (root, stubLog string) {
	t.Helper()
	root = t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "var/log"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stubs := filepath.Join(root, "stubs")
	if err := os.Mkdir(stubs, 0o755); err != nil {
		t.Fatal(err)
	}
	stubLog = filepath.Join(root, "stub-calls")
	if err := os.WriteFile(stubLog, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"deb-systemd-helper", "deb-systemd-invoke", "systemctl", "lifecycle-agent"} {
		body := fmt.Sprintf("#!/bin/sh\necho \"${0##*/} $*\" >>%s\n", stubLog)
		if err := os.WriteFile(filepath.Join(stubs, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root, stubLog
}

// dpkgInstall runs dpkg -i into root, as an unattended upgrade would: no
// --force-conf* option, stdin /dev/null (not a terminal: a conffile
// question fails at once), and a time limit in case it waits anyway. The
// root has no libc6 or systemd (--force-depends), and the scripts run
// outside it (--force-script-chrootless, DPKG_ROOT set), against the stubs.
func dpkgInstall(root, deb string) (string, error) {
	env := []string{"PATH=" + filepath.Join(root, "stubs") + ":/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := runIn(context.Background(), "", env, 2*time.Minute, "dpkg",
		"--root="+root, "--force-script-chrootless", "--force-depends", "-i", deb)
	return string(out), err
}

// repack makes a copy of deb with another version and some files
// replaced (paths relative to the root), its md5sums recomputed.
func repack(t *testing.T, deb, version string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pkg")
	mustRun(t, "", "dpkg-deb", "--raw-extract", deb, dir)
	control := filepath.Join(dir, "DEBIAN/control")
	text := string(readFile(t, control))
	old := "\nVersion: " + testVersion + "\n"
	if !strings.Contains(text, old) {
		t.Fatalf("%s has no %q", control, strings.TrimSpace(old))
	}
	if err := os.WriteFile(control, []byte(strings.Replace(text, old, "\nVersion: "+version+"\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	for rel, body := range files {
		path := filepath.Join(dir, rel)
		st, err := os.Stat(path)
		if err != nil {
			t.Fatalf("%s is not in %s: %v", rel, filepath.Base(deb), err)
		}
		if err := os.WriteFile(path, []byte(body), st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	var sums []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path == filepath.Join(dir, "DEBIAN"):
			return filepath.SkipDir
		case !d.Type().IsRegular():
			return nil // directories, symbolic links: not in md5sums
		}
		rel, _ := filepath.Rel(dir, path)
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sums = append(sums, fmt.Sprintf("%x  %s\n", md5.Sum(b), rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(sums)
	if err := os.WriteFile(filepath.Join(dir, "DEBIAN/md5sums"), []byte(strings.Join(sums, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), fmt.Sprintf("lifecycle-agent_%s_amd64.deb", version))
	// -Znone: the copy is only installed here; xz would take minutes.
	mustRun(t, "", "dpkg-deb", "-Znone", "--root-owner-group", "--build", dir, out)
	return out
}

// writeRoot writes an admin's file: mode 0600, owned by root.
func writeRoot(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}
