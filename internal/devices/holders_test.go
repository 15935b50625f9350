package devices

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeProc builds a /proc tree: pid → (fd targets, comm, cgroup).
func fakeProc(t *testing.T, procs map[int]struct {
	fds    []string
	comm   string
	cgroup string
}) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, itoa(pid))
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		for i, target := range p.fds {
			if err := os.Symlink(target, filepath.Join(dir, "fd", itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
		_ = os.WriteFile(filepath.Join(dir, "comm"), []byte(p.comm+"\n"), 0o644)
		_ = os.WriteFile(filepath.Join(dir, "cgroup"), []byte(p.cgroup), 0o644)
	}
	_ = os.MkdirAll(filepath.Join(root, "self"), 0o755) // not a PID: skipped
	return root
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestFindHolders(t *testing.T) {
	type proc = struct {
		fds    []string
		comm   string
		cgroup string
	}
	tests := []struct {
		name  string
		procs map[int]proc
		paths []string
		want  []string
	}{
		{
			name: "a host service, a pod and a stranger",
			procs: map[int]proc{
				4: {fds: []string{"/dev/null", "/dev/nvidia3", "/dev/nvidiactl"}, comm: "nv-hostengine", cgroup: "0::/system.slice/nvidia-dcgm.service\n"},
				7: {fds: []string{"/dev/nvidia3"}, comm: "nvidia-device-plugin", cgroup: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234_abcd.slice/cri-containerd-9f.scope\n"},
				8: {fds: []string{"/dev/nvidia5"}, comm: "python", cgroup: "0::/user.slice/user-1000.slice/session-3.scope\n"},
			},
			paths: []string{"/dev/nvidia3"},
			want: []string{
				"nv-hostengine (pid 4) holds /dev/nvidia3 [unit nvidia-dcgm.service]",
				"nvidia-device-plugin (pid 7) holds /dev/nvidia3 [pod 1234-abcd]",
			},
		},
		{
			name:  "nvidiactl alone does not hold a GPU",
			procs: map[int]proc{3: {fds: []string{"/dev/nvidiactl", "/dev/nvidia-uvm"}, comm: "fabricmanager", cgroup: "0::/system.slice/nvidia-fabricmanager.service\n"}},
			paths: []string{"/dev/nvidia0"},
		},
		{
			name:  "a deleted node still counts; one entry per device",
			procs: map[int]proc{9: {fds: []string{"/dev/nvidia1 (deleted)", "/dev/nvidia1"}, comm: "x", cgroup: "1:name=systemd:/system.slice/foo.service\n"}},
			paths: []string{"/dev/nvidia1"},
			want:  []string{"x (pid 9) holds /dev/nvidia1 [unit foo.service]"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			scan, err := FindHolders(fakeProc(t, tc.procs), tc.paths)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, h := range scan.Holders {
				got = append(got, h.String())
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("holders:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestFindHoldersRealProc finds a real child process that holds a file
// open, the way nvidia-smi finds a client of /dev/nvidiaN.
func TestFindHoldersRealProc(t *testing.T) {
	node := filepath.Join(t.TempDir(), "nvidia0")
	if err := os.WriteFile(node, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "sh", "-c", "exec 3<"+node+"; echo ready; exec sleep 60")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	scan, err := FindHolders("", []string{node})
	if err != nil {
		t.Fatal(err)
	}
	if len(scan.Holders) != 1 || scan.Holders[0].PID != cmd.Process.Pid || scan.Holders[0].Device != node {
		t.Fatalf("want child %d holding %s, got %+v", cmd.Process.Pid, node, scan)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	scan, err = FindHolders("", []string{node})
	if err != nil || len(scan.Holders) != 0 {
		t.Fatalf("after the child exited: %+v, %v", scan, err)
	}
}

func TestClassifyXID(t *testing.T) {
	tests := []struct {
		name    string
		xid     uint64
		ignored []uint64
		want    XIDClass
	}{
		{name: "13 ignorable", xid: 13, want: XIDIgnorable},
		{name: "109 ignorable (device plugin list)", xid: 109, want: XIDIgnorable},
		{name: "94 contained ECC informational", xid: 94, want: XIDInformational},
		{name: "48 DBE needs reset", xid: 48, want: XIDNeedsReset},
		{name: "79 off the bus needs reboot", xid: 79, want: XIDNeedsReboot},
		{name: "64 remapper failure needs replacement", xid: 64, want: XIDNeedsReplace},
		{name: "unknown code fails closed", xid: 999, want: XIDNeedsReset},
		{name: "operator ignores 79", xid: 79, ignored: []uint64{79}, want: XIDIgnorable},
		{name: "operator un-ignores 13", xid: 13, ignored: []uint64{79}, want: XIDNeedsReset},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ClassifyXID(tc.xid, tc.ignored); got != tc.want {
				t.Errorf("ClassifyXID(%d) = %s, want %s", tc.xid, got, tc.want)
			}
		})
	}
}
