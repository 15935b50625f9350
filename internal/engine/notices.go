package engine

import (
	"fmt"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// Notifications (notifications.urls): the engine queues a notice for people
// when it claims an event, when a step fails it, and when it ends. A notice
// rides in the journal transaction that commits the state it reports
// (snapshot), so it is queued exactly once: a crash before the commit
// loses both, one after keeps both, and a replay of that state (which
// snapshots again) has nothing left to queue. internal/notify delivers
// them, asynchronously: queueing costs no more than the commit it joins,
// and nothing the engine does waits for a delivery.

// note queues a notice of kind about a with the next snapshot of a (no-op
// when notifications are off).
func (e *Engine) note(a *active, kind journal.NoticeKind, text string) {
	if e.cfg.Notices == nil {
		return
	}
	a.notices = append(a.notices, journal.Notice{UID: a.uid, Event: a.name, Kind: kind,
		Title: "lifecycle-agent: node " + e.cfg.Node, Text: truncate(text)})
}

// noticesCommitted runs after a snapshot committed a's pending notices.
func (e *Engine) noticesCommitted(a *active) {
	if len(a.notices) == 0 {
		return
	}
	a.notices = nil
	e.cfg.Notices()
}

// claimedText is the notice of a claim (or of an adoption: an event the
// agent had claimed before a crash that lost the journal's record of it).
func (e *Engine) claimedText(a *active) string {
	return fmt.Sprintf("node %s: event %s claimed (%s, transition %s: %s → %s)", e.cfg.Node, a.name,
		a.driver.Short(), a.tn, a.status.Driver.Start, a.status.Driver.End)
}

// endedText is the notice of an end state.
func (e *Engine) endedText(a *active, cs string, msg string, now time.Time) string {
	took := ""
	if c := a.status.Holder; c != nil && c.ClaimTime != nil && !c.ClaimTime.IsZero() {
		took = fmt.Sprintf(" (%s after the claim)", now.Sub(c.ClaimTime.Time).Round(time.Second))
	}
	return fmt.Sprintf("node %s: event %s %s: %s%s", e.cfg.Node, a.name, cs, msg, took)
}
