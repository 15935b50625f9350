package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// BuildHistoryJournal writes a journal at path holding n finished events
// in its history, each a drain as the engine journals it (the event's
// snapshot, the intent and done records of cordon, evict and wait-empty).
// The history cap is raised to n: the agent's default is
// journal.DefaultHistoryCap (100), so a journal this full only arises with
// a larger cap; the agent, which opens it with the default cap, keeps every
// record until its next finished event trims the history to 100.
// Build it on tmpfs: it makes 8 commits per event.
func BuildHistoryJournal(path, node string, n int) error {
	j, _, err := journal.Open(context.Background(), path, journal.Options{HistoryCap: max(n, 1), Checker: func(context.Context, string) error { return nil }})
	if err != nil {
		return err
	}
	defer j.Close()
	for i := 0; i < n; i++ {
		uid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		name := fmt.Sprintf("drain-%s-%06d", node, i)
		raw, err := json.Marshal(sampleEvent(name, uid, node))
		if err != nil {
			return err
		}
		if err := j.PutEvent(journal.EventRecord{UID: uid, Name: name, Driver: "lifecycle-agent.x-k8s.io/drain", ResourceVersion: fmt.Sprint(1000 + i),
			State: journal.EventRunning, Object: raw, Attrs: map[string]string{"transition": node + "-drain"}}); err != nil {
			return err
		}
		for _, step := range []string{"cordon", "evict", "wait-empty"} {
			for _, ph := range []journal.StepPhase{journal.PhaseIntent, journal.PhaseDone} {
				state := journal.StepRunning
				if ph == journal.PhaseDone {
					state = journal.StepDone
				}
				if _, err := j.AppendStep(uid, journal.StepRecord{Step: step, Phase: ph, State: state, Attempt: 1, BootID: "0b8d5a36-3c1e-4bbd-8f0e-4e2c2f3b9c1d"}); err != nil {
					return err
				}
			}
		}
		if err := j.FinishEvent(uid, journal.OutcomeSucceeded, "transition DrainStarted → DrainComplete complete"); err != nil {
			return err
		}
	}
	return nil
}

// sampleEvent is a claimed drain event as the engine snapshots it.
func sampleEvent(name, uid, node string) *v1alpha1.LifecycleEvent {
	now := metav1.NewTime(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	sla := metav1.NewTime(now.Add(time.Hour))
	ev := &v1alpha1.LifecycleEvent{
		TypeMeta:   metav1.TypeMeta{APIVersion: "lifecycle.x-k8s.io/v1alpha1", Kind: "LifecycleEvent"},
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid), ResourceVersion: "12345", CreationTimestamp: now, Finalizers: []string{"lifecycle.x-k8s.io/agent"}},
		Spec:       v1alpha1.LifecycleEventSpec{TransitionName: node + "-drain", BindingNode: node, Parameters: map[string]string{"deleteEmptyDirData": "true"}},
		Status: v1alpha1.LifecycleEventStatus{
			ClaimStatus: v1alpha1.LifecycleEventClaimed, Sla: &sla,
			Driver:  v1alpha1.LifecycleDriverStatus{Name: "lifecycle-agent.x-k8s.io/drain", Start: "DrainStarted", End: "DrainComplete"},
			Holder:  &v1alpha1.Holder{Identity: node + "/0123abcd", BootID: "0b8d5a36-3c1e-4bbd-8f0e-4e2c2f3b9c1d", ClaimTime: &now, RenewTime: &now},
			Message: "claimed by " + node + "/0123abcd",
		},
	}
	for _, s := range []string{"cordon", "evict", "wait-empty"} {
		ev.Status.Steps = append(ev.Status.Steps, v1alpha1.StepStatus{Name: s, State: v1alpha1.StepPending})
	}
	ev.Status.Conditions = []metav1.Condition{
		{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: "Claimed", Message: "claimed", LastTransitionTime: now},
		{Type: v1alpha1.ConditionWaitingForDisruptionBudget, Status: metav1.ConditionFalse, Reason: "NotWaiting", LastTransitionTime: now},
	}
	return ev
}

