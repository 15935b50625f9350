package engine

import (
	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// Snapshot is what `lifecycle-agent status` shows.
type Snapshot struct {
	Node     string                `json:"node"`
	Identity string                `json:"identity"`
	State    string                `json:"state"`
	Drivers  []string              `json:"drivers"`
	Event    *EventSnapshot        `json:"event,omitempty"`
	Outbox   int                   `json:"outboxDepth"`
	History  []HistorySnapshotItem `json:"history,omitempty"`
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
	for _, d := range e.cfg.Drivers {
		s.Drivers = append(s.Drivers, d.Name())
	}
	e.mu.Lock()
	a := e.current
	e.mu.Unlock()
	if a != nil {
		es := &EventSnapshot{Name: a.name, Driver: a.driver.Name(), ClaimStatus: string(a.status.ClaimStatus),
			CurrentStep: a.status.CurrentStep, Message: a.status.Message, Steps: append([]v1alpha1.StepStatus(nil), a.status.Steps...)}
		if !a.deadline.IsZero() {
			es.Deadline = a.deadline.UTC().Format("2006-01-02T15:04:05Z")
		}
		s.Event = es
	}
	if p, err := e.cfg.Journal.OutboxPending(); err == nil {
		s.Outbox = len(p)
	}
	if h, err := e.cfg.Journal.History(); err == nil {
		for i := len(h) - 1; i >= 0 && len(s.History) < 10; i-- {
			s.History = append(s.History, HistorySnapshotItem{Name: h[i].Event.Name, Driver: h[i].Event.Driver,
				Outcome: h[i].Outcome.String(), Finished: h[i].Finished.UTC().Format("2006-01-02T15:04:05Z"), Message: h[i].Message})
		}
	}
	return s
}
