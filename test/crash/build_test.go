package crash

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"
)

const (
	gofailModule  = "go.etcd.io/gofail"
	gofailVersion = "v0.2.0"
	// lifecycle_testnvml: NVML may be go-nvml's mock (internal/agent/testnvml.go).
	buildTags = "kustomize_disable_go_plugin_support,lifecycle_testnvml"
	// recipe changes whenever the way the binary is built changes, so that
	// a cached binary from an older recipe is not reused.
	recipe = "failpoint-bin/3"
)

// failpointDirs are the packages whose failpoints the crash test drives.
var failpointDirs = []string{"internal/engine", "internal/journal"}

// journalDir's own tests are copied too: its TestCrashBoundaries needs a
// test binary with the failpoints compiled in (TestJournalCrashBoundaries).
const journalDir = "internal/journal"

// failpointComment is gofail's declaration comment.
var failpointComment = regexp.MustCompile(`(?m)^\s*// gofail: var ([A-Za-z_][A-Za-z0-9_]*) `)

// fpBinary is the agent built with failpoints.
type fpBinary struct {
	Path        string
	JournalTest string // internal/journal's test binary, failpoints compiled in
	Hash        string
	Failpoints  []string // every engine* and journal* failpoint, sorted
	Cached      bool
	Took        time.Duration
}

type srcFile struct {
	path string // slash-separated, relative to the module root
	mode fs.FileMode
	data []byte
}

// buildFailpointBinary returns the agent built from root's sources with the
// failpoints of failpointDirs enabled, building it (under a lock) unless
// the cache holds one for the same sources.
func buildFailpointBinary(ctx context.Context, root string, log io.Writer) (*fpBinary, error) {
	t0 := time.Now()
	files, err := sourceFiles(root)
	if err != nil {
		return nil, err
	}
	goVersion, err := output(ctx, root, nil, "go", "env", "GOVERSION", "GOOS", "GOARCH")
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s@%s\n%s\n", recipe, goVersion, gofailModule, gofailVersion, buildTags)
	var fps []string
	for _, f := range files {
		fmt.Fprintf(h, "%s\x00%o\x00%d\x00", f.path, f.mode&0o111, len(f.data))
		h.Write(f.data)
		if strings.HasSuffix(f.path, ".go") && slices.Contains(failpointDirs, filepath.ToSlash(filepath.Dir(f.path))) {
			for _, m := range failpointComment.FindAllSubmatch(f.data, -1) {
				fps = append(fps, string(m[1]))
			}
		}
	}
	sort.Strings(fps)
	var want []string
	for _, fp := range fps {
		if strings.HasPrefix(fp, "engine") || strings.HasPrefix(fp, "journal") {
			want = append(want, fp)
		}
	}
	hash := hex.EncodeToString(h.Sum(nil))[:20]
	b := &fpBinary{Hash: hash, Failpoints: want}

	cache, err := os.UserCacheDir()
	if err != nil {
		return nil, err
	}
	base := filepath.Join(cache, "lifecycle-agent")
	binRoot := filepath.Join(base, "failpoint-bin")
	if err := os.MkdirAll(binRoot, 0o755); err != nil {
		return nil, err
	}
	b.Path = filepath.Join(binRoot, hash, "lifecycle-agent")
	b.JournalTest = filepath.Join(binRoot, hash, "journal.test")

	// One builder at a time (parallel test runs share the source copy).
	lock, err := os.OpenFile(filepath.Join(binRoot, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("crash: lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck

	if st, err := os.Stat(b.JournalTest); err == nil && st.Mode().IsRegular() {
		b.Cached, b.Took = true, time.Since(t0)
		fmt.Fprintf(log, "crash: failpoint binary cached: %s\n", b.Path)
		return b, nil
	}
	fmt.Fprintf(log, "crash: building the agent with failpoints (%d files, hash %s)\n", len(files), hash)

	// A fixed source directory: the Go build cache keys packages by
	// directory, so a stable path reuses everything that did not change.
	src := filepath.Join(base, "failpoint-src")
	if err := os.RemoveAll(src); err != nil {
		return nil, err
	}
	for _, f := range files {
		p := filepath.Join(src, filepath.FromSlash(f.path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, f.data, f.mode.Perm()|0o200); err != nil {
			return nil, err
		}
	}
	env := buildEnv()
	var dirs []string
	for _, d := range failpointDirs {
		dirs = append(dirs, filepath.Join(src, filepath.FromSlash(d)))
	}
	// gofail as pinned by hack/tools (its own module).
	if _, err := output(ctx, src, env, "go", append([]string{"-C", filepath.Join(src, "hack", "tools"), "tool", "gofail", "enable"}, dirs...)...); err != nil {
		return nil, err
	}
	compiled, err := fixGenerated(dirs)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(compiled, fps) {
		return nil, fmt.Errorf("crash: gofail generated failpoints %v, the comments declare %v", compiled, fps)
	}
	steps := [][]string{
		{"go", "mod", "edit", "-require=" + gofailModule + "@" + gofailVersion},
		{"go", "mod", "download", gofailModule},
		{"go", "build", "-mod=mod", "-tags", buildTags, "-o", b.Path + ".tmp", "./cmd/lifecycle-agent"},
		{"go", "test", "-c", "-mod=mod", "-tags", buildTags, "-o", b.JournalTest + ".tmp", "./" + journalDir},
	}
	if err := os.MkdirAll(filepath.Dir(b.Path), 0o755); err != nil {
		return nil, err
	}
	for _, s := range steps {
		if _, err := output(ctx, src, env, s[0], s[1:]...); err != nil {
			return nil, err
		}
	}
	// The journal test binary last: its presence says both are complete.
	if err := os.Rename(b.Path+".tmp", b.Path); err != nil {
		return nil, err
	}
	if err := os.Rename(b.JournalTest+".tmp", b.JournalTest); err != nil {
		return nil, err
	}
	prune(binRoot, hash, 3)
	b.Took = time.Since(t0)
	fmt.Fprintf(log, "crash: built %s in %s\n", b.Path, b.Took.Round(time.Second))
	return b, nil
}

// sourceFiles lists the module's files as git sees them (tracked and
// untracked, ignored ones left out), without tests but journalDir's: what
// the agent binary and the journal's crash test are built from.
func sourceFiles(root string) ([]srcFile, error) {
	var names []string
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "-c", "-o", "--exclude-standard").Output()
	if err == nil {
		for _, n := range strings.Split(string(out), "\x00") {
			if n != "" {
				names = append(names, n)
			}
		}
	} else {
		// No git (a source tarball): walk the tree, skipping build outputs.
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				switch rel {
				case ".git", "bin", "dist", ".cache", "test/kubebin/bin":
					return filepath.SkipDir
				}
				return nil
			}
			names = append(names, rel)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("crash: list sources of %s: %w", root, err)
		}
	}
	sort.Strings(names)
	names = slices.Compact(names)
	var files []srcFile
	for _, n := range names {
		ownTest := strings.HasSuffix(n, "_test.go") && path.Dir(n) == journalDir
		if (strings.HasSuffix(n, "_test.go") && !ownTest) || strings.HasPrefix(n, "test/") || slices.Contains(strings.Split(n, "/"), "testdata") {
			continue
		}
		p := filepath.Join(root, filepath.FromSlash(n))
		st, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree, not yet in the index
		}
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		files = append(files, srcFile{path: n, mode: st.Mode(), data: data})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("crash: no source files found under %s", root)
	}
	return files, nil
}

