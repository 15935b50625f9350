package journal

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// RecordVersion is the value of the "v" field that this build writes into
// every record. It equals SchemaVersion: a change to any record format is a
// schema change (see doc.go).
const RecordVersion = SchemaVersion

// Stored enums. Every value is written to disk as a JSON number, so the
// numbers below are part of the on-disk format: never renumber, never reuse a
// retired number, never use iota.

// EventState is the engine's local state of an unfinished event.
type EventState uint8

const (
	EventClaimed   EventState = 1 // claimed, no step started yet
	EventRunning   EventState = 2 // steps in progress
	EventAborting  EventState = 3 // deadline passed or event deleted: running the driver's abort
	EventFinishing EventState = 4 // steps over: undoing owned changes, writing the end state
)

// StepPhase says whether a step record is written before acting or after.
type StepPhase uint8

const (
	PhaseIntent StepPhase = 1 // committed before the step acts
	PhaseDone   StepPhase = 2 // committed after the step acted (or was found done)
)

// StepState is the state of a step, as mirrored into status.steps.
type StepState uint8

const (
	StepPending StepState = 1
	StepRunning StepState = 2
	StepDone    StepState = 3
	StepFailed  StepState = 4
	StepSkipped StepState = 5
)

// Outcome is how a finished event ended. The first three mirror
// status.claimStatus; Cancelled is an event deleted while it ran.
type Outcome uint8

const (
	OutcomeSucceeded  Outcome = 1
	OutcomeFailed     Outcome = 2
	OutcomeSlaExpired Outcome = 3
	OutcomeCancelled  Outcome = 4
)

// OutboxKind is the kind of API write held in the outbox.
type OutboxKind uint8

const (
	OutboxEventStatus   OutboxKind = 1 // the status of a LifecycleEvent
	OutboxNodeCondition OutboxKind = 2 // conditions on the Node, on behalf of an event
)

// ChangeKind is the kind of a change the agent made and must undo.
type ChangeKind uint8

const (
	ChangeCordon     ChangeKind = 1 // spec.unschedulable on a Node
	ChangeAnnotation ChangeKind = 2 // one annotation on a Node
)

func (s EventState) String() string {
	return enumString(uint8(s), "Claimed", "Running", "Aborting", "Finishing")
}
func (p StepPhase) String() string { return enumString(uint8(p), "Intent", "Done") }
func (s StepState) String() string {
	return enumString(uint8(s), "Pending", "Running", "Done", "Failed", "Skipped")
}
func (o Outcome) String() string {
	return enumString(uint8(o), "Succeeded", "Failed", "SlaExpired", "Cancelled")
}
func (k OutboxKind) String() string { return enumString(uint8(k), "EventStatus", "NodeCondition") }
func (k ChangeKind) String() string { return enumString(uint8(k), "cordon", "annotation") }

func (s EventState) valid() bool { return s >= EventClaimed && s <= EventFinishing }
func (p StepPhase) valid() bool  { return p == PhaseIntent || p == PhaseDone }
func (s StepState) valid() bool  { return s >= StepPending && s <= StepSkipped }
func (o Outcome) valid() bool    { return o >= OutcomeSucceeded && o <= OutcomeCancelled }
func (k OutboxKind) valid() bool { return k == OutboxEventStatus || k == OutboxNodeCondition }
func (k ChangeKind) valid() bool { return k == ChangeCordon || k == ChangeAnnotation }

// enumString names value v, where names[0] is the name of 1.
func enumString(v uint8, names ...string) string {
	if v >= 1 && int(v) <= len(names) {
		return names[v-1]
	}
	return fmt.Sprintf("unknown(%d)", v)
}

// EventRecord is the snapshot of an unfinished event, key events/<UID>.
type EventRecord struct {
	V               int        `json:"v"` // record version; set by the journal
	UID             string     `json:"uid"`
	Name            string     `json:"name,omitempty"`
	Driver          string     `json:"driver,omitempty"`
	ResourceVersion string     `json:"resourceVersion,omitempty"`
	State           EventState `json:"state"`
	// Object is the LifecycleEvent as JSON, opaque to the journal.
	Object json.RawMessage `json:"object,omitempty"`
	// Attrs holds small engine-owned facts that must survive a restart
	// (for example the disruption-budget lease held, or the boot ID at claim).
	Attrs   map[string]string `json:"attrs,omitempty"`
	Updated time.Time         `json:"updated"` // set by the journal when zero
	// Notices are not part of the record: PutEvent queues them in the
	// notify bucket in the same transaction, so the message about a state
	// is queued exactly when the state is committed.
	Notices []Notice `json:"-"`
	// Steps and Owned are not part of the record either: PutEvent appends
	// the steps to the event's step log (as AppendStep does) and records
	// the changes (as AddOwned does) in the same transaction — an adopted
	// event's history rebuilt from the API is never half there.
	Steps []StepRecord `json:"-"`
	Owned []Change     `json:"-"`
}

