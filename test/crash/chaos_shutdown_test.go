package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// The shutdown driver's schedules. logind starts it, nothing claims it: a
// schedule runs the agent on a test logind (a private D-Bus), logind
// announces a shutdown (PrepareForShutdown(true)) at a random moment, and
// the faults come around it — SIGKILL and restart, a failpoint panic, an
// API outage (reset or half-open), and logind's cancel
// (PrepareForShutdown(false)) while the agent runs, while it is down or
// while it is cut off. Unless cancelled, the machine then goes down: once
// logind would stop waiting (every delay lock released, or the agent's
// budget passed), the agent is stopped (SIGTERM or SIGKILL), the boot ID
// changes, a fresh logind comes up, the agent starts again. The invariants:
//
//  1. every delay lock was released within the budget of the shutdown's
//     announcement (plus slack): logind never waits on the agent longer;
//  2. at rest the node is not cordoned, LifecycleTransition and
//     GracefulNodeShutdownInProgress are False with the end's reason
//     (ShutdownComplete after the boot, ShutdownCancelled after a cancel;
//     absent only when the agent never ran between announcement and cancel);
//  3. the journal holds nothing unfinished, and its last shutdown ended
//     with the matching outcome;
//  4. the agent holds exactly one delay lock again, on the logind of the
//     boot it runs in;
//  5. no goroutine leak, and exit 0 on SIGTERM.
const (
	faultShutdown faultKind = "shutdown" // logind announces the shutdown
	chaosBudget             = 3 * time.Second
	// lockSlack is what the budget may be exceeded by: the release after
	// the journal commit, a restarted agent's watch delivering the
	// shutdown already under way (its subscribe and first read).
	lockSlack = 2 * time.Second
)

// shutdownFailpoints are those the shutdown driver reaches: the journal's
// (its event, step, owned-cordon, outbox and finish commits).
func shutdownFailpoints(all []string) []string {
	var out []string
	for _, fp := range all {
		if strings.HasPrefix(fp, "journal") && fp != "journalFinishingWriteError" {
			out = append(out, fp)
		}
	}
	return out
}

func newShutdownSchedule(rng *rand.Rand, s schedule, all []string) schedule {
	failpoints := shutdownFailpoints(all)
	announce := time.Duration(rng.Int64N(int64(1500 * time.Millisecond)))
	s.faults = []fault{{kind: faultShutdown, at: announce}}
	kinds := []faultKind{faultKill, faultOutage, faultHalf, faultCancel, faultPanic}
	at := time.Duration(0)
	for i := range 1 + rng.IntN(3) {
		k := kinds[rng.IntN(len(kinds))]
		at += time.Duration(rng.Int64N(int64(1500 * time.Millisecond)))
		f := fault{kind: k, at: at}
		if k != faultCancel {
			f.dur = 300*time.Millisecond + time.Duration(rng.Int64N(int64(3*time.Second)))
			f.cancel = rng.IntN(4) == 0
		}
		if k == faultPanic {
			f.failpoint = failpoints[rng.IntN(len(failpoints))]
			if i == 0 { // armed when the shutdown comes: a crash while preparing it
				f.at, f.dur = max(0, announce-200*time.Millisecond), max(f.dur, 1500*time.Millisecond)
				at = f.at
			}
		}
		s.faults = append(s.faults, f)
		at += f.dur
		if k == faultCancel || f.cancel {
			break
		}
	}
	if rng.IntN(3) == 0 { // a crash while closing the shutdown out after the boot
		s.bootPanic = failpoints[rng.IntN(len(failpoints))]
	}
	return s
}

// heldDelay counts the delay locks on "shutdown" not yet released.
func heldDelay(l *logindtest.Server) int {
	n := 0
	for _, in := range l.Inhibitors() {
		if in.Mode == "delay" && in.What == "shutdown" && !in.Released {
			n++
		}
	}
	return n
}

