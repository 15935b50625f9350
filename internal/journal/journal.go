package journal

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"k8s.io/utils/clock"
)

// Sentinel errors. Match them with errors.Is; the messages around them name
// the file and the operation.
var (
	// ErrLocked: another process holds the journal (bbolt's file lock) for
	// longer than Options.LockTimeout.
	ErrLocked = errors.New("journal: locked by another process")
	// ErrSchemaTooNew: the file was written by a newer agent. It is left
	// byte-for-byte untouched.
	ErrSchemaTooNew = errors.New("journal: schema too new")
	// ErrCorrupt: the file failed its integrity check or holds a record that
	// does not decode.
	ErrCorrupt = errors.New("journal: corrupt")
	// ErrUnknownEvent: the event UID has no snapshot in the journal.
	ErrUnknownEvent = errors.New("journal: unknown event")
	// ErrClosed: the Journal was closed.
	ErrClosed = errors.New("journal: closed")
)

// Defaults for Options.
const (
	DefaultLockTimeout  = 5 * time.Second  // bbolt's default of 0 would wait forever
	DefaultCheckTimeout = 60 * time.Second // integrity-check subprocess, whole run
	DefaultHistoryCap   = 100              // finished events kept
	fileMode            = 0o600
)

// Checker checks the integrity of the journal file at path without risking
// the calling process (see CommandChecker). It returns nil for a healthy
// file, or an error wrapping ErrCorrupt, ErrLocked or ErrSchemaTooNew; any
// other error means the check itself could not be done, and Open fails
// closed without touching the file.
type Checker func(ctx context.Context, path string) error

// Options configure Open and the offline tools. The zero value is usable
// except that opening an existing file needs Checker or CheckCommand.
type Options struct {
	// LockTimeout bounds the wait for bbolt's file lock. Zero: DefaultLockTimeout.
	LockTimeout time.Duration
	// Checker checks an existing file before it is opened. Nil: CommandChecker
	// on CheckCommand.
	Checker Checker
	// CheckCommand is the argv prefix of the integrity-check subprocess, e.g.
	// {"/usr/bin/lifecycle-agent", "journal", "check-file"}; the checker appends
	// "--lock-timeout=<LockTimeout>" and the path, and the command must run
	// RunCheck on those arguments.
	CheckCommand []string
	// CheckTimeout bounds one run of the check subprocess. Zero: DefaultCheckTimeout.
	CheckTimeout time.Duration
	// HistoryCap is the number of finished events kept; the oldest is dropped
	// first. Zero: DefaultHistoryCap. Negative is an error.
	HistoryCap int
	// Clock stamps records and names corrupt files. Nil: the real clock.
	Clock clock.PassiveClock
	// TrustCleanClose skips the check subprocess when the file is exactly as
	// this package's Close left it (see cleanMarker): a journal closed
	// cleanly by a stopped agent opens in milliseconds at any size, while one
	// left by a crash, a power cut or another writer is checked in full. The
	// marker is removed before the file is opened for writing, so if the
	// file turns out to be bad, the next start checks it.
	TrustCleanClose bool
	// ObserveCommit, if set, receives the duration of every committed write
	// transaction (the agent feeds a Prometheus histogram from it).
	ObserveCommit func(time.Duration)
}

