package journal

import (
	"bytes"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestGPUHealthState: the GPU monitor's state survives a reopen as written
// (XID lists sorted and distinct, empty ones dropped), is replaced in
// place, checked by CheckFile and exported; a fresh file has none; a
// corrupt record is reported, not read as empty.
func TestGPUHealthState(t *testing.T) {
	path := journalPath(t)
	j, _ := openJournal(t, path, testOptions(t))
	if _, ok, err := j.GPUHealth(); ok || err != nil {
		t.Fatalf("fresh journal: GPUHealth() = %v, %v; want none", ok, err)
	}
	if err := j.PutGPUHealth(GPUHealthState{}); err == nil {
		t.Fatal("a state without a boot ID was accepted")
	}
	s := GPUHealthState{Boot: "boot-1", KernelLogSeq: 812, XIDs: map[string][]uint64{"GPU-a": {79, 48, 79}, "GPU-b": nil}}
	if err := j.PutGPUHealth(s); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(path, 0); err != nil {
		t.Fatalf("check with a GPU state: %v", err)
	}
	j, _ = openJournal(t, path, testOptions(t))
	got, ok, err := j.GPUHealth()
	want := GPUHealthState{Boot: "boot-1", KernelLogSeq: 812, XIDs: map[string][]uint64{"GPU-a": {48, 79}}}
	if err != nil || !ok || !got.Equal(want) || got.Updated.IsZero() {
		t.Fatalf("after reopen: %+v, %v, %v; want %+v", got, ok, err, want)
	}
	if err := j.PutGPUHealth(GPUHealthState{Boot: "boot-2", KernelLogSeq: 3}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := j.GPUHealth(); got.Boot != "boot-2" || len(got.XIDs) != 0 {
		t.Fatalf("after replace: %+v", got)
	}
	if err := j.PutGPUHealth(s); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Export(path, &buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"kernelLogSeq": 812`) || !strings.Contains(buf.String(), `"GPU-a"`) {
		t.Errorf("export does not show the GPU state:\n%s", buf.String())
	}
	j, _ = openJournal(t, path, testOptions(t))
	if err := j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketGPUHealth).Put(keyGPUHealth, []byte(`{"v":1,"boot":"b","xids":{"GPU-a":[79,48]}}`))
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.GPUHealth(); err == nil {
		t.Error("a corrupt GPU state read without an error")
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(path, 0); err == nil || !strings.Contains(err.Error(), "gpuhealth") {
		t.Errorf("check of a corrupt GPU state = %v, want an error naming gpuhealth", err)
	}
}
