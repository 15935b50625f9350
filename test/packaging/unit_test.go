package packaging

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	unitName = "lifecycle-agent.service"
	// recoverUnit is the agent unit's OnFailure=: it starts the agent again
	// after its start limit tripped (packaging/lib/recover).
	recoverUnit = "lifecycle-agent-recover.service"
)

// unitRoot extracts the package into a directory usable as
// systemd-analyze --root: the package's files plus a copy of the host's
// system units (sysinit.target, dbus.service, ...), which the unit's
// default and explicit dependencies name.
func unitRoot(t *testing.T, deb string) string {
	t.Helper()
	// man: verify looks up Documentation=man:lifecycle-agent(8) with it.
	needTools(t, "systemd-analyze", "man")
	root := extract(t, deb)
	hostUnits, err := filepath.EvalSymlinks("/usr/lib/systemd/system")
	if err != nil {
		t.Fatalf("host system units: %v", err)
	}
	// The package's unit is in the same directory as the host's: copy the
	// host's in, then put the one under test back over an installed
	// lifecycle-agent's, which must not shadow it.
	dir := filepath.Join(root, "usr/lib/systemd/system")
	var units [][]byte
	for _, u := range []string{unitName, recoverUnit} {
		units = append(units, readFile(t, filepath.Join(dir, u)))
	}
	mustRun(t, "", "cp", "-a", hostUnits+"/.", dir)
	for i, u := range []string{unitName, recoverUnit} {
		if err := os.WriteFile(filepath.Join(dir, u), units[i], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// analyze runs systemd-analyze with man pages looked up in the extracted
// package (Documentation=man:lifecycle-agent(8)).
func analyze(root string, args ...string) (string, error) {
	out, err := runIn(context.Background(), "", []string{"MANPATH=" + filepath.Join(root, "usr/share/man"), "LC_ALL=C.UTF-8"},
		2*time.Minute, "systemd-analyze", args...)
	return string(out), err
}

// TestSystemdVerify runs systemd-analyze verify on the unit as the package
// installs it. With --root on the extracted package, verify checks that
// ExecStart's binary exists and is executable, and (through MANPATH) that
// the man page named by Documentation= exists; a second run without the
// binary shows that the check is real.
func TestSystemdVerify(t *testing.T) {
	deb := needDeb(t)
	root := unitRoot(t, deb)

	out, err := analyze(root, "verify", "--root="+root, unitName, recoverUnit)
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify: err %v, output:\n%s", err, out)
	}

	bin := filepath.Join(root, "usr/bin/lifecycle-agent")
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	out, err = analyze(root, "verify", "--root="+root, unitName)
	if err == nil || !strings.Contains(out, "/usr/bin/lifecycle-agent is not executable") {
		t.Errorf("verify without the binary: err %v, output %q; want a failure naming /usr/bin/lifecycle-agent", err, out)
	}
}

// securityItem is one line of systemd-analyze security --json=short.
type securityItem struct {
	Set         *bool  `json:"set"`
	Name        string `json:"name"`
	Description string `json:"description"`
}

// TestSystemdSecurity checks the unit's sandbox with systemd-analyze
// security --offline=yes: the exposure score is the one the unit's header
// records, the hardening the issue asks for is on, and what would break GPU
// reset (device access, writable /sys, module loading) is off.
func TestSystemdSecurity(t *testing.T) {
	deb := needDeb(t)
	root := unitRoot(t, deb)

	out, err := analyze(root, "security", "--offline=yes", "--root="+root, unitName)
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for ` + regexp.QuoteMeta(unitName) + `: ([0-9]+\.[0-9]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no overall exposure in:\n%s", out)
	}
	unit := string(readFile(t, filepath.Join(repoRoot, "packaging/systemd", unitName)))
	recorded := regexp.MustCompile(`exposure ([0-9]+\.[0-9]+)`).FindStringSubmatch(unit)
	switch {
	case recorded == nil:
		t.Errorf("the unit's header records no exposure score; systemd-analyze security rates it %s", m[1])
	case recorded[1] != m[1]:
		t.Errorf("systemd-analyze security rates the unit %s, its header says %s: update the header", m[1], recorded[1])
	}
	t.Logf("systemd-analyze security --offline=yes: overall exposure %s", m[1])

	js, err := analyze(root, "security", "--offline=yes", "--root="+root, "--json=short", unitName)
	if err != nil {
		t.Fatalf("systemd-analyze security --json: %v\n%s", err, js)
	}
	var items []securityItem
	if err := json.Unmarshal([]byte(js), &items); err != nil {
		t.Fatalf("systemd-analyze security --json: %v\n%s", err, js)
	}
	byName := map[string]securityItem{}
	for _, it := range items {
		byName[it.Name] = it
	}
	tests := []struct {
		name string
		set  bool
		desc string // substring of the description, when it matters
	}{
		{"ProtectSystem=", true, "strict"},
		{"ProtectHome=", true, ""},
		{"PrivateTmp=", true, ""},
		{"NoNewPrivileges=", true, ""},
		{"LockPersonality=", true, ""},
		{"RestrictRealtime=", true, ""},
		{"RestrictSUIDSGID=", true, ""},
		{"ProtectClock=", true, ""},
		{"ProtectHostname=", true, ""},
		{"ProtectControlGroups=", true, ""},
		{"NotifyAccess=", true, ""},
		{"RestrictAddressFamilies=~AF_PACKET", true, ""},
		{"UMask=", true, ""},
		// /dev/nvidia* must stay reachable: no private /dev and no device
		// ACL (ProtectClock= must not have added one).
		{"PrivateDevices=", false, ""},
		{"DeviceAllow=", false, "no device ACL"},
		// PCI remove/rescan through /sys, reloading the nvidia modules.
		{"ProtectKernelTunables=", false, ""},
		{"ProtectKernelModules=", false, ""},
		{"MemoryDenyWriteExecute=", false, ""},
	}
	for _, tc := range tests {
		it, ok := byName[tc.name]
		switch {
		case !ok:
			t.Errorf("%s: not in systemd-analyze security's report", tc.name)
		case it.Set == nil || *it.Set != tc.set:
			t.Errorf("%s: set = %v, want %v (%s)", tc.name, ptrBool(it.Set), tc.set, it.Description)
		case !strings.Contains(it.Description, tc.desc):
			t.Errorf("%s: %q does not say %q", tc.name, it.Description, tc.desc)
		}
	}
}

func ptrBool(b *bool) any {
	if b == nil {
		return "n/a"
	}
	return *b
}

// TestUnitDirectives checks the directives the agent's behaviour depends
// on, in the unit as shipped: readiness and watchdog, restart policy,
// ordering against the kubelet, directories, kill mode.
// TestRecoverUnitDirectives checks the unit the agent's start limit pulls
// in: a static oneshot that waits without a start timeout.
func TestRecoverUnitDirectives(t *testing.T) {
	deb := needDeb(t)
	root := extract(t, deb)
	unit := parseUnit(t, filepath.Join(root, "usr/lib/systemd/system", recoverUnit))
	for _, w := range []struct{ section, key, value string }{
		{"Service", "Type", "oneshot"},
		{"Service", "ExecStart", "/usr/lib/lifecycle-agent/recover"},
		{"Service", "Environment", "LIFECYCLE_AGENT_RECOVER_DELAY=900"},
		{"Service", "TimeoutStartSec", "infinity"},
	} {
		if !slices.Contains(unit[w.section][w.key], w.value) {
			t.Errorf("%s: [%s] %s=%s missing; have %q", recoverUnit, w.section, w.key, w.value, unit[w.section][w.key])
		}
	}
	if install, ok := unit["Install"]; ok {
		t.Errorf("%s has an [Install] section (%v): it must stay static, pulled in by OnFailure= only", recoverUnit, install)
	}
}

func TestUnitDirectives(t *testing.T) {
	deb := needDeb(t)
	root := extract(t, deb)
	unit := parseUnit(t, filepath.Join(root, "usr/lib/systemd/system", unitName))

	want := []struct{ section, key, value string }{
		{"Unit", "Wants", "network-online.target"},
		{"Unit", "After", "network-online.target"},
		{"Unit", "After", "dbus.service"},
		{"Unit", "After", "systemd-logind.service"},
		{"Unit", "After", "nvidia-persistenced.service"},
		{"Unit", "After", "nvidia-fabricmanager.service"},
		{"Unit", "Before", "kubelet.service"},
		{"Unit", "StartLimitIntervalSec", "10min"},
		{"Unit", "StartLimitBurst", "10"},
		{"Unit", "OnFailure", "lifecycle-agent-recover.service"},
		{"Service", "Type", "notify"},
		{"Service", "NotifyAccess", "main"},
		{"Service", "ExecStart", "/usr/bin/lifecycle-agent run"},
		{"Service", "WatchdogSec", "30s"},
		{"Service", "Restart", "always"},
		{"Service", "RestartSec", "5s"},
		{"Service", "RestartPreventExitStatus", "2"},
		{"Service", "KillMode", "mixed"},
		{"Service", "StateDirectory", "lifecycle-agent"},
		{"Service", "StateDirectoryMode", "0700"},
		{"Service", "RuntimeDirectory", "lifecycle-agent"},
		{"Service", "RuntimeDirectoryMode", "0700"},
		{"Service", "RuntimeDirectoryPreserve", "no"},
		{"Service", "ConfigurationDirectory", "lifecycle-agent"},
		{"Service", "ReadWritePaths", "-/etc/systemd/logind.conf.d"},
		{"Service", "RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"},
		{"Install", "WantedBy", "multi-user.target"},
	}
	for _, w := range want {
		if !unit.has(w.section, w.key, w.value) {
			t.Errorf("[%s] %s=%s: missing (have %q)", w.section, w.key, w.value, unit[w.section][w.key])
		}
	}
	// Dependencies on other units are ordering only: a missing kubelet or
	// NVIDIA unit never keeps the agent from starting, nor the reverse.
	for _, key := range []string{"Requires", "Requisite", "BindsTo", "PartOf"} {
		if v := unit["Unit"][key]; len(v) > 0 {
			t.Errorf("[Unit] %s=%v: the agent must not be tied to other units' state", key, v)
		}
	}
	// Configuration comes from /etc/lifecycle-agent/config.yaml only.
	for _, key := range []string{"Environment", "EnvironmentFile"} {
		if v := unit["Service"][key]; len(v) > 0 {
			t.Errorf("[Service] %s=%v: configuration belongs in /etc/lifecycle-agent/config.yaml", key, v)
		}
	}
}

// unitFile maps section → key → values (in order; space-separated lists
// are split, as systemd does for dependency and address-family lists).
type unitFile map[string]map[string][]string

func (u unitFile) has(section, key, value string) bool {
	for _, v := range u[section][key] {
		if v == value {
			return true
		}
	}
	return false
}

// listKeys are the keys whose space-separated values are lists.
var listKeys = map[string]bool{"Wants": true, "After": true, "Before": true, "Requires": true, "WantedBy": true}

func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			key, value, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: odd line %q", path, line)
			}
			if listKeys[key] {
				u[section][key] = append(u[section][key], strings.Fields(value)...)
			} else {
				u[section][key] = append(u[section][key], value)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}
