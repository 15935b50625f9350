package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/maintenance"
)

// flashDriver is a disruptive exec driver of one harmless step.
func flashDriver(c *config.Config) {
	c.Exec.Drivers = []config.ExecDriver{{Name: "flash", Start: "FlashStarted", End: "FlashComplete",
		Steps: []config.ExecStep{{Name: "flash", Command: []string{"/bin/true"}, Timeout: time.Minute}}}}
}

func getEvent(t *testing.T, name string) *v1alpha1.LifecycleEvent {
	t.Helper()
	ev, err := clients(t, env.AdminConfig()).Events.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// waitPending waits until the event is Pending with a message containing
// every one of want, and returns it.
func waitPending(t *testing.T, name string, want ...string) *v1alpha1.LifecycleEvent {
	t.Helper()
	var ev *v1alpha1.LifecycleEvent
	waitFor(t, name+" Pending with "+strings.Join(want, ", "), 30*time.Second, func() bool {
		ev = getEvent(t, name)
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventPending {
			return false
		}
		for _, w := range want {
			if !strings.Contains(ev.Status.Message, w) {
				return false
			}
		}
		return true
	})
	return ev
}

// waitPlanned waits for the Node's MaintenancePlanned=True with reason and
// a message naming the event and containing want.
func waitPlanned(t *testing.T, node, event, reason string, want ...string) {
	t.Helper()
	waitFor(t, "MaintenancePlanned=True/"+reason+" for "+event, 30*time.Second, func() bool {
		c := nodeCondition(getNode(t, node), v1alpha1.NodeConditionMaintenancePlanned)
		if c == nil || c.Status != corev1.ConditionTrue || c.Reason != reason || !strings.Contains(c.Message, "event "+event) {
			return false
		}
		for _, w := range want {
			if !strings.Contains(c.Message, w) {
				return false
			}
		}
		return true
	})
}

// Issue 15.3 on the real API server: outside every maintenance window a
// disruptive event stays Pending, naming the next opening, and the Node
// says MaintenancePlanned=True reason MaintenanceWindow; an uncordon (no
// disruptive step) and an event with maintenanceWindow=ignore run at once;
// a bad value of the parameter fails the event naming it; when the window
// opens the waiting event is claimed and Succeeds.
func TestMaintenanceWindow(t *testing.T) {
	node := "window-node"
	newNode(t, node)
	// A daily window opening 20 s from now (UTC, to the second), an hour long:
	// the checks outside it take 3-6 s here, and CI runs beside a VM on 2 cores.
	opens := time.Now().UTC().Add(20 * time.Second).Truncate(time.Second)
	midnight := time.Date(opens.Year(), opens.Month(), opens.Day(), 0, 0, 0, 0, time.UTC)
	start := opens.Sub(midnight)
	w := maintenance.Window{Start: start, End: (start + time.Hour) % (24 * time.Hour), Loc: time.UTC}
	startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) {
		flashDriver(c)
		c.Maintenance.Windows = maintenance.Windows{w}
	}})
	waitTransition(t, transitionName(node, "flash"))

	createEvent(t, "win-wait", node, transitionName(node, "flash"), nil, nil)
	waitPending(t, "win-wait", "waiting for a maintenance window: the next opens "+opens.Format("Mon 2006-01-02 15:04 MST"), "(window every day ")
	waitPlanned(t, node, "win-wait", "MaintenanceWindow", "waiting for a maintenance window")

	createEvent(t, "win-uncordon", node, transitionName(node, "uncordon"), nil, nil)
	if ev := waitEvent(t, "win-uncordon", 30*time.Second); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("uncordon outside the window: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	createEvent(t, "win-ignore", node, transitionName(node, "flash"), map[string]string{"maintenanceWindow": "ignore"}, nil)
	if ev := waitEvent(t, "win-ignore", 30*time.Second); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("maintenanceWindow=ignore: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	createEvent(t, "win-bad", node, transitionName(node, "flash"), map[string]string{"maintenanceWindow": "yes"}, nil)
	ev := waitEvent(t, "win-bad", 30*time.Second)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, `parameter maintenanceWindow: want "ignore" (or leave it out), got "yes"`) {
		t.Fatalf("maintenanceWindow=yes: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if time.Now().After(opens) {
		t.Fatalf("the window opened before the checks outside it were done (this machine is slow): raise the 20 s")
	}
	if ev := getEvent(t, "win-wait"); ev.Status.ClaimStatus != v1alpha1.LifecycleEventPending {
		t.Fatalf("win-wait before the window: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}

	ev = waitEvent(t, "win-wait", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("win-wait in the window: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if claimed := ev.Status.Holder.ClaimTime.Time; claimed.Before(opens) {
		t.Fatalf("claimed at %s, before the window opened at %s", claimed.UTC(), opens)
	}
	if c := nodeCondition(getNode(t, node), v1alpha1.NodeConditionMaintenancePlanned); c == nil || c.Status != corev1.ConditionFalse {
		t.Fatalf("MaintenancePlanned after the event: %+v", c)
	}
}

// Issue 15.4 on the real API server: the command gate and the blocking-pod
// gate keep a disruptive event Pending, each blocker named in the event's
// message and the Node's MaintenancePlanned message; an uncordon is not
// gated; gates=ignore passes them; once both clear (re-checked on a
// back-off, the first after 10 s), the event runs.
func TestGates(t *testing.T) {
	node := "gates-node"
	newNode(t, node)
	ctx := context.Background()
	ok := filepath.Join(t.TempDir(), "ok")
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	ns := "gates-e2e"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grace := int64(0)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "backup", Namespace: ns, Labels: map[string]string{"gate": "block"}},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: &grace, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/backup:1"}}}}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) {
		flashDriver(c)
		c.Gates.Command = "test -e " + ok + " || { echo 'the backup window is not over' >&2; exit 1; }"
		c.Gates.BlockingPods = "gate=block"
	}})
	waitTransition(t, transitionName(node, "flash"))

	createEvent(t, "gated", node, transitionName(node, "flash"), nil, nil)
	blockers := []string{"waiting for gates: command: `test -e " + ok, "exited 1: the backup window is not over",
		"pods: pod gates-e2e/backup matches gate=block"}
	waitPending(t, "gated", blockers...)
	waitPlanned(t, node, "gated", "AdminRequested", blockers...)

	createEvent(t, "gated-uncordon", node, transitionName(node, "uncordon"), nil, nil)
	if ev := waitEvent(t, "gated-uncordon", 30*time.Second); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("uncordon with gates blocking: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	createEvent(t, "gated-ignore", node, transitionName(node, "flash"), map[string]string{"gates": "ignore"}, nil)
	if ev := waitEvent(t, "gated-ignore", 30*time.Second); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("gates=ignore: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if ev := getEvent(t, "gated"); ev.Status.ClaimStatus != v1alpha1.LifecycleEventPending {
		t.Fatalf("gated while both gates block: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}

	// One gate clears: the other still blocks, and alone is named.
	if err := os.WriteFile(ok, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ev := waitPending(t, "gated", "waiting for gates: pods: pod gates-e2e/backup matches gate=block")
	if strings.Contains(ev.Status.Message, "command") {
		t.Fatalf("the command gate passes now, but the message still names it: %q", ev.Status.Message)
	}
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "backup", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	ev = waitEvent(t, "gated", 2*time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("gated after the gates cleared: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if c := nodeCondition(getNode(t, node), v1alpha1.NodeConditionMaintenancePlanned); c == nil || c.Status != corev1.ConditionFalse {
		t.Fatalf("MaintenancePlanned after the event: %+v", c)
	}
}

// The alert gate through the agent's wiring (gates.prometheus.url,
// ignoreAlerts): a server that answers /api/v1/alerts in Prometheus'
// documented wire format (a real Prometheus: make test-prometheus, in
// internal/maintenance) fires NodeDown and Watchdog; the event waits naming
// NodeDown only (Watchdog is ignored); once NodeDown stops, it runs.
func TestAlertGate(t *testing.T) {
	node := "alerts-node"
	newNode(t, node)
	var mu sync.Mutex
	alerts := `[{"labels":{"alertname":"NodeDown"},"state":"firing","activeAt":"2026-12-02T10:00:00Z","value":"1"},` +
		`{"labels":{"alertname":"Watchdog"},"state":"firing","activeAt":"2026-12-02T10:00:00Z","value":"1"}]`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/alerts" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"success","data":{"alerts":` + alerts + `}}`))
	}))
	t.Cleanup(srv.Close)
	startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) {
		flashDriver(c)
		c.Gates.Prometheus.URL = srv.URL
		c.Gates.Prometheus.IgnoreAlerts = "^Watchdog$"
	}})
	waitTransition(t, transitionName(node, "flash"))
	createEvent(t, "alerted", node, transitionName(node, "flash"), nil, nil)
	ev := waitPending(t, "alerted", "waiting for gates: prometheus: alert NodeDown is firing")
	if strings.Contains(ev.Status.Message, "Watchdog") {
		t.Fatalf("an ignored alert is named: %q", ev.Status.Message)
	}
	waitPlanned(t, node, "alerted", "AdminRequested", "alert NodeDown is firing")
	mu.Lock()
	alerts = `[{"labels":{"alertname":"Watchdog"},"state":"firing","activeAt":"2026-12-02T10:00:00Z","value":"1"}]`
	mu.Unlock()
	if ev := waitEvent(t, "alerted", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("after NodeDown stopped: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
}