func (o Options) withDefaults() (Options, error) {
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.LockTimeout < 0 {
		return o, fmt.Errorf("journal: negative LockTimeout %v", o.LockTimeout)
	}
	if o.CheckTimeout == 0 {
		o.CheckTimeout = DefaultCheckTimeout
	}
	if o.HistoryCap == 0 {
		o.HistoryCap = DefaultHistoryCap
	}
	if o.HistoryCap < 0 {
		return o, fmt.Errorf("journal: negative HistoryCap %d", o.HistoryCap)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Checker == nil && len(o.CheckCommand) > 0 {
		o.Checker = CommandChecker(o.CheckCommand, o.LockTimeout, o.CheckTimeout)
	}
	return o, nil
}

func (o Options) check(ctx context.Context, path string) error {
	if o.Checker == nil {
		return fmt.Errorf("journal: cannot check %s: neither Options.Checker nor Options.CheckCommand is set", path)
	}
	return o.Checker(ctx, path)
}

// OpenReport says what Open found and did; the caller logs it.
type OpenReport struct {
	Path string
	// Created: a new file was created (first start, or after a corrupt file
	// was moved aside).
	Created bool
	// FoundSchema is the schema version on disk before Open; 0 for a new file.
	FoundSchema int
	// SchemaVersion is the version now on disk (SchemaVersion).
	SchemaVersion int
	// Migrations names the migrations applied, oldest first.
	Migrations []string
	// Corruption is set when the file failed its check and was moved aside.
	Corruption *Corruption
	// CleanClose: the file was as the last Close left it, so the check was
	// skipped (Options.TrustCleanClose).
	CleanClose bool
}

// Corruption describes a journal file that was moved aside.
type Corruption struct {
	Path    string // where the journal was
	MovedTo string // where the corrupt file is now, kept for inspection
	Err     error  // why it was judged corrupt; wraps ErrCorrupt
}

func (c *Corruption) String() string {
	return fmt.Sprintf("journal %s is corrupt and was moved to %s: %v", c.Path, c.MovedTo, c.Err)
}

// Journal is an open journal file. Its methods are safe for concurrent use;
// every write is one bbolt transaction, durable (fdatasync) when it returns.
type Journal struct {
	db         *bolt.DB
	path       string
	clock      clock.PassiveClock
	observe    func(time.Duration)
	historyCap int
}

// Open opens the journal at path, creating it (and fsyncing its directory)
// if it does not exist. An existing file is first checked by opts.Checker in
// a separate process:
//   - corrupt: it is moved to "<path>.corrupt-<UTC time>", reported in
//     OpenReport.Corruption, and a fresh journal is created;
//   - written by a newer agent: Open returns an error wrapping
//     ErrSchemaTooNew and leaves the file untouched;
//   - held by another process: an error wrapping ErrLocked;
//   - an older schema: it is migrated in one transaction.
//
// Any other failure, including a checker that could not run, returns an error
// and leaves the file as it was (fail closed).
func Open(ctx context.Context, path string, opts Options) (*Journal, *OpenReport, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, nil, err
	}
	rep := &OpenReport{Path: path, SchemaVersion: SchemaVersion}

	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		rep.Created = true
	case err != nil:
		return nil, nil, fmt.Errorf("journal: open %s: %w", path, err)
	case !fi.Mode().IsRegular():
		return nil, nil, fmt.Errorf("journal: open %s: not a regular file (%v)", path, fi.Mode().Type())
	case fi.Size() == 0:
		// bbolt creates the file before writing its first pages: a crash
		// in between leaves an empty file, which is a new journal.
		rep.Created = true
	case opts.TrustCleanClose && cleanlyClosed(path, fi):
		rep.CleanClose = true
		if err := dropCleanMarker(path); err != nil {
			return nil, nil, err
		}
		found, err := peekSchema(path, opts.LockTimeout)
		if err != nil {
			return nil, nil, err
		}
		if found > SchemaVersion {
			return nil, nil, schemaTooNew(path, found)
		}
		rep.FoundSchema = found
	default:
		_ = dropCleanMarker(path)
		cerr := opts.check(ctx, path)
		switch {
		case cerr == nil, errors.Is(cerr, ErrSchemaTooNew):
			// Read the version here in both cases: the message of a too-new
			// file names both versions, and a checker that let a newer
			// file through must not lead to opening it for writing.
			found, err := peekSchema(path, opts.LockTimeout)
			if err != nil {
				return nil, nil, err
			}
			if found > SchemaVersion {
				return nil, nil, schemaTooNew(path, found)
			}
			if cerr != nil {
				return nil, nil, cerr
			}
			rep.FoundSchema = found
		case errors.Is(cerr, ErrCorrupt):
			movedTo, err := moveAside(path, opts.Clock.Now())
			if err != nil {
				return nil, nil, fmt.Errorf("journal: %s is corrupt (%v) and could not be moved aside: %w", path, cerr, err)
			}
			rep.Corruption = &Corruption{Path: path, MovedTo: movedTo, Err: cerr}
			rep.Created = true
		default:
			return nil, nil, cerr
		}
	}

	db, file, err := boltOpen(path, &bolt.Options{Timeout: opts.LockTimeout})
	if err != nil {
		return nil, nil, err
	}
	j := &Journal{db: db, path: path, clock: opts.Clock, observe: opts.ObserveCommit, historyCap: opts.HistoryCap}
	if err := j.setUp(rep, file); err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return j, rep, nil
}

