package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Exit codes of RunCheck: the protocol between CommandChecker and the check
// subprocess. They avoid 1 and 2, which a CLI framework or the Go runtime
// may use for other reasons.
const (
	ExitCheckOK           = 0  // healthy; also printed as a marker on stdout
	ExitCheckCorrupt      = 10 // ErrCorrupt: move the file aside
	ExitCheckLocked       = 11 // ErrLocked: another process holds the file
	ExitCheckSchemaTooNew = 12 // ErrSchemaTooNew: written by a newer agent
	ExitCheckFailed       = 13 // the check could not be done (I/O, permissions, missing file)
	ExitCheckUsage        = 14 // bad arguments
)

const (
	exitGoRuntimeFatal     = 2 // a Go panic or fatal fault (bbolt's tx.Check panics on a bad page)
	checkStartMarker       = "journal-check: start"
	checkOKMarker          = "journal-check: ok"
	checkOutputLimit       = 64 << 10
	checkWaitDelay         = 5 * time.Second
	lockTimeoutFlagPrefix  = "--lock-timeout="
	maxCheckErrorsReported = 10
)

// CheckFile checks the journal at path in this process: bbolt's page-level
// consistency check (tx.Check), the schema version, and, at the current
// schema, that every record decodes and validates. It opens the file
// read-only (a shared lock, waiting at most lockTimeout) and never writes.
//
// tx.Check can panic on a bad data page, killing the process: call CheckFile
// only in a process that can afford that, i.e. through RunCheck in a
// subprocess (CommandChecker). The error wraps ErrCorrupt, ErrLocked or
// ErrSchemaTooNew; any other error means the check could not be done.
func CheckFile(path string, lockTimeout time.Duration) error {
	// Make sure the file itself is readable, so that bbolt's errors below
	// are about its contents.
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("journal: check %s: %w", path, err)
	}
	_ = f.Close()

	// The read-only open holds a shared lock for the whole check, so no
	// agent writes to the file meanwhile.
	db, err := bolt.Open(path, fileMode, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return fmt.Errorf("%w: %s (waited %v): %w", ErrLocked, path, lockTimeout, err)
		}
		return fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	defer db.Close()

	// One bad meta page is what a torn meta write leaves; bbolt reads the
	// other one and its next commit rewrites the bad one. tx.Check, though,
	// asserts on both, so check a copy whose bad meta page is replaced by
	// the good one: the file as bbolt sees it.
	checkDB := db
	if good, pageSize, ok := singleGoodMeta(path); ok {
		copyDB, cleanup, err := healedCopy(path, good, pageSize, lockTimeout)
		if err != nil {
			return fmt.Errorf("journal: check %s: %w", path, err)
		}
		defer cleanup()
		checkDB = copyDB
	}

	return checkDB.View(func(tx *bolt.Tx) error {
		var problems []string
		for err := range tx.Check() {
			if len(problems) < maxCheckErrorsReported {
				problems = append(problems, err.Error())
			}
		}
		if len(problems) > 0 {
			return fmt.Errorf("%w: %s: %s", ErrCorrupt, path, strings.Join(problems, "; "))
		}
		found, _, err := schemaVersion(tx)
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", path, err)
		case found > SchemaVersion:
			return schemaTooNew(path, found)
		case found < SchemaVersion:
			// Older files are checked at page level only; Open migrates
			// them, and a migration that meets a bad record fails without
			// touching the file.
			return nil
		}
		if err := checkRecords(tx); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
		}
		return nil
	})
}

// bbolt's page and meta layout (go.etcd.io/bbolt/internal/common), needed
// to tell one bad meta page from two.
const (
	boltMagic        = 0xED0CDAED
	boltVersion      = 2
	boltMetaFlag     = 0x04
	boltPageHeader   = 16                  // id u64, flags u16, count u16, overflow u32
	boltMetaChecksum = boltPageHeader + 56 // the checksum covers the meta before it
)

// validMeta reports whether buf (a page read at slot 0 or 1) is a meta page
// that bbolt would accept and tx.Check would not assert on.
func validMeta(buf []byte, slot int) (pageSize int, ok bool) {
	if len(buf) < boltMetaChecksum+8 {
		return 0, false
	}
	ne := binary.NativeEndian
	h := fnv.New64a()
	_, _ = h.Write(buf[boltPageHeader:boltMetaChecksum])
	ok = ne.Uint64(buf[0:]) == uint64(slot) && ne.Uint16(buf[8:]) == boltMetaFlag &&
		ne.Uint32(buf[boltPageHeader:]) == boltMagic && ne.Uint32(buf[boltPageHeader+4:]) == boltVersion &&
		ne.Uint64(buf[boltMetaChecksum:]) == h.Sum64()
	return int(ne.Uint32(buf[boltPageHeader+8:])), ok
}

