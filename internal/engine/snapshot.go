package engine

import (
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// Snapshot is what `lifecycle-agent status` shows.
type Snapshot struct {
	Node     string         `json:"node"`
	Identity string         `json:"identity"`
	State    string         `json:"state"`
	Drivers  []string       `json:"drivers"`
	Event    *EventSnapshot `json:"event,omitempty"`
	API      APISnapshot    `json:"api"`
	Outbox   int            `json:"outboxDepth"`
	// Unfinished counts the journal's unfinished events, the local ones
	// (a shutdown, a queued request) included.
	Unfinished int                   `json:"unfinished"`
	History    []HistorySnapshotItem `json:"history,omitempty"`
}

// APISnapshot says whether the agent hears from the API server (see
// apiclient.Contact): a deaf agent shows here before anyone misses a claim.
type APISnapshot struct {
	Reachable bool `json:"reachable"`
	// LastHeard is the last response or watch byte from the server (RFC 3339, "" never).
	LastHeard string `json:"lastHeard,omitempty"`
	// UnreachableSince is the first failed request after LastHeard.
	UnreachableSince string `json:"unreachableSince,omitempty"`
	LastError        string `json:"lastError,omitempty"`
	// WatchSynced: the event watch has listed this node's events at least once.
	WatchSynced bool `json:"watchSynced"`
}

// EventSnapshot is the event being run.
type EventSnapshot struct {
	Name        string                `json:"name"`
	Driver      string                `json:"driver"`
	ClaimStatus string                `json:"claimStatus"`
	CurrentStep string                `json:"currentStep,omitempty"`
	Message     string                `json:"message,omitempty"`
	Deadline    string                `json:"deadline,omitempty"`
	Steps       []v1alpha1.StepStatus `json:"steps"`
}

// HistorySnapshotItem is one finished event from the journal.
type HistorySnapshotItem struct {
	Name     string `json:"name"`
	Driver   string `json:"driver"`
	Outcome  string `json:"outcome"`
	Finished string `json:"finished"`
	Message  string `json:"message,omitempty"`
}

// Snapshot returns the engine's state for the control socket.
func (e *Engine) Snapshot() Snapshot {
	s := Snapshot{Node: e.cfg.Node, Identity: e.cfg.Identity, State: e.State()}
	c := e.cfg.API.Contact()
	s.API = APISnapshot{Reachable: c.Reachable, LastHeard: rfc3339(c.LastHeard), UnreachableSince: rfc3339(c.UnreachableSince)}
	if !c.Reachable {
		s.API.LastError = c.LastError
	}
	e.mu.Lock()
	if e.watch != nil {
		s.API.WatchSynced = e.watch.Synced()
	}
	e.mu.Unlock()
	for _, d := range e.driverList() {
		s.Drivers = append(s.Drivers, d.Name())
	}
	e.mu.Lock()
	a := e.current
	e.mu.Unlock()
	if a != nil {
		a.statusMu.Lock()
		es := &EventSnapshot{Name: a.name, Driver: a.driver.Name(), ClaimStatus: string(a.status.ClaimStatus),
			CurrentStep: a.status.CurrentStep, Message: a.status.Message, Steps: append([]v1alpha1.StepStatus(nil), a.status.Steps...)}
		a.statusMu.Unlock()
		if !a.deadline.IsZero() {
			es.Deadline = a.deadline.UTC().Format("2006-01-02T15:04:05Z")
		}
		s.Event = es
	}
	if p, err := e.cfg.Journal.OutboxPending(); err == nil {
		s.Outbox = len(p)
	}
	if recs, err := e.cfg.Journal.Events(); err == nil {
		s.Unfinished = len(recs)
	}
	if h, err := e.cfg.Journal.History(); err == nil {
		for i := len(h) - 1; i >= 0 && len(s.History) < 10; i-- {
			s.History = append(s.History, HistorySnapshotItem{Name: h[i].Event.Name, Driver: h[i].Event.Driver,
				Outcome: h[i].Outcome.String(), Finished: h[i].Finished.UTC().Format("2006-01-02T15:04:05Z"), Message: h[i].Message})
		}
	}
	return s
}

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}
