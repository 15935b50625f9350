package vm_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
	"github.com/lifecycle-agent/lifecycle-agent/test/vm"
)

// TestVMInfrastructure checks the harness itself, with nothing of the agent:
// boot, ssh, the guest's systemd, the network rule (the guest reaches the
// host's test apiserver as https://kubernetes:6443 with the node's
// kubeconfig, and nothing else), reboot, power cut, power off and on, and a
// stand-in package's install, upgrade, remove and purge.
func TestVMInfrastructure(t *testing.T) {
	defer vm.Scenario(t)()
	c := vm.StartCluster(t)
	probe := buildKubeprobe(t, c.Dir)
	v := c.StartVM(t)

	// The guest: systemd as PID 1, dbus and logind, a persistent journal.
	if got := strings.TrimSpace(v.MustRun("cat /proc/1/comm")); got != "systemd" {
		t.Fatalf("PID 1 is %q, want systemd", got)
	}
	for _, u := range []string{"dbus.service", "systemd-logind.service", "systemd-journald.service", "ssh.service"} {
		if out, code := v.Run("systemctl is-active " + u); code != 0 {
			t.Errorf("%s is %s", u, strings.TrimSpace(out))
		}
	}
	if out := strings.TrimSpace(v.MustRun("hostname; systemd-analyze time | head -1; uname -r; ldd --version | head -1")); !strings.HasPrefix(out, vm.Hostname) {
		t.Errorf("guest: %s", out)
	} else {
		t.Logf("guest: %s", strings.ReplaceAll(out, "\n", " | "))
	}
	v.MustRun("test -d /var/log/journal && busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec")

	// Network: the API server through the forward, with the node's kubeconfig.
	c.ProvisionNode(t, v, "")
	v.CopyIn(probe, "/usr/local/bin/kubeprobe")
	start := time.Now()
	out := v.MustRun("kubeprobe -kubeconfig " + vm.GuestKubeconfig + " -node " + vm.NodeName + " 2>&1")
	t.Logf("kubeprobe (%s):\n%s", time.Since(start).Round(100*time.Millisecond), out)
	n := c.NodeObject(t)
	if cond := vm.NodeCondition(n, "LifecycleTransition"); cond == nil || cond.Reason != "ProbeOK" {
		t.Errorf("the node condition written from the guest is not on the Node: %+v", cond)
	}
	if n.Spec.Unschedulable {
		t.Errorf("node left cordoned by kubeprobe")
	}
	// curl as the node (client certificate), with the test CA: TLS verifies
	// the name kubernetes.
	node := c.Env.NodeConfig(vm.NodeName)
	v.WriteFile("/root/ca.crt", c.Env.CAPEM(), 0o644)
	v.WriteFile("/root/node.crt", node.CertData, 0o600)
	v.WriteFile("/root/node.key", node.KeyData, 0o600)
	if got := v.MustRun(curlAPI + "/readyz"); got != "ok" {
		t.Errorf("readyz via the forward: %q", got)
	}
	if got := v.MustRun(curlAPI + "/api/v1/nodes/" + vm.NodeName); !strings.Contains(got, `"name": "`+vm.NodeName+`"`) {
		t.Errorf("GET own node via the forward: %q", got)
	}
	// Nothing else: not the host (10.0.2.2) on the apiserver's port, not the
	// forward's address on another port, not the outside world.
	port := strings.TrimPrefix(c.APIForward(), "127.0.0.1:")
	for _, target := range []string{"https://10.0.2.2:" + port + "/readyz", "https://10.0.2.100:443/", "http://10.0.2.2:22/", "http://1.1.1.1/", "http://deb.debian.org/"} {
		if out, code := v.Run("curl -sS -k --max-time 5 -o /dev/null " + target + " 2>&1"); code == 0 {
			t.Errorf("the guest reached %s: %s", target, out)
		}
	}

	// Reboot: a new boot ID; the previous boot's journal is kept.
	before := v.BootID()
	v.MustRun("echo synced > /root/marker && sync")
	after := v.Reboot()
	if after == before {
		t.Fatalf("boot ID unchanged")
	}
	if out := v.MustRun("cat /root/marker; journalctl -b -1 -q --no-pager | wc -l"); !strings.HasPrefix(out, "synced") {
		t.Errorf("after reboot: %q", out)
	}

	// Power cut: no orderly shutdown; synced data survives, the journal opens.
	v.MustRun("echo cut > /root/marker2 && sync")
	cut := v.HardReset()
	if cut == after {
		t.Fatalf("boot ID unchanged after the power cut")
	}
	if out := v.MustRun("cat /root/marker2"); strings.TrimSpace(out) != "cut" {
		t.Errorf("synced file after power cut: %q", out)
	}
	if out := v.MustRun("journalctl --list-boots --no-pager | grep -cE '[0-9a-f]{32}'"); atoi(out) < 3 {
		t.Errorf("journal boots after reboot + power cut: %s", out)
	}

	// Power off (QEMU exits) and on again: same disk, the forward works.
	v.Poweroff()
	v.PowerOn()
	if got := v.MustRun("cat /root/marker2; " + curlAPI + "/readyz"); got != "cut\nok" {
		t.Errorf("after power on: %q", got)
	}

	// A stand-in package: install enables and starts its unit; an upgrade
	// restarts it; remove keeps its state directory, purge removes it.
	pkgDir := filepath.Join(c.Dir, "pkgs")
	v.MustRun("mkdir -p /root/pkgs")
	for _, ver := range []string{"1.0", "1.1"} {
		v.CopyIn(buildDummyDeb(t, pkgDir, ver), "/root/pkgs/")
	}
	v.MustRun("dpkg -i /root/pkgs/la-vm-dummy_1.0_all.deb && systemctl is-active la-vm-dummy && test -f /var/lib/la-vm-dummy/state")
	pid1 := v.MustRun("systemctl show -p MainPID --value la-vm-dummy")
	v.MustRun("dpkg -i /root/pkgs/la-vm-dummy_1.1_all.deb && systemctl is-active la-vm-dummy")
	if pid2 := v.MustRun("systemctl show -p MainPID --value la-vm-dummy"); pid2 == pid1 {
		t.Errorf("upgrade did not restart the unit (MainPID %s)", strings.TrimSpace(pid1))
	}
	v.MustRun("DEBIAN_FRONTEND=noninteractive apt-get remove -y la-vm-dummy >/dev/null 2>&1")
	if out, code := v.Run("systemctl is-active la-vm-dummy; test -f /var/lib/la-vm-dummy/state && dpkg-query -W -f='${db:Status-Abbrev}' la-vm-dummy"); code != 0 || !strings.Contains(out, "rc") {
		t.Errorf("after apt-get remove: state dir must stay, package in rc: %q (exit %d)", out, code)
	}
	v.MustRun("DEBIAN_FRONTEND=noninteractive apt-get purge -y la-vm-dummy >/dev/null 2>&1")
	if out, code := v.Run("test ! -e /var/lib/la-vm-dummy && ! dpkg-query -W la-vm-dummy 2>/dev/null"); code != 0 {
		t.Errorf("after apt-get purge: state dir or package left: %q", out)
	}
}