// setUp runs on a freshly opened file: it makes a new file's directory entry
// durable, guards against the file having been replaced while Open waited for
// the lock, and brings the schema up to date.
func (j *Journal) setUp(rep *OpenReport, file *os.File) error {
	if rep.Created {
		if err := syncDir(filepath.Dir(j.path)); err != nil {
			return fmt.Errorf("journal: create %s: %w", j.path, err)
		}
	}
	// A compaction or a move-aside renames over or away from the path; if
	// that happened while we waited for the lock, we hold the old inode.
	held, err := file.Stat()
	if err != nil {
		return fmt.Errorf("journal: open %s: %w", j.path, err)
	}
	now, err := os.Stat(j.path)
	if err != nil || !os.SameFile(held, now) {
		return fmt.Errorf("journal: open %s: the file was replaced while waiting for its lock; open it again", j.path)
	}

	return j.update(func(tx *bolt.Tx) error {
		found, empty, err := schemaVersion(tx)
		if err != nil {
			return fmt.Errorf("%s: %w", j.path, err)
		}
		switch {
		case found > SchemaVersion:
			return schemaTooNew(j.path, found)
		case found == SchemaVersion:
			rep.FoundSchema = found
			return nil
		case empty:
			rep.FoundSchema = 0
			return initCurrent(tx)
		}
		rep.FoundSchema = found
		rep.Migrations, err = upgrade(tx, found, j.clock.Now().UTC())
		if err != nil {
			return fmt.Errorf("%s: %w", j.path, err)
		}
		return nil
	})
}

func schemaTooNew(path string, found int) error {
	return fmt.Errorf("%w: %s has schema version %d, this agent supports up to %d; run a newer agent or move the file aside",
		ErrSchemaTooNew, path, found, SchemaVersion)
}

// peekSchema reads the schema version with a read-only open, which takes a
// shared lock and never writes to the file.
func peekSchema(path string, lockTimeout time.Duration) (int, error) {
	db, err := openReadOnly(path, lockTimeout)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var v int
	err = db.View(func(tx *bolt.Tx) error {
		var err error
		v, _, err = schemaVersion(tx)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("journal: read schema version of %s: %w", path, err)
	}
	return v, nil
}

func openReadOnly(path string, lockTimeout time.Duration) (*bolt.DB, error) {
	db, _, err := boltOpen(path, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	return db, err
}

// boltOpen opens path with bbolt and also returns the *os.File bbolt holds
// (for Stat; bbolt owns and closes it). A lock timeout wraps ErrLocked.
func boltOpen(path string, o *bolt.Options) (*bolt.DB, *os.File, error) {
	var file *os.File
	o.OpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
		file = f
		return f, err
	}
	db, err := bolt.Open(path, fileMode, o)
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, nil, fmt.Errorf("%w: %s (waited %v): %w", ErrLocked, path, o.Timeout, err)
	case err != nil && o.ReadOnly:
		return nil, nil, fmt.Errorf("journal: open %s read-only: %w", path, err)
	case err != nil:
		return nil, nil, fmt.Errorf("journal: open %s: %w", path, err)
	}
	return db, file, nil
}

// Path returns the file the journal was opened from.
func (j *Journal) Path() string { return j.path }

// Close closes the file. It is safe to call more than once.
func (j *Journal) Close() error {
	if err := j.db.Close(); err != nil {
		return fmt.Errorf("journal: close %s: %w", j.path, err)
	}
	if err := writeCleanMarker(j.path); err != nil {
		return fmt.Errorf("journal: close %s: %w", j.path, err)
	}
	return nil
}

// errNoChange, returned by an update's function, rolls back a transaction
// that has nothing to write, saving the commit's fsync.
var errNoChange = errors.New("no change")

// update runs fn in a write transaction and reports the commit's duration.
func (j *Journal) update(fn func(tx *bolt.Tx) error) error {
	start := j.clock.Now()
	err := j.db.Update(fn)
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	if err == nil && j.observe != nil {
		j.observe(j.clock.Since(start))
	}
	return err
}

func (j *Journal) view(fn func(tx *bolt.Tx) error) error {
	err := j.db.View(fn)
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// corruptf wraps a decoding error found in the open file.
func (j *Journal) corruptf(err error, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s: %w", ErrCorrupt, j.path, fmt.Sprintf(format, args...), err)
}