// StartupStats are Startup's measurements for one journal size.
type StartupStats struct {
	History      int   `json:"history"`
	JournalBytes int64 `json:"journalBytes"`
	// Ready is exec → READY=1 on NOTIFY_SOCKET after a clean stop (the
	// journal as the previous agent's Close left it: no check).
	Ready Dist `json:"ready"`
	// ReadyAfterCrash is the same with a journal no agent closed (copied
	// in, as a crash or a power cut leaves it): the full check runs.
	ReadyAfterCrash Dist `json:"readyAfterCrash"`
	// Check is `lifecycle-agent journal check-file` alone (the integrity
	// check the agent runs in a subprocess before opening the journal).
	Check Dist `json:"check"`
}

// Startup starts bin (lifecycle-agent) runs times for each history size
// and times exec → READY=1, with the journal holding that many finished
// events, against the test control plane and the test logind (so the
// shutdown guard takes its delay lock before READY, as on a host).
func Startup(ctx context.Context, dir, bin string, sizes []int, runs int, say func(string, ...any)) ([]StartupStats, error) {
	env, err := StartEnv(ctx, nil, false)
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	const node = "bench-startup"
	if err := testenv.CreateNode(ctx, env.AdminConfig(), node, nil); err != nil {
		return nil, err
	}
	kc, err := env.WriteKubeconfigFor("node:" + node)
	if err != nil {
		return nil, err
	}
	ldir, err := startLogindDir()
	if err != nil {
		return nil, err
	}
	srv, err := logindtest.New(ldir, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	shm := "/dev/shm"
	if fi, err := os.Stat(shm); err != nil || !fi.IsDir() {
		shm = dir
	}
	var out []StartupStats
	for _, n := range sizes {
		tdir, err := os.MkdirTemp(shm, "lcb-journal-")
		if err != nil {
			return out, err
		}
		template := filepath.Join(tdir, "journal.db")
		t0 := time.Now()
		if n > 0 {
			if err := BuildHistoryJournal(template, node, n); err != nil {
				os.RemoveAll(tdir)
				return out, err
			}
		}
		st := StartupStats{History: n}
		if fi, err := os.Stat(template); err == nil {
			st.JournalBytes = fi.Size()
		}
		say("startup: journal with %d history records built in %s (%d bytes)", n, time.Since(t0).Round(time.Millisecond), st.JournalBytes)
		var ready, crashed, check []time.Duration
		for r := 0; r < runs; r++ {
			rdir := filepath.Join(dir, fmt.Sprintf("h%d-r%d", n, r))
			if err := os.MkdirAll(rdir, 0o700); err != nil {
				return out, err
			}
			jpath := filepath.Join(rdir, "journal.db")
			if n > 0 {
				if err := copyFile(template, jpath); err != nil {
					return out, err
				}
				// The check alone, on the same file (read-only).
				c0 := time.Now()
				cmd := exec.CommandContext(ctx, bin, "journal", "check-file", jpath)
				if b, err := cmd.CombinedOutput(); err != nil {
					return out, fmt.Errorf("bench: %s journal check-file: %v: %s", bin, err, b)
				}
				check = append(check, time.Since(c0))
			}
			// First start: the journal as a crash leaves it (never closed by
			// an agent). Second: as the first agent's clean stop left it.
			for i, into := range []*[]time.Duration{&crashed, &ready} {
				d, err := StartDaemon(DaemonOptions{Bin: bin, Dir: rdir, Node: node, Kubeconfig: kc, Bus: srv.Address(), Journal: jpath})
				if err != nil {
					return out, err
				}
				took, err := d.WaitReady(60 * time.Second)
				stopErr := d.Stop()
				if err != nil {
					return out, err
				}
				if stopErr != nil {
					return out, stopErr
				}
				if _, err := os.Stat(jpath + ".clean"); i == 0 && err != nil {
					return out, fmt.Errorf("bench: the agent's clean stop left no %s.clean: %v", jpath, err)
				}
				*into = append(*into, took)
			}
			_ = os.RemoveAll(rdir)
		}
		os.RemoveAll(tdir)
		st.Ready, st.ReadyAfterCrash, st.Check = Summarize(ready), Summarize(crashed), Summarize(check)
		say("startup: %d history records: READY after a clean stop %s, after a crash %s; check-file alone %s", n, st.Ready, st.ReadyAfterCrash, st.Check)
		out = append(out, st)
	}
	return out, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