// StepRecord is one entry of an event's step log, key steps/<UID>/<Seq>.
type StepRecord struct {
	V       int       `json:"v"`
	Seq     uint64    `json:"seq"` // position in the log; set by AppendStep
	Step    string    `json:"step"`
	Phase   StepPhase `json:"phase"`
	State   StepState `json:"state"`
	Attempt int       `json:"attempt"`
	BootID  string    `json:"bootID,omitempty"`
	At      time.Time `json:"at"` // set by the journal when zero
	Message string    `json:"message,omitempty"`
}

// OutboxEntry is one API write not yet accepted by the API server, key
// outbox/<Seq>.
type OutboxEntry struct {
	V    int        `json:"v"`
	Seq  uint64     `json:"seq"` // set by OutboxPush; grows with every push, never reused
	UID  string     `json:"uid"` // the event the write is about
	Kind OutboxKind `json:"kind"`
	// Payload is the full desired state (not a delta), opaque to the journal;
	// a newer entry with the same UID and Kind replaces an older one.
	Payload json.RawMessage `json:"payload"`
	Created time.Time       `json:"created"` // set by the journal when zero
}

// Change is something the agent changed and must undo, key owned/<Key()>.
type Change struct {
	V    int        `json:"v"`
	Kind ChangeKind `json:"kind"`
	Node string     `json:"node"`
	// Name is the annotation key; for a cordon, an optional owner that
	// keeps two owners' records of one node apart (e.g. "shutdown").
	Name string `json:"name,omitempty"`
	// Value is what the agent set; Previous what was there before (nil: absent).
	Value    string    `json:"value,omitempty"`
	Previous *string   `json:"previous,omitempty"`
	EventUID string    `json:"eventUID,omitempty"`
	At       time.Time `json:"at"` // set by the journal when zero
}

// Key identifies the change in the owned bucket: "<kind>/<node>[/<name>]".
func (c Change) Key() string {
	if c.Name == "" {
		return c.Kind.String() + "/" + c.Node
	}
	return c.Kind.String() + "/" + c.Node + "/" + c.Name
}

// HistoryRecord is a finished event, key history/<Seq>.
type HistoryRecord struct {
	V        int          `json:"v"`
	Seq      uint64       `json:"seq"`
	Event    EventRecord  `json:"event"`
	Outcome  Outcome      `json:"outcome"`
	Message  string       `json:"message,omitempty"`
	Finished time.Time    `json:"finished"`
	Steps    []StepRecord `json:"steps,omitempty"`
}

// errInvalidRecord is wrapped by every decoding error; it is itself wrapped
// in ErrCorrupt where a record is read from the file.
var errInvalidRecord = errors.New("invalid record")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalidRecord, fmt.Sprintf(format, args...))
}

func checkVersion(v int) error {
	if v != RecordVersion {
		return invalid("record version %d, want %d", v, RecordVersion)
	}
	return nil
}

func (r *EventRecord) validate() error {
	if err := checkVersion(r.V); err != nil {
		return err
	}
	if r.UID == "" {
		return invalid("event: empty uid")
	}
	if !r.State.valid() {
		return invalid("event %s: state %d out of range", r.UID, r.State)
	}
	return nil
}

func (r *StepRecord) validate() error {
	if err := checkVersion(r.V); err != nil {
		return err
	}
	switch {
	case r.Step == "":
		return invalid("step %d: empty step name", r.Seq)
	case !r.Phase.valid():
		return invalid("step %d (%s): phase %d out of range", r.Seq, r.Step, r.Phase)
	case !r.State.valid():
		return invalid("step %d (%s): state %d out of range", r.Seq, r.Step, r.State)
	case r.Attempt < 0:
		return invalid("step %d (%s): negative attempt %d", r.Seq, r.Step, r.Attempt)
	}
	return nil
}