func runShutdownSchedule(t *testing.T, s schedule, rng *rand.Rand) {
	ctx := context.Background()
	admin := env.AdminConfig()
	node := fmt.Sprintf("chaos-%02d-%s", s.i, s.driver)
	kubelet := chaosNode(t, node)
	proxy, err := env.NewCutProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	logind := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	c := chaosCase(t, node, "", chaosConfig+fmt.Sprintf("shutdown:\n  budget: %s\n", chaosBudget), proxy.Config(env.NodeConfig(node)))
	c.kubelet = kubelet
	c.extraEnv = []string{"DBUS_SYSTEM_BUS_ADDRESS=" + logind.Address()}
	cs := kubernetes.NewForConfigOrDie(admin)

	var cur atomic.Pointer[agentProc] // the agent now, for the announcement's timer
	a := c.start(t, "")
	cur.Store(a)
	restart := func(failpoints string) {
		a = c.start(t, failpoints)
		cur.Store(a)
	}
	waitFor(t, "the agent's delay lock", 30*time.Second, a, func() bool { return heldDelay(logind) == 1 })
	// Read here, the baseline may come before the start's watches (the
	// delay lock is taken early): see the leak check at the end.
	baseline, err := goroutines(a)
	if err != nil {
		t.Fatal(err)
	}

	// Invariant 1, watched from the announcement until the cancel or the
	// machine going down: the longest time any delay lock was held at a
	// stretch (an agent restarted meanwhile takes one again: it must let
	// go of it as soon as it sees the shutdown under way).
	var mu sync.Mutex
	var announced, cancelledAt time.Time
	var longest time.Duration
	downAtAnnounce := false
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	announce := func() {
		mu.Lock()
		defer mu.Unlock()
		if !announced.IsZero() {
			return
		}
		announced = time.Now()
		downAtAnnounce = cur.Load().exited()
		if err := logind.EmitPrepareForShutdown(true); err != nil {
			t.Error(err)
		}
		go func() {
			defer close(watchDone)
			since := announced
			for {
				mu.Lock()
				now := time.Now()
				if heldDelay(logind) == 0 {
					since = now
				}
				longest = max(longest, now.Sub(since))
				done := !cancelledAt.IsZero()
				mu.Unlock()
				select {
				case <-stopWatch:
					return
				case <-time.After(20 * time.Millisecond):
				}
				if done {
					return
				}
			}
		}()
	}
	cancel := func() {
		announce() // a cancel is of a shutdown announced
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		if cancelledAt.IsZero() {
			cancelledAt = time.Now()
			if err := logind.EmitPrepareForShutdown(false); err != nil {
				t.Fatal(err)
			}
		}
	}
	crashes := 0
	created := time.Now()
	faults := append([]fault(nil), s.faults...)
	sort.Slice(faults, func(i, j int) bool { return faults[i].at < faults[j].at })
	// The announcement comes on its own timer: faults last (an armed
	// failpoint waits to fire), the shutdown does not wait for them.
	for _, f := range faults {
		if f.kind == faultShutdown {
			tm := time.AfterFunc(time.Until(created.Add(f.at)), announce)
			defer tm.Stop()
		}
	}
	for _, f := range faults {
		time.Sleep(time.Until(created.Add(f.at)))
		switch f.kind {
		case faultKill:
			a.kill()
			crashes++
			if f.cancel {
				cancel()
			}
			time.Sleep(f.dur)
			restart("")
		case faultPanic:
			fired := armPanic(t, a, f.failpoint, f.dur)
			if f.cancel {
				cancel()
			}
			if fired {
				crashes++
				panicsFired.Add(1)
				time.Sleep(300 * time.Millisecond)
				restart("")
			}
			t.Logf("panic at %s: fired %v", f.failpoint, fired)
		case faultOutage, faultHalf:
			outage(proxy, f, cancel)
		case faultCancel:
			cancel()
		}
	}
	announce() // now, if its timer has not fired yet
	mu.Lock()
	cancelled := !cancelledAt.IsZero()
	mu.Unlock()
	down := !cancelled
	if down {
		// The machine goes down once logind stops waiting: no delay lock
		// left, or its InhibitDelayMaxSec (here: the budget and slack) up.
		deadline := time.Now().Add(chaosBudget + lockSlack)
		for heldDelay(logind) > 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	close(stopWatch)
	<-watchDone
	mu.Lock()
	if longest > chaosBudget+lockSlack {
		t.Errorf("a delay lock was held %s at a stretch after the shutdown was announced; the budget is %s", longest.Round(time.Millisecond), chaosBudget)
	}
	held := longest
	mu.Unlock()

	if down {
		if rng.IntN(2) == 0 {
			// systemd stops the agent; one that had no time to set up its
			// handler dies of the signal, which systemd counts as clean.
			if err := a.stop(20 * time.Second); err != nil && a.exit() != "signal "+syscall.SIGTERM.String() {
				t.Errorf("systemd's stop at shutdown: %v", err)
			}
		} else {
			a.kill()
		}
		boot := fmt.Sprintf("00000000-0000-4000-8000-%012d", s.i+1)
		if err := os.WriteFile(filepath.Join(c.dir, hostops.SimulatedBootIDFile), []byte(boot+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := logind.Close(); err != nil {
			t.Fatal(err)
		}
		logind = logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
		c.extraEnv = []string{"DBUS_SYSTEM_BUS_ADDRESS=" + logind.Address()}
		if s.bootPanic != "" {
			restart(s.bootPanic + `=panic("chaos")`)
			select {
			case <-a.done:
				crashes++
				panicsFired.Add(1)
				t.Logf("panic at %s after the boot: fired", s.bootPanic)
			case <-time.After(5 * time.Second):
				a.kill()
				t.Logf("panic at %s after the boot: not reached in 5 s", s.bootPanic)
			}
		}
		restart("")
	}

	// 2–4 at rest.
	wantReason, wantGNS, wantOutcome := "ShutdownCancelled", "ShutdownCancelled", journal.OutcomeCancelled
	if down {
		wantReason, wantGNS, wantOutcome = "ShutdownComplete", "NodeStarted", journal.OutcomeSucceeded
	}
	var n *corev1.Node
	var seen string // what the wait last saw, for its failure message
	waitFor(t, "the node back in service, the shutdown closed out", 60*time.Second, a, func() bool {
		var err error
		if n, err = cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
			seen = "node: " + err.Error()
			return false
		}
		lt := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition)
		// Idle (the start's close-out done) with nothing unfinished in the
		// journal (a revert after a cancel runs beside the engine).
		st, err := statusFromSocket(ctx, c.socket())
		if err != nil {
			seen = "status: " + err.Error()
			return false
		}
		ltS := "absent"
		if lt != nil {
			ltS = string(lt.Status) + "/" + lt.Reason
		}
		seen = fmt.Sprintf("state %q, event %v, outbox %d, unfinished %d, unschedulable %v, LifecycleTransition %s, delay locks %d",
			st.State, st.Event != nil, st.Outbox, st.Unfinished, n.Spec.Unschedulable, ltS, heldDelay(logind))
		return st.Event == nil && st.Outbox == 0 && st.Unfinished == 0 && st.State == "idle" && !n.Spec.Unschedulable &&
			(lt == nil || lt.Status == corev1.ConditionFalse) && heldDelay(logind) == 1
	}, func() string { return seen })
	lt := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition)
	gns := nodeCondition(n, v1alpha1.NodeConditionGracefulNodeShutdownInProgress)
	if h := heldDelay(logind); h != 1 {
		t.Errorf("%d delay lock(s) held at rest; want the agent's one", h)
	}
	// Settled, as the event schedules' check is: a connection being
	// redialled or a watch restarting at this moment is not a leak.
	end, err := settledGoroutines(a, baseline+goroutineSlack)
	if err != nil {
		t.Error(err)
	}
	over := err == nil && end > baseline+goroutineSlack
	if n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "" {
		t.Errorf("node left unschedulable=%v cordoned-by=%q", n.Spec.Unschedulable, n.Annotations[v1alpha1.AnnotationCordonedBy])
	}
	doc, err := exportAfterStop(t, a, c)
	if err != nil {
		t.Fatal(err)
	}
	var last *journal.HistoryRecord
	for i := range doc.History {
		if doc.History[i].Event.Driver == "lifecycle-agent.x-k8s.io/shutdown" {
			last = &doc.History[i]
		}
	}
	switch {
	case lt == nil && gns == nil && last == nil && len(doc.Events) == 0 && (cancelled || downAtAnnounce || crashes > 0):
		// Nothing journaled, nothing done: the agent was down when the
		// shutdown came (and, for a cancel, until it went), or it crashed
		// before its journal commit and logind, held by no lock, went on.
	case lt == nil || gns == nil:
		t.Errorf("conditions at rest: LifecycleTransition %+v, GracefulNodeShutdownInProgress %+v", lt, gns)
	case lt.Status != corev1.ConditionFalse || lt.Reason != wantReason || gns.Status != corev1.ConditionFalse || gns.Reason != wantGNS:
		t.Errorf("conditions at rest: LifecycleTransition=%s/%s, GracefulNodeShutdownInProgress=%s/%s; want False/%s, False/%s",
			lt.Status, lt.Reason, gns.Status, gns.Reason, wantReason, wantGNS)
	}
	if len(doc.Events) > 0 {
		t.Errorf("the journal holds %d unfinished event(s) at rest: %+v", len(doc.Events), doc.Events)
	}
	switch {
	case last == nil && lt != nil:
		t.Errorf("the Node shows the shutdown, the journal has no record of it")
	case last != nil && last.Outcome != wantOutcome:
		t.Errorf("the journal's last shutdown ended %v (%s); want %v", last.Outcome, last.Message, wantOutcome)
	}
	if over {
		// The baseline was read while the first start was still under way
		// (make test at 4bb8cb5 on a loaded machine: 15 goroutines
		// "starting", 39 at rest): what counts is a fresh agent at rest on
		// this journal. Only more than that is a leak.
		ref := freshAtRest(t, c)
		if end > max(baseline, ref)+goroutineSlack {
			t.Errorf("%d goroutines at rest after the shutdown, %d before it, %d in a fresh agent at rest (slack %d): a leak", end, baseline, ref, goroutineSlack)
		}
		baseline = max(baseline, ref)
	}
	endName := "down and back"
	if cancelled {
		endName = "cancelled"
	}
	t.Logf("%s: ended %s, delay lock(s) released %s after the announcement, %d crash(es), %d agent run(s), goroutines %d→%d",
		s, endName, held.Round(time.Millisecond), crashes, c.runs, baseline, end)
}

// freshAtRest starts the case's agent again and returns its goroutines at
// rest (idle, settled), then stops it.
func freshAtRest(t *testing.T, c *crashCase) int {
	t.Helper()
	a := c.start(t, "")
	defer func() {
		if err := a.stop(20 * time.Second); err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "a fresh agent idle", 30*time.Second, a, func() bool {
		st, err := statusFromSocket(context.Background(), c.socket())
		return err == nil && st.State == "idle"
	})
	time.Sleep(goroutineSettle) // its watches and connections up
	n, err := goroutines(a)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// exportAfterStop stops the agent (exit 0 on SIGTERM is invariant 5) and
// exports its journal.
func exportAfterStop(t *testing.T, a *agentProc, c *crashCase) (*journal.ExportDoc, error) {
	t.Helper()
	if err := a.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
	return c.exportJournal()
}
