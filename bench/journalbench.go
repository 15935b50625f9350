package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// JournalStats are JournalEvents' measurements.
type JournalStats struct {
	Events         int             `json:"events"`
	TimedEvents    int             `json:"timedEvents"`
	CommitsPerEvt  int             `json:"commitsPerEvent"`
	Commit         Dist            `json:"commit"`         // every commit, as ObserveCommit sees it
	ByKind         map[string]Dist `json:"byKind"`         // each write method, wall time of the call
	SizeAt         map[int]int64   `json:"sizeAtEvents"`   // file size after that many events
	BeforeCompact  int64           `json:"beforeCompact"`  // after Events events
	AfterCompact   int64           `json:"afterCompact"`   // after journal.Compact
	History        int             `json:"history"`        // records kept (HistoryCap)
	CompactSeconds float64         `json:"compactSeconds"` // Compact's run time (its check in a subprocess included)
}

// JournalEvents writes events drain events through the journal as the
// engine does (snapshot, node condition, per step intent → status → done →
// status, owned cordon, finishing snapshot and statuses, every outbox entry
// acknowledged as the flusher would, history) with the default history cap.
// The first timed events run in dir, on the real disk, and every commit is
// timed; the rest run on tmpfs (/dev/shm) when it exists, because only the
// file's size is measured there and each commit costs an fdatasync on
// disk. Then the file is compacted with journal.Compact.
func JournalEvents(ctx context.Context, dir string, events, timed int, check []string, say func(string, ...any)) (JournalStats, error) {
	st := JournalStats{Events: events, TimedEvents: min(timed, events), ByKind: map[string]Dist{}, SizeAt: map[int]int64{}, History: journal.DefaultHistoryCap}
	path := filepath.Join(dir, "journal.db")
	var commits []time.Duration
	byKind := map[string][]time.Duration{}
	timing := true
	open := func(p string) (*journal.Journal, error) {
		j, _, err := journal.Open(ctx, p, journal.Options{CheckCommand: check, ObserveCommit: func(d time.Duration) {
			if timing {
				commits = append(commits, d)
			}
		}})
		return j, err
	}
	j, err := open(path)
	if err != nil {
		return st, err
	}
	status, err := json.Marshal(sampleEvent("x", "y", "bench-journal").Status)
	if err != nil {
		return st, err
	}
	nodeCond := []byte(`{"conditions":[{"type":"LifecycleTransition","status":"True","reason":"DrainStarted","message":"Lifecycle Transition 'bench-journal-drain' (event drain-bench-journal-000001)"},{"type":"DrainInProgress","status":"True","reason":"DrainStarted","message":"…"},{"type":"Drained","status":"False","reason":"DrainStarted","message":"…"}]}`)
	do := func(kind string, f func() error) error {
		t0 := time.Now()
		err := f()
		if timing {
			byKind[kind] = append(byKind[kind], time.Since(t0))
		}
		return err
	}
	onTmpfs := false
	n0 := 0
	for i := 0; i < events; i++ {
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		if i == st.TimedEvents && !onTmpfs && i < events {
			timing = false
			if shm, err := os.MkdirTemp("/dev/shm", "lcb-journal-"); err == nil {
				if err := j.Close(); err != nil {
					return st, err
				}
				np := filepath.Join(shm, "journal.db")
				if err := copyFile(path, np); err != nil {
					return st, err
				}
				defer os.RemoveAll(shm)
				path, onTmpfs = np, true
				if j, err = open(path); err != nil {
					return st, err
				}
				say("journal: %d events timed on disk; the other %d run on tmpfs (size only)", i, events-i)
			}
		}
		uid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		name := fmt.Sprintf("drain-bench-journal-%06d", i)
		raw, err := json.Marshal(sampleEvent(name, uid, "bench-journal"))
		if err != nil {
			return st, err
		}
		rec := journal.EventRecord{UID: uid, Name: name, Driver: "lifecycle-agent.x-k8s.io/drain", ResourceVersion: fmt.Sprint(1000 + i),
			State: journal.EventClaimed, Object: raw, Attrs: map[string]string{"transition": "bench-journal-drain"}}
		c0 := len(commits)
		push := func(kind journal.OutboxKind, payload []byte) error {
			var seq uint64
			if err := do("OutboxPush", func() error {
				var err error
				seq, err = j.OutboxPush(journal.OutboxEntry{UID: uid, Kind: kind, Payload: payload})
				return err
			}); err != nil {
				return err
			}
			return do("OutboxAck", func() error { return j.OutboxAck(seq) })
		}
		steps := []string{"cordon", "evict", "wait-empty"}
		err = func() error {
			if err := do("PutEvent", func() error { return j.PutEvent(rec) }); err != nil {
				return err
			}
			if err := push(journal.OutboxNodeCondition, nodeCond); err != nil {
				return err
			}
			rec.State = journal.EventRunning
			if err := do("PutEvent", func() error { return j.PutEvent(rec) }); err != nil {
				return err
			}
			for _, s := range steps {
				if err := do("AppendStep", func() error {
					_, err := j.AppendStep(uid, journal.StepRecord{Step: s, Phase: journal.PhaseIntent, State: journal.StepRunning, Attempt: 1, BootID: "0b8d5a36-3c1e-4bbd-8f0e-4e2c2f3b9c1d"})
					return err
				}); err != nil {
					return err
				}
				if err := push(journal.OutboxEventStatus, status); err != nil {
					return err
				}
				if s == "cordon" {
					if err := do("AddOwned", func() error {
						_, err := j.AddOwned(journal.Change{Kind: journal.ChangeCordon, Node: "bench-journal", EventUID: uid, Value: name})
						return err
					}); err != nil {
						return err
					}
				}
				if err := do("AppendStep", func() error {
					_, err := j.AppendStep(uid, journal.StepRecord{Step: s, Phase: journal.PhaseDone, State: journal.StepDone, Attempt: 1, BootID: "0b8d5a36-3c1e-4bbd-8f0e-4e2c2f3b9c1d"})
					return err
				}); err != nil {
					return err
				}
				if err := push(journal.OutboxEventStatus, status); err != nil {
					return err
				}
			}
			rec.State = journal.EventFinishing
			if err := do("PutEvent", func() error { return j.PutEvent(rec) }); err != nil {
				return err
			}
			if err := push(journal.OutboxEventStatus, status); err != nil {
				return err
			}
			if err := push(journal.OutboxNodeCondition, nodeCond); err != nil {
				return err
			}
			if err := do("FinishEvent", func() error {
				return j.FinishEvent(uid, journal.OutcomeSucceeded, "transition DrainStarted → DrainComplete complete")
			}); err != nil {
				return err
			}
			// The uncordon that follows a drain disowns the cordon.
			return do("RemoveOwned", func() error {
				return j.RemoveOwned(journal.Change{Kind: journal.ChangeCordon, Node: "bench-journal"}.Key())
			})
		}()
		if err != nil {
			return st, fmt.Errorf("bench: journal event %d: %w", i, err)
		}
		if i == 0 {
			n0 = len(commits) - c0
		}
		if n := i + 1; n == 1 || n == 100 || n%1000 == 0 || n == events {
			if fi, err := os.Stat(path); err == nil {
				st.SizeAt[n] = fi.Size()
			}
			if n%1000 == 0 {
				say("journal: %d/%d events, %.1f MiB", n, events, float64(st.SizeAt[n])/(1<<20))
			}
		}
	}
	st.CommitsPerEvt = n0
	if err := j.Close(); err != nil {
		return st, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return st, err
	}
	st.BeforeCompact = fi.Size()
	t0 := time.Now()
	res, err := journal.Compact(ctx, path, journal.Options{CheckCommand: check})
	if err != nil {
		return st, err
	}
	st.CompactSeconds = time.Since(t0).Seconds()
	st.AfterCompact = res.AfterBytes
	st.Commit = Summarize(commits)
	kinds := make([]string, 0, len(byKind))
	for k := range byKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		st.ByKind[k] = Summarize(byKind[k])
	}
	return st, nil
}
