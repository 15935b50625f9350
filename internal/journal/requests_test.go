package journal

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestAutoRequests: a request survives a reopen as written, is updated in
// place, is checked by CheckFile and exported, and is gone once deleted; a
// file without the bucket has none and passes the check; a corrupt record
// is reported, not skipped.
func TestAutoRequests(t *testing.T) {
	path := journalPath(t)
	j, _ := openJournal(t, path, testOptions(t))
	if rs, err := j.AutoRequests(); err != nil || len(rs) != 0 {
		t.Fatalf("fresh journal: AutoRequests() = %v, %v; want none", rs, err)
	}
	if err := j.DeleteAutoRequest("reboot"); err != nil {
		t.Fatalf("deleting what is not there: %v", err)
	}
	r := AutoRequest{Key: "reboot", Event: "node-a-reboot-1234abcd", Group: "auto-reboot", Object: json.RawMessage(`{"metadata":{"name":"node-a-reboot-1234abcd"}}`)}
	if err := j.PutAutoRequest(r); err != nil {
		t.Fatal(err)
	}
	if err := j.PutAutoRequest(AutoRequest{Key: "gpu-reset/GPU-1", Event: "e", Group: "g", Object: json.RawMessage(`not json`)}); err == nil {
		t.Fatal("a request whose object is not JSON was accepted")
	}
	if err := j.PutAutoRequest(AutoRequest{Key: "x", Event: "e", Group: "g", Object: json.RawMessage(`{}`), Outcome: RequestSucceeded, Counted: true}); err == nil {
		t.Fatal("a succeeded request counted against the breaker was accepted")
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(path, 0); err != nil {
		t.Fatalf("check with a request: %v", err)
	}
	j, _ = openJournal(t, path, testOptions(t))
	rs, err := j.AutoRequests()
	if err != nil || len(rs) != 1 || rs[0].Event != r.Event || rs[0].Published || rs[0].Created.IsZero() {
		t.Fatalf("after reopen: %+v, %v; want the one request, unpublished", rs, err)
	}
	got := rs[0]
	got.Published, got.Outcome, got.Counted = true, RequestFailed, true
	if err := j.PutAutoRequest(got); err != nil {
		t.Fatal(err)
	}
	rs, _ = j.AutoRequests()
	if len(rs) != 1 || !rs[0].Counted || !rs[0].Created.Equal(got.Created) {
		t.Fatalf("after update: %+v; want one, counted, created as before", rs)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Export(path, &buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"event": "node-a-reboot-1234abcd"`) {
		t.Errorf("export does not show the request:\n%s", buf.String())
	}

	j, _ = openJournal(t, path, testOptions(t))
	if err := j.DeleteAutoRequest("reboot"); err != nil {
		t.Fatal(err)
	}
	if rs, _ := j.AutoRequests(); len(rs) != 0 {
		t.Fatalf("after delete: %+v", rs)
	}
	if err := j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRequests).Put([]byte("reboot"), []byte(`{"v":1,"key":"other"}`))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.AutoRequests(); err == nil {
		t.Error("a corrupt request record read without an error")
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(path, 0); err == nil || !strings.Contains(err.Error(), "requests/") {
		t.Errorf("CheckFile with a corrupt request: %v; want an error naming requests/", err)
	}
}