// curlAPI is curl in the guest as system:node:vm-node through the forward.
const curlAPI = "curl -sS --max-time 30 --cacert /root/ca.crt --cert /root/node.crt --key /root/node.key " + vm.GuestAPIServer

// buildKubeprobe builds test/vm/testdata/kubeprobe into dir with the
// settings hack/build-deb.sh builds the agent with (cgo, -trimpath, PIE, the
// same CGO_CFLAGS), so that client-go and its dependencies come from the
// build cache the package's build (make test-vm depends on make deb) has
// just filled. Built static (CGO_ENABLED=0) it shared nothing and took
// 1m40s on a cold cache. The guest is the same Debian as the host, so the
// dynamic glibc link is fine.
func buildKubeprobe(t *testing.T, dir string) string {
	t.Helper()
	start := time.Now()
	out := filepath.Join(dir, "kubeprobe")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "kustomize_disable_go_plugin_support", "-trimpath", "-buildmode=pie", "-ldflags", "-s -w", "-o", out, "./test/vm/testdata/kubeprobe")
	cmd.Dir = testenv.RepoRoot()
	cflags := os.Getenv("CGO_CFLAGS")
	if cflags == "" {
		cflags = "-O2 -g -Wno-deprecated-declarations" // hack/build-deb.sh's default
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS="+cflags)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build kubeprobe: %v\n%s", err, b)
	}
	vm.Timings.Record("go build kubeprobe", time.Since(start))
	return out
}

// buildDummyDeb makes la-vm-dummy_<ver>_all.deb: a unit with a
// StateDirectory, enabled and (re)started by postinst, stopped by prerm on
// remove, its state removed by postrm on purge (as the agent's package does).
func buildDummyDeb(t *testing.T, dir, ver string) string {
	t.Helper()
	root := filepath.Join(dir, "la-vm-dummy-"+ver)
	files := map[string]string{
		"DEBIAN/control": fmt.Sprintf("Package: la-vm-dummy\nVersion: %s\nArchitecture: all\nMaintainer: test <test@example.invalid>\nDescription: VM test stand-in package\n", ver),
		"lib/systemd/system/la-vm-dummy.service": "[Unit]\nDescription=la-vm-dummy\n[Service]\nStateDirectory=la-vm-dummy\n" +
			"ExecStartPre=/bin/sh -c 'date > /var/lib/la-vm-dummy/state'\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
		"DEBIAN/postinst": "#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n  deb-systemd-helper enable la-vm-dummy.service\n  systemctl daemon-reload\n  systemctl restart la-vm-dummy.service\nfi\n",
		"DEBIAN/prerm":    "#!/bin/sh\nset -e\nif [ \"$1\" = remove ]; then systemctl stop la-vm-dummy.service || true; fi\n",
		"DEBIAN/postrm":   "#!/bin/sh\nset -e\nif [ \"$1\" = purge ]; then\n  deb-systemd-helper purge la-vm-dummy.service >/dev/null || true\n  rm -rf /var/lib/la-vm-dummy\nfi\nif [ \"$1\" = remove ]; then systemctl daemon-reload || true; fi\n",
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(name, "DEBIAN/post") || strings.HasPrefix(name, "DEBIAN/pre") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	deb := filepath.Join(dir, fmt.Sprintf("la-vm-dummy_%s_all.deb", ver))
	if b, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", root, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v\n%s", err, b)
	}
	return deb
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}
