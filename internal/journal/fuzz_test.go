package journal

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// Record kinds for FuzzDecodeRecord and TestDecodeRejects.
const (
	recEvent   uint8 = 0 // test-only selectors, never stored
	recStep    uint8 = 1
	recOutbox  uint8 = 2
	recChange  uint8 = 3
	recHistory uint8 = 4
	recNotice  uint8 = 5
	recRequest uint8 = 6
	recGPU     uint8 = 7
	recKinds   uint8 = 8
)

func decodeAny(kind uint8, key, value []byte) (interface{ validate() error }, error) {
	switch kind % recKinds {
	case recEvent:
		r, err := decodeEvent(key, value)
		return &r, err
	case recStep:
		r, err := decodeStep(key, value)
		return &r, err
	case recOutbox:
		r, err := decodeOutbox(key, value)
		return &r, err
	case recChange:
		r, err := decodeChange(key, value)
		return &r, err
	case recNotice:
		r, err := decodeNotice(key, value)
		return &r, err
	case recRequest:
		r, err := decodeRequest(key, value)
		return &r, err
	case recGPU:
		r, err := decodeGPUHealth(key, value)
		return &r, err
	default:
		r, err := decodeHistory(key, value)
		return &r, err
	}
}

type seedRecord struct {
	kind  uint8
	key   []byte
	value any
}

func seedRecords() []seedRecord {
	at := time.Date(2026, 11, 30, 10, 15, 0, 0, time.UTC)
	ev := testEvent("uid-a")
	ev.V, ev.Updated, ev.Attrs = RecordVersion, at, map[string]string{"k": "v"}
	step := StepRecord{V: RecordVersion, Seq: 3, Step: "reboot", Phase: PhaseIntent, State: StepRunning, Attempt: 2, BootID: "b", At: at, Message: "m"}
	prev := "p"
	return []seedRecord{
		{recEvent, []byte("uid-a"), ev},
		{recStep, seqBytes(3), step},
		{recOutbox, seqBytes(7), OutboxEntry{V: RecordVersion, Seq: 7, UID: "uid-a", Kind: OutboxNodeCondition, Payload: json.RawMessage(`{"type":"LifecycleTransition"}`), Created: at}},
		{recChange, []byte("annotation/node-a/x.io/y"), Change{V: RecordVersion, Kind: ChangeAnnotation, Node: "node-a", Name: "x.io/y", Value: "1", Previous: &prev, At: at}},
		{recChange, []byte("cordon/node-a"), Change{V: RecordVersion, Kind: ChangeCordon, Node: "node-a", At: at}},
		{recNotice, seqBytes(9), Notice{V: RecordVersion, Seq: 9, UID: "uid-a", Event: "reboot-1", Kind: NoticeEnded, Text: "reboot-1 Succeeded", Sent: []string{"a1b2"}, Attempts: 1, Created: at}},
		{recRequest, []byte("gpu-reset/GPU-1"), AutoRequest{V: RecordVersion, Key: "gpu-reset/GPU-1", Event: "n-gpu-reset-1-2", Group: "auto-gpu-reset",
			Object: json.RawMessage(`{"metadata":{"name":"n-gpu-reset-1-2"}}`), Published: true, Outcome: RequestFailed, Counted: true, Created: at, Updated: at}},
		{recGPU, []byte("state"), GPUHealthState{V: RecordVersion, Boot: "5e4d3c2b-1a09-4f8e-9d7c-6b5a4f3e2d1c", KernelLogSeq: 4711,
			XIDs: map[string][]uint64{"GPU-1": {48, 79}}, Updated: at}},
		{recHistory, seqBytes(1), HistoryRecord{V: RecordVersion, Seq: 1, Event: ev, Outcome: OutcomeFailed, Message: "x", Finished: at, Steps: []StepRecord{step}}},
	}
}

// FuzzDecodeRecord feeds arbitrary keys and values to the record decoders:
// they must never panic, and a record they accept must encode again and
// decode to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range seedRecords() {
		b, err := json.Marshal(s.value)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(s.kind, s.key, b)
	}
	f.Add(recStep, []byte{1}, []byte(`{}`))
	f.Add(recEvent, []byte("u"), []byte(`{"v":1,"uid":"u","state":1} {}`))
	f.Fuzz(func(t *testing.T, kind uint8, key, value []byte) {
		rec, err := decodeAny(kind, key, value)
		if err != nil {
			if !errors.Is(err, errInvalidRecord) {
				t.Fatalf("decode error %v does not wrap errInvalidRecord", err)
			}
			return
		}
		enc1, err := encode(rec)
		if err != nil {
			t.Fatalf("accepted record does not encode: %v", err)
		}
		rec2, err := decodeAny(kind, key, enc1)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v\n%s", err, enc1)
		}
		enc2, err := encode(rec2)
		if err != nil || !bytes.Equal(enc1, enc2) {
			t.Fatalf("encoding is not stable: %s vs %s (%v)", enc1, enc2, err)
		}
	})
}