// singleGoodMeta reports whether exactly one of the two meta pages of the
// file is valid, which one, and the page size it gives.
func singleGoodMeta(path string) (good, pageSize int, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	read := func(off int64) []byte {
		buf := make([]byte, boltMetaChecksum+8)
		if _, err := f.ReadAt(buf, off); err != nil {
			return nil
		}
		return buf
	}
	if ps, ok0 := validMeta(read(0), 0); ok0 {
		if ps < 1024 {
			return 0, 0, false
		}
		_, ok1 := validMeta(read(int64(ps)), 1)
		return 0, ps, !ok1
	}
	// Meta 0 is bad: find meta 1 the way bbolt does, trying page sizes.
	for i := 0; i <= 14; i++ {
		off := int64(1024) << i
		if ps, ok1 := validMeta(read(off), 1); ok1 && int64(ps) == off {
			return 1, ps, true
		}
	}
	return 0, 0, false
}

// healedCopy copies the file to a temporary file, replaces its bad meta page
// with the good one, and opens the copy read-only.
func healedCopy(path string, good, ps int, lockTimeout time.Duration) (*bolt.DB, func(), error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	if 2*ps > len(data) {
		return nil, nil, fmt.Errorf("%w: bad page size %d", ErrCorrupt, ps)
	}
	bad := 1 - good
	page := slices.Clone(data[good*ps : good*ps+ps])
	binary.NativeEndian.PutUint64(page[0:], uint64(bad))
	copy(data[bad*ps:], page)

	tmp, err := os.CreateTemp("", "journal-check-*.db")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = os.Remove(tmp.Name()) }
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	db, err := bolt.Open(tmp.Name(), fileMode, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	// Unlink at once: the open file outlives its name, and a crash in
	// tx.Check leaves nothing behind.
	cleanup()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s with its good meta page: %w", ErrCorrupt, path, err)
	}
	return db, func() { _ = db.Close() }, nil
}

// checkRecords decodes every record of a current-schema file.
func checkRecords(tx *bolt.Tx) error {
	for _, name := range v1Buckets {
		if tx.Bucket(name) == nil {
			return fmt.Errorf("missing bucket %s", name)
		}
	}
	events := tx.Bucket(bucketEvents)
	err := events.ForEach(func(k, v []byte) error {
		if v == nil {
			return fmt.Errorf("events/%q: a bucket where a record belongs", k)
		}
		_, err := decodeEvent(k, v)
		return wrapKey(err, "events/%q", k)
	})
	if err != nil {
		return err
	}
	steps := tx.Bucket(bucketSteps)
	err = steps.ForEach(func(uid, v []byte) error {
		if v != nil {
			return fmt.Errorf("steps/%q: a record where a bucket belongs", uid)
		}
		if events.Get(uid) == nil {
			return fmt.Errorf("steps/%q: step log of an event without a snapshot", uid)
		}
		return steps.Bucket(uid).ForEach(func(k, v []byte) error {
			_, err := decodeStep(k, v)
			return wrapKey(err, "steps/%q/%x", uid, k)
		})
	})
	if err != nil {
		return err
	}
	err = tx.Bucket(bucketOutbox).ForEach(func(k, v []byte) error {
		_, err := decodeOutbox(k, v)
		return wrapKey(err, "outbox/%x", k)
	})
	if err != nil {
		return err
	}
	err = tx.Bucket(bucketOwned).ForEach(func(k, v []byte) error {
		_, err := decodeChange(k, v)
		return wrapKey(err, "owned/%q", k)
	})
	if err != nil {
		return err
	}
	err = tx.Bucket(bucketHistory).ForEach(func(k, v []byte) error {
		_, err := decodeHistory(k, v)
		return wrapKey(err, "history/%x", k)
	})
	if err != nil {
		return err
	}
	if b := tx.Bucket(bucketNotify); b != nil { // optional (notices.go)
		err := b.ForEach(func(k, v []byte) error {
			_, err := decodeNotice(k, v)
			return wrapKey(err, "notify/%x", k)
		})
		if err != nil {
			return err
		}
	}
	if b := tx.Bucket(bucketRequests); b != nil { // optional (requests.go)
		err := b.ForEach(func(k, v []byte) error {
			_, err := decodeRequest(k, v)
			return wrapKey(err, "requests/%q", k)
		})
		if err != nil {
			return err
		}
	}
	if b := tx.Bucket(bucketGPUHealth); b != nil { // optional (gpuhealth.go)
		return b.ForEach(func(k, v []byte) error {
			_, err := decodeGPUHealth(k, v)
			return wrapKey(err, "gpuhealth/%q", k)
		})
	}
	return nil
}

func wrapKey(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), err)
}