var (
	generatedImport = regexp.MustCompile(`(?m)^import "go\.etcd\.io/gofail/runtime"$`)
	runtimeSelector = regexp.MustCompile(`\bruntime\.`)
	newFailpoint    = regexp.MustCompile(`NewFailpoint\("([^"]+)"\)`)
)

// fixGenerated renames the gofail runtime import of the generated
// *.fail.go files: gofail imports it as "runtime", which collides with
// internal/engine's own type runtime (the step runtime), so the engine does
// not compile with failpoints as generated. It returns the failpoints the
// files register, sorted.
func fixGenerated(dirs []string) ([]string, error) {
	var names []string
	for _, d := range dirs {
		gen, err := filepath.Glob(filepath.Join(d, "*.fail.go"))
		if err != nil {
			return nil, err
		}
		if len(gen) == 0 {
			return nil, fmt.Errorf("crash: gofail enable generated nothing in %s", d)
		}
		for _, g := range gen {
			b, err := os.ReadFile(g)
			if err != nil {
				return nil, err
			}
			if !generatedImport.Match(b) {
				return nil, fmt.Errorf("crash: %s: unexpected gofail output:\n%s", g, b)
			}
			b = generatedImport.ReplaceAll(b, []byte(`import gofailruntime "go.etcd.io/gofail/runtime"`))
			b = runtimeSelector.ReplaceAll(b, []byte("gofailruntime."))
			if err := os.WriteFile(g, b, 0o644); err != nil {
				return nil, err
			}
			for _, m := range newFailpoint.FindAllSubmatch(b, -1) {
				names = append(names, string(m[1]))
			}
		}
	}
	sort.Strings(names)
	return names, nil
}

// buildEnv is the environment of the go commands: the repository's CGO
// flags (Makefile) unless set, no workspace, no inherited GOFLAGS.
func buildEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GOFLAGS=") || strings.HasPrefix(kv, "GOWORK=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "GOWORK=off", "CGO_ENABLED=1")
	if os.Getenv("CGO_CFLAGS") == "" {
		env = append(env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	return env
}

func output(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = env
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("crash: %s %s (in %s): %w\nstdout: %s\nstderr: %s", name, strings.Join(args, " "), dir, err, stdout.String(), stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// prune keeps the newest keep binaries (and always the current one), and
// any built in the last 6 hours: a long batch (make chaos) may still be
// starting agents from one while another test run builds a newer one.
func prune(binRoot, current string, keep int) {
	ents, err := os.ReadDir(binRoot)
	if err != nil {
		return
	}
	type dir struct {
		name string
		mod  time.Time
	}
	var ds []dir
	for _, e := range ents {
		if !e.IsDir() || e.Name() == current {
			continue
		}
		if info, err := e.Info(); err == nil {
			ds = append(ds, dir{e.Name(), info.ModTime()})
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].mod.After(ds[j].mod) })
	for i, d := range ds {
		if i >= keep-1 && time.Since(d.mod) > 6*time.Hour {
			_ = os.RemoveAll(filepath.Join(binRoot, d.name))
		}
	}
}
