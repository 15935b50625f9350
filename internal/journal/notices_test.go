package journal

import (
	"bytes"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestNoticesWithEvent: notices given with an event snapshot are queued in
// its transaction, survive a reopen, record their targets and attempts,
// and are gone once done; a file from a build that predates the notify
// bucket (none in it) reads as having no notices and passes the check.
func TestNoticesWithEvent(t *testing.T) {
	path := journalPath(t)
	j, _ := openJournal(t, path, testOptions(t))
	if ns, err := j.Notices(); err != nil || len(ns) != 0 {
		t.Fatalf("fresh journal: Notices() = %v, %v; want none", ns, err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(path, 0); err != nil {
		t.Fatalf("a file without the notify bucket: %v", err)
	}
	j, _ = openJournal(t, path, testOptions(t))
	rec := testEvent("uid-a")
	rec.Notices = []Notice{
		{UID: "uid-a", Event: "ev-a", Kind: NoticeClaimed, Text: "ev-a claimed"},
		{UID: "uid-a", Event: "ev-a", Kind: NoticeStepFailed, Text: "ev-a: step drain failed"},
	}
	mustPutEvent(t, j, rec)
	if _, err := j.PushNotice(Notice{UID: "uid-b", Kind: NoticeEnded, Text: "ev-b Succeeded"}); err != nil {
		t.Fatal(err)
	}
	all := []string{"t1", "t2", "t3"}
	if done, err := j.NoticeAttempted(2, "t1", true, all); err != nil || done {
		t.Fatalf("t1 took notice 2: done %v, %v; want held for t2 and t3", done, err)
	}
	if done, err := j.NoticeAttempted(2, "t2", false, all); err != nil || done {
		t.Fatalf("t2 refused notice 2: done %v, %v", done, err)
	}
	if done, err := j.NoticeAttempted(2, "t2", true, all); err != nil || done {
		t.Fatalf("t2 took notice 2: done %v, %v; want held for t3", done, err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(path, 0); err != nil {
		t.Fatalf("check with notices: %v", err)
	}

	j, _ = openJournal(t, path, testOptions(t))
	ns, err := j.Notices()
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, n := range ns {
		seqs = append(seqs, n.Seq)
	}
	if !slices.Equal(seqs, []uint64{1, 2, 3}) || ns[0].Kind != NoticeClaimed || ns[2].Text != "ev-b Succeeded" {
		t.Fatalf("notices after reopen = %+v; want seq 1, 2, 3 in order", ns)
	}
	if !slices.Equal(ns[1].Sent, []string{"t1", "t2"}) || ns[1].Attempts != 3 || ns[1].Created.IsZero() {
		t.Errorf("notice 2 = %+v; want sent [t1 t2] after 3 attempts", ns[1])
	}
	if done, err := j.NoticeAttempted(2, "t3", true, all); err != nil || !done {
		t.Fatalf("t3, the last, took notice 2: done %v, %v; want it deleted", done, err)
	}
	if done, err := j.NoticeAttempted(2, "t3", true, all); err != nil || done {
		t.Errorf("NoticeAttempted on a notice that is gone: done %v, %v; want false, nil", done, err)
	}
	if deleted, err := j.NoticeDone(2); err != nil || deleted { // gone: not an error
		t.Errorf("NoticeDone of a notice that is gone: %v, %v", deleted, err)
	}
	if deleted, err := j.NoticeDone(1); err != nil || !deleted {
		t.Errorf("NoticeDone(1) = %v, %v; want deleted", deleted, err)
	}
	ns, _ = j.Notices()
	if len(ns) != 1 || ns[0].Seq != 3 {
		t.Errorf("after done: %+v; want 3 only", ns)
	}
	var doc bytes.Buffer
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Export(path, &doc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(doc.Bytes(), []byte(`"ev-b Succeeded"`)) {
		t.Errorf("export lacks the notices:\n%s", doc.String())
	}
}

// TestNoticeRejectedRollsBackEvent: a notice that does not validate fails
// the whole snapshot, so a state is never committed without its message.
func TestNoticeRejectedRollsBackEvent(t *testing.T) {
	j, _ := openJournal(t, journalPath(t), testOptions(t))
	rec := testEvent("uid-a")
	rec.Notices = []Notice{{UID: "uid-a", Kind: NoticeEnded}} // no text
	err := j.PutEvent(rec)
	wantErrContains(t, err, "uid-a", "empty text")
	if _, ok, err := j.Event("uid-a"); err != nil || ok {
		t.Errorf("event committed without its notice: ok=%v err=%v", ok, err)
	}
}

// TestCheckRejectsBadNotice: an undecodable notice makes the file corrupt
// for the checker, like any other record.
func TestCheckRejectsBadNotice(t *testing.T) {
	path := journalPath(t)
	j, _ := openJournal(t, path, testOptions(t))
	_ = j.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketNotify)
		if err != nil {
			return err
		}
		return b.Put(seqBytes(4), []byte(`{"v":1,"seq":4,"uid":"u","kind":9,"text":"x"}`))
	})
	_ = db.Close()
	if err != nil {
		t.Fatal(err)
	}
	wantErrContains(t, CheckFile(path, 0), "notify/", "kind 9 out of range")
}