// RunCheck is the body of the hidden command that CommandChecker runs
// (`lifecycle-agent journal check-file [--lock-timeout=D] PATH`): it runs
// CheckFile and returns the exit code to exit with. It prints a start marker
// before the check and an ok marker after a clean one on stdout, and the
// error on stderr, so that the parent can tell a crash during the check (a
// corrupt page) from a command that never ran the check.
func RunCheck(args []string, stdout, stderr io.Writer) int {
	lockTimeout := DefaultLockTimeout
	var path string
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, lockTimeoutFlagPrefix):
			d, err := time.ParseDuration(strings.TrimPrefix(a, lockTimeoutFlagPrefix))
			if err != nil || d < 0 {
				fmt.Fprintf(stderr, "journal check: bad %s\n", a)
				return ExitCheckUsage
			}
			lockTimeout = d
		case path == "" && !strings.HasPrefix(a, "-"):
			path = a
		default:
			fmt.Fprintf(stderr, "journal check: unexpected argument %q\nusage: check-file [--lock-timeout=DURATION] PATH\n", a)
			return ExitCheckUsage
		}
	}
	if path == "" {
		fmt.Fprintln(stderr, "journal check: missing PATH\nusage: check-file [--lock-timeout=DURATION] PATH")
		return ExitCheckUsage
	}
	fmt.Fprintf(stdout, "%s %s\n", checkStartMarker, path)
	err := CheckFile(path, lockTimeout)
	if err == nil {
		fmt.Fprintf(stdout, "%s %s\n", checkOKMarker, path)
		return ExitCheckOK
	}
	fmt.Fprintln(stderr, err)
	switch {
	case errors.Is(err, ErrCorrupt):
		return ExitCheckCorrupt
	case errors.Is(err, ErrLocked):
		return ExitCheckLocked
	case errors.Is(err, ErrSchemaTooNew):
		return ExitCheckSchemaTooNew
	}
	return ExitCheckFailed
}

// checkEnv is the check subprocess's environment: the agent's, without
// gofail's settings (GOFAIL_*), which only a failpoint build reads: a
// failpoint armed for the agent is not the check's, and the agent's gofail
// HTTP port is taken.
func checkEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "GOFAIL_") })
}

// CommandChecker returns a Checker that runs argv + ["--lock-timeout=D",
// path] as a subprocess (argv's command must call RunCheck) and maps its exit
// code to an error. A crash of the subprocess after it started checking
// (bbolt panics on a bad page; a truncated file faults) counts as corruption.
// Anything else that is not a clean result (a timeout, a missing command, a
// usage error, an unknown exit code) is an error that wraps none of the
// sentinels, so that a broken checker can never get a good file moved aside.
func CommandChecker(argv []string, lockTimeout, timeout time.Duration) Checker {
	argv = slices.Clone(argv)
	return func(ctx context.Context, path string) error {
		if len(argv) == 0 {
			return fmt.Errorf("journal: check %s: empty check command", path)
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		args := append(slices.Clone(argv[1:]), lockTimeoutFlagPrefix+lockTimeout.String(), path)
		cmd := exec.CommandContext(ctx, argv[0], args...)
		cmd.Env = checkEnv(os.Environ())
		var stdout, stderr limitedBuffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.WaitDelay = checkWaitDelay
		runErr := cmd.Run()

		out := func() string {
			return fmt.Sprintf("stdout: %q, stderr: %q", strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()))
		}
		started := strings.Contains(stdout.String(), checkStartMarker)
		var exitErr *exec.ExitError
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("journal: check %s: %w (%s)", path, ctx.Err(), out())
		case runErr == nil:
			if !strings.Contains(stdout.String(), checkOKMarker) {
				return fmt.Errorf("journal: check %s: %s exited 0 without confirming the check (%s)", path, argv[0], out())
			}
			return nil
		case !errors.As(runErr, &exitErr):
			return fmt.Errorf("journal: check %s: run %s: %w", path, argv[0], runErr)
		}
		detail := strings.TrimSpace(stderr.String())
		switch code := exitErr.ExitCode(); {
		case code == ExitCheckCorrupt:
			return childError(ErrCorrupt, path, detail)
		case code == ExitCheckLocked:
			return childError(ErrLocked, path, detail)
		case code == ExitCheckSchemaTooNew:
			return childError(ErrSchemaTooNew, path, detail)
		case started && (code == exitGoRuntimeFatal || crashSignal(exitErr)):
			return fmt.Errorf("%w: %s: the check crashed reading the file: %s", ErrCorrupt, path, firstLines(detail, 8))
		default:
			return fmt.Errorf("journal: check %s: %s: %w (%s)", path, argv[0], runErr, out())
		}
	}
}

// childError rebuilds the subprocess's error (its stderr) around sentinel.
func childError(sentinel error, path, detail string) error {
	if rest, ok := strings.CutPrefix(detail, sentinel.Error()); ok && strings.Contains(rest, path) {
		return fmt.Errorf("%w%s", sentinel, rest)
	}
	return fmt.Errorf("%w: %s: %s", sentinel, path, detail)
}

// crashSignal reports whether the process died of a memory fault, which a
// Go program gets when bbolt maps a truncated file.
func crashSignal(e *exec.ExitError) bool {
	ws, ok := e.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && (ws.Signal() == syscall.SIGBUS || ws.Signal() == syscall.SIGSEGV)
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[:n] // a panic's message comes first, the stack after
	}
	return strings.Join(lines, " | ")
}

// limitedBuffer keeps the first checkOutputLimit bytes written to it.
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := checkOutputLimit - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// InProcessChecker checks in the calling process. A bad data page can crash
// the process, so it is only for tests and tools that accept that; the agent
// uses CommandChecker.
func InProcessChecker(lockTimeout time.Duration) Checker {
	return func(_ context.Context, path string) error { return CheckFile(path, lockTimeout) }
}
