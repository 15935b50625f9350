package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMemCgroupRead(t *testing.T) {
	write := func(dir string, files map[string]string) {
		for name, s := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	v1 := t.TempDir()
	write(v1, map[string]string{
		"memory.usage_in_bytes":     "71102464\n",
		"memory.max_usage_in_bytes": "71241728\n",
		"memory.stat":               "cache 61333504\nrss 8921088\nrss_huge 0\nshmem 0\nmapped_file 38584320\ntotal_cache 1\n",
	})
	got, err := (&MemCgroup{Dir: v1}).Read()
	if err != nil {
		t.Fatal(err)
	}
	want := CgroupMem{Current: 71102464, Peak: 71241728, Anon: 8921088, File: 61333504, FileMapped: 38584320, Kernel: 71102464 - 8921088 - 61333504}
	if got != want {
		t.Errorf("v1: got %+v, want %+v", got, want)
	}
	v2 := t.TempDir()
	write(v2, map[string]string{
		"memory.current": "30000000\n",
		"memory.stat":    "anon 8000000\nfile 21000000\nkernel 1000000\nfile_mapped 15000000\n",
	})
	got, err = (&MemCgroup{Dir: v2, V2: true}).Read()
	if err != nil {
		t.Fatal(err)
	}
	// No memory.peak (Linux < 5.19): 0.
	want = CgroupMem{Current: 30000000, Anon: 8000000, File: 21000000, FileMapped: 15000000, Kernel: 1000000}
	if got != want {
		t.Errorf("v2: got %+v, want %+v", got, want)
	}
}

func TestMemCgroupWrap(t *testing.T) {
	c := &MemCgroup{Dir: "/sys/fs/cgroup/x"}
	got := strings.Join(c.Wrap([]string{"bin/agent", "run", "--a b"}), "|")
	want := `/bin/sh|-c|echo $$ > "$0" && exec "$@"|/sys/fs/cgroup/x/cgroup.procs|bin/agent|run|--a b`
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestDropPageCache checks that a written file's pages leave the page
// cache (where the file system keeps one: not on tmpfs, whose pages are
// the file).
func TestDropPageCache(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	before, after, err := DropPageCache(p)
	if err != nil {
		t.Fatal(err)
	}
	if before == 0 {
		t.Skip("the file was not in the page cache after writing it (tmpfs?)")
	}
	if after >= before && ReadaheadKB(p) >= 0 {
		t.Errorf("%d bytes cached before the drop, %d after", before, after)
	}
}