func TestDecodeRejects(t *testing.T) {
	tests := []struct {
		name  string
		kind  uint8
		key   string
		value string
		want  string
	}{
		{name: "empty value", kind: recEvent, key: "u", value: "", want: "empty value"},
		{name: "not JSON", kind: recEvent, key: "u", value: "\x00\xff", want: "invalid character"},
		{name: "truncated JSON", kind: recEvent, key: "u", value: `{"v":1,"uid":"u"`, want: "unexpected EOF"},
		{name: "trailing data", kind: recEvent, key: "u", value: `{"v":1,"uid":"u","state":1}{}`, want: "trailing data"},
		{name: "wrong type", kind: recEvent, key: "u", value: `{"v":"1","uid":"u","state":1}`, want: "cannot unmarshal"},
		{name: "no version", kind: recEvent, key: "u", value: `{"uid":"u","state":1}`, want: "record version 0"},
		{name: "newer record version", kind: recEvent, key: "u", value: `{"v":2,"uid":"u","state":1}`, want: "record version 2"},
		{name: "event under another key", kind: recEvent, key: "x", value: `{"v":1,"uid":"u","state":1}`, want: `has uid "u"`},
		{name: "event state 0", kind: recEvent, key: "u", value: `{"v":1,"uid":"u","state":0}`, want: "state 0 out of range"},
		{name: "step key of 4 bytes", kind: recStep, key: "\x00\x00\x00\x01", value: `{}`, want: "4 bytes"},
		{name: "step key 0", kind: recStep, key: "\x00\x00\x00\x00\x00\x00\x00\x00", value: `{}`, want: "sequence key 0"},
		{name: "step seq mismatch", kind: recStep, key: "\x00\x00\x00\x00\x00\x00\x00\x02", value: `{"v":1,"seq":1,"step":"s","phase":1,"state":2}`, want: "has seq 1"},
		{name: "step phase 3", kind: recStep, key: "\x00\x00\x00\x00\x00\x00\x00\x01", value: `{"v":1,"seq":1,"step":"s","phase":3,"state":2}`, want: "phase 3"},
		{name: "step state 6", kind: recStep, key: "\x00\x00\x00\x00\x00\x00\x00\x01", value: `{"v":1,"seq":1,"step":"s","phase":1,"state":6}`, want: "state 6"},
		{name: "step state too big for the type", kind: recStep, key: "\x00\x00\x00\x00\x00\x00\x00\x01", value: `{"v":1,"seq":1,"step":"s","phase":1,"state":258}`, want: "cannot unmarshal"},
		{name: "step without name", kind: recStep, key: "\x00\x00\x00\x00\x00\x00\x00\x01", value: `{"v":1,"seq":1,"phase":1,"state":2}`, want: "empty step name"},
		{name: "outbox null payload", kind: recOutbox, key: "\x00\x00\x00\x00\x00\x00\x00\x01", value: `{"v":1,"seq":1,"uid":"u","kind":1,"payload":null}`, want: "empty payload"},
		{name: "change key mismatch", kind: recChange, key: "cordon/node-b", value: `{"v":1,"kind":1,"node":"node-a"}`, want: "has key"},
		{name: "change kind 3", kind: recChange, key: "x", value: `{"v":1,"kind":3,"node":"node-a"}`, want: "kind 3"},
		{name: "history with a bad step", kind: recHistory, key: "\x00\x00\x00\x00\x00\x00\x00\x01", value: `{"v":1,"seq":1,"event":{"v":1,"uid":"u","state":2},"outcome":1,"steps":[{"v":1,"seq":1,"step":"s","phase":9,"state":2}]}`, want: "phase 9"},
		{name: "gpu state under another key", kind: recGPU, key: "x", value: `{"v":1,"boot":"b"}`, want: `under key "x"`},
		{name: "gpu state without boot", kind: recGPU, key: "state", value: `{"v":1,"xids":{"GPU-1":[79]}}`, want: "empty boot ID"},
		{name: "gpu XIDs unsorted", kind: recGPU, key: "state", value: `{"v":1,"boot":"b","xids":{"GPU-1":[79,48]}}`, want: "not sorted"},
		{name: "gpu XIDs empty list", kind: recGPU, key: "state", value: `{"v":1,"boot":"b","xids":{"GPU-1":[]}}`, want: "empty XID list"},
		{name: "history outcome 0", kind: recHistory, key: "\x00\x00\x00\x00\x00\x00\x00\x01", value: `{"v":1,"seq":1,"event":{"v":1,"uid":"u","state":2},"outcome":0}`, want: "outcome 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeAny(tt.kind, []byte(tt.key), []byte(tt.value))
			if !errors.Is(err, errInvalidRecord) {
				t.Fatalf("err = %v, want an invalid-record error", err)
			}
			wantErrContains(t, err, tt.want)
		})
	}
	for _, s := range seedRecords() {
		b, _ := json.Marshal(s.value)
		if _, err := decodeAny(s.kind, s.key, b); err != nil {
			t.Errorf("valid seed %s rejected: %v", b, err)
		}
	}
}
