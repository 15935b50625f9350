// Package journal is the agent's local, durable record of the work it does on
// this node, so that a crash, a reboot or a shutdown in the middle of a step
// resumes safely (DESIGN.md §4). It is a bbolt file, by default
// /var/lib/lifecycle-agent/journal.db, owned by one agent process at a time.
//
// # On-disk format (schema version 1)
//
// Top-level buckets, keys and values:
//
//	meta/schema              8 bytes, big-endian uint64: the schema version (1)
//	events/<event UID>       EventRecord: snapshot of an unfinished event (opaque
//	                         LifecycleEvent JSON, name, driver, resourceVersion,
//	                         local state, engine attributes)
//	steps/<event UID>/<seq>  StepRecord: the event's step log, one nested bucket
//	                         per event; intent and done records
//	outbox/<seq>             OutboxEntry: an API write not yet accepted
//	owned/<kind>/<node>[/<name>]
//	                         Change: something the agent changed and must undo
//	                         ("cordon/node-a", "annotation/node-a/<key>")
//	history/<seq>            HistoryRecord: a finished event with its steps;
//	                         at most Options.HistoryCap, the oldest dropped first
//	notify/<seq>             Notice: a message for people about an event, not yet
//	                         delivered to every notification target; optional
//	                         (created on first use, added without a version bump:
//	                         a build that predates it never reads it)
//
// <seq> is 8 bytes, big-endian uint64, from the bucket's NextSequence: byte
// order is numeric order, so a cursor walks a log oldest first and
// Cursor().Last() is the newest record. Sequences start at 1, are never
// reused, and survive Compact.
//
// Values are JSON objects. Every one carries "v", the record version (equal
// to the schema version that wrote it), and repeats its key where the key is
// derived (uid, seq, kind/node/name), so a value under the wrong key is
// detected. Enums (EventState, StepPhase, StepState, Outcome, OutboxKind,
// ChangeKind) are stored as JSON numbers; their values are explicitly
// numbered constants that are never renumbered or reused. Times are RFC 3339
// in UTC. Decoding validates every field it relies on and returns an error
// wrapping ErrCorrupt; it never panics (FuzzDecodeRecord).
//
// # Schema versions and migration
//
// SchemaVersion is the version this build reads and writes. Any change to the
// layout or to a record's format bumps it, with one exception: a new
// top-level bucket that no older reader looks at, created on first use and
// read as empty where it is missing (notify), is added within a version, so
// that a downgrade keeps the file. On Open:
//   - a file written by a newer agent is refused with an error wrapping
//     ErrSchemaTooNew that names the file and both versions, and the file is
//     left byte-for-byte untouched (it is read only through a read-only open);
//   - an older file is upgraded by the migrations table (schema.go), one
//     version at a time, all of them inside one write transaction: a failure
//     leaves the file as it was;
//   - a file without a meta bucket is version 0: empty (a fresh file) or the
//     unversioned prototype layout of the technical brief, which migration
//     "v0→v1" converts.
//
// To add version N: bump SchemaVersion, append a migration from N-1, keep the
// older ones, and add a fixture test like TestMigrateFromV0.
//
// # Durability
//
// The file is opened with Options.LockTimeout (bbolt's flock; a second
// opener gets ErrLocked instead of waiting forever) and never with NoSync:
// every write method is one bbolt transaction, and its data is on disk
// (fdatasync) when the method returns nil. Creating the file, moving it aside
// and compacting it fsync the directory. The engine's protocol for a step
// that acts on the world: AppendStep(PhaseIntent) → act → AppendStep(PhaseDone);
// on replay, the newest record (LastStep) of each unfinished event tells where
// to resume, and an intent without a done means "check whether it happened".
//
// # Corruption
//
// Open checks an existing file before using it, through Options.Checker. The
// default, CommandChecker, runs the check (CheckFile: bbolt's tx.Check, then
// decoding every record) in a subprocess, because tx.Check panics in a
// goroutine on a bad data page and a truncated file faults the mmap, either of
// which kills the process. The agent exposes RunCheck as the hidden command
// `lifecycle-agent journal check-file [--lock-timeout=D] PATH`, with exit codes
// ExitCheck*. A file judged corrupt (bad meta pages, garbage, truncation, a bad
// page, an undecodable record) is renamed to "<path>.corrupt-<UTC time>", e.g.
// journal.db.corrupt-20261130T101500Z, never reused, and reported in
// OpenReport.Corruption; a fresh journal is created, and the engine rebuilds
// what it can from the API server. A check that cannot run (a timeout, a
// missing command, a usage error) is an error, not corruption: Open fails
// closed and the file stays where it is.
//
// The check reads the whole file (about 60 ms per 1,000 history records of
// a drain event here), so the agent opens with Options.TrustCleanClose: a
// file exactly as the last Close left it (the marker "<path>.clean" names
// its inode, size and times) is not checked again. That is the common case —
// a stop, a package upgrade, a reboot — and starts fast at any size. A
// crash, a power cut, or any change to the file after the close leaves no
// marker or one that does not match, and the whole check runs. The marker is
// removed durably before the file is opened for writing; if the file is bad
// after all (bit rot after a clean close) and the agent dies on it, systemd
// restarts it and that start checks the file and moves it aside.
//
// One bad meta page alone is not corruption: it is what a torn meta write
// leaves, bbolt reads the other one, and the next commit (Open always
// commits) rewrites it. tx.Check asserts on both meta pages, so CheckFile
// then checks a temporary copy with the good page in both slots. If the bad
// page was the newer one, the last commit is lost, as after a torn write; the
// intent-before-act protocol makes that safe.
//
// # Crash boundaries (gofail)
//
// The write methods carry gofail failpoints, inert comments until
// `gofail enable` turns them into code (go.etcd.io/gofail). "Before" points
// run inside the transaction, after its writes and before its commit; "after"
// points run once the commit is durable:
//
//	journalBeforeStepIntentCommit  journalAfterStepIntentCommit   AppendStep, PhaseIntent
//	journalBeforeStepDoneCommit    journalAfterStepDoneCommit     AppendStep, PhaseDone
//	journalBeforeOutboxCommit      journalAfterOutboxCommit       OutboxPush
//	journalBeforeEventCommit       journalAfterEventCommit        PutEvent
//	journalBeforeFinishCommit      journalAfterFinishCommit       FinishEvent
//	journalBeforeOwnedCommit       journalAfterOwnedCommit        AddOwned
//
// For example GOFAIL_FAILPOINTS='journalAfterStepIntentCommit=panic("crash")'
// kills the process right after an intent became durable. TestCrashBoundaries
// runs each of them when the package is built with failpoints enabled.
//
// # Offline tools
//
// Verify, Export and Compact back `lifecycle-agent journal verify|export|compact`
// on a stopped agent; they fail with ErrLocked while the agent runs.
package journal