func (e *OutboxEntry) validate() error {
	if err := checkVersion(e.V); err != nil {
		return err
	}
	switch {
	case e.UID == "":
		return invalid("outbox %d: empty uid", e.Seq)
	case !e.Kind.valid():
		return invalid("outbox %d: kind %d out of range", e.Seq, e.Kind)
	case len(e.Payload) == 0 || string(e.Payload) == "null":
		return invalid("outbox %d: empty payload", e.Seq)
	}
	return nil
}

func (c *Change) validate() error {
	if err := checkVersion(c.V); err != nil {
		return err
	}
	switch {
	case !c.Kind.valid():
		return invalid("change: kind %d out of range", c.Kind)
	case c.Node == "":
		return invalid("change %s: empty node", c.Kind)
	case c.Kind == ChangeAnnotation && c.Name == "":
		return invalid("change %s on %s: empty annotation name", c.Kind, c.Node)
	}
	return nil
}

func (h *HistoryRecord) validate() error {
	if err := checkVersion(h.V); err != nil {
		return err
	}
	if err := h.Event.validate(); err != nil {
		return fmt.Errorf("history %d: %w", h.Seq, err)
	}
	if !h.Outcome.valid() {
		return invalid("history %d: outcome %d out of range", h.Seq, h.Outcome)
	}
	for i := range h.Steps {
		if err := h.Steps[i].validate(); err != nil {
			return fmt.Errorf("history %d: %w", h.Seq, err)
		}
	}
	return nil
}

// decode unmarshals one JSON record. It never panics on bad input: garbage,
// truncation and wrong types all come back as errors wrapping errInvalidRecord.
func decode(b []byte, into any) error {
	if len(b) == 0 {
		return invalid("empty value")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(into); err != nil {
		return invalid("%v", err)
	}
	if dec.More() {
		return invalid("trailing data after the record")
	}
	return nil
}

func decodeEvent(key, b []byte) (EventRecord, error) {
	var r EventRecord
	if err := decode(b, &r); err != nil {
		return r, err
	}
	if err := r.validate(); err != nil {
		return r, err
	}
	if r.UID != string(key) {
		return r, invalid("event under key %q has uid %q", key, r.UID)
	}
	return r, nil
}

func decodeStep(key, b []byte) (StepRecord, error) {
	var r StepRecord
	seq, err := seqKey(key)
	if err != nil {
		return r, err
	}
	if err := decode(b, &r); err != nil {
		return r, err
	}
	if err := r.validate(); err != nil {
		return r, err
	}
	if r.Seq != seq {
		return r, invalid("step under key %d has seq %d", seq, r.Seq)
	}
	return r, nil
}

func decodeOutbox(key, b []byte) (OutboxEntry, error) {
	var e OutboxEntry
	seq, err := seqKey(key)
	if err != nil {
		return e, err
	}
	if err := decode(b, &e); err != nil {
		return e, err
	}
	if err := e.validate(); err != nil {
		return e, err
	}
	if e.Seq != seq {
		return e, invalid("outbox entry under key %d has seq %d", seq, e.Seq)
	}
	return e, nil
}

func decodeChange(key, b []byte) (Change, error) {
	var c Change
	if err := decode(b, &c); err != nil {
		return c, err
	}
	if err := c.validate(); err != nil {
		return c, err
	}
	if c.Key() != string(key) {
		return c, invalid("change under key %q has key %q", key, c.Key())
	}
	return c, nil
}

func decodeHistory(key, b []byte) (HistoryRecord, error) {
	var h HistoryRecord
	seq, err := seqKey(key)
	if err != nil {
		return h, err
	}
	if err := decode(b, &h); err != nil {
		return h, err
	}
	if err := h.validate(); err != nil {
		return h, err
	}
	if h.Seq != seq {
		return h, invalid("history record under key %d has seq %d", seq, h.Seq)
	}
	return h, nil
}

// encode validates r and marshals it. Validation on the way in keeps a bad
// record from ever reaching the file.
func encode(r interface{ validate() error }) ([]byte, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// seqBytes is the key for sequence number n: 8 bytes, big-endian, so that
// byte order is numeric order.
func seqBytes(n uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), n)
}

func seqKey(k []byte) (uint64, error) {
	if len(k) != 8 {
		return 0, invalid("sequence key of %d bytes, want 8", len(k))
	}
	n := binary.BigEndian.Uint64(k)
	if n == 0 {
		return 0, invalid("sequence key 0")
	}
	return n, nil
}
