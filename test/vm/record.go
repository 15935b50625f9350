package vm

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// NodeSnapshot is the Node as a watch saw it at one moment.
type NodeSnapshot struct {
	At   time.Time
	Node *corev1.Node
}

// NodeRecorder keeps every version of the Node a watch delivers, so a test
// can ask what was posted before a given moment (a power-off, a reboot).
type NodeRecorder struct {
	*nodeLog
	from time.Time // Since: versions seen before it are not looked at
}

type nodeLog struct {
	mu    sync.Mutex
	snaps []NodeSnapshot
}

// Since is a view of the same recording that looks only at the versions
// seen from at on: a scenario sharing the node with earlier ones asks about
// its own.
func (r *NodeRecorder) Since(at time.Time) *NodeRecorder {
	return &NodeRecorder{nodeLog: r.nodeLog, from: at}
}

// RecordNode watches the Node until the test ends.
func (c *Cluster) RecordNode(t testing.TB) *NodeRecorder {
	t.Helper()
	r := &NodeRecorder{nodeLog: &nodeLog{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sel := fields.OneTermEqualSelector("metadata.name", c.Node).String()
	go func() {
		for ctx.Err() == nil {
			w, err := c.Admin.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: sel})
			if err != nil {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				if n, ok := ev.Object.(*corev1.Node); ok {
					r.mu.Lock()
					r.snaps = append(r.snaps, NodeSnapshot{At: time.Now(), Node: n.DeepCopy()})
					r.mu.Unlock()
				}
			}
			w.Stop()
		}
	}()
	return r
}

// FirstSeen returns when a Node version satisfying cond was first seen
// (zero time: never).
func (r *NodeRecorder) FirstSeen(cond func(*corev1.Node) bool) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.snaps {
		if !s.At.Before(r.from) && cond(s.Node) {
			return s.At
		}
	}
	return time.Time{}
}

// Describe lists the recorded versions: time, cordon, our conditions.
func (r *NodeRecorder) Describe() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, s := range r.snaps {
		if s.At.Before(r.from) {
			continue
		}
		fmt.Fprintf(&b, "  %s unschedulable=%v cordoned-by=%q", s.At.Format("15:04:05.000"), s.Node.Spec.Unschedulable, s.Node.Annotations[v1alpha1.AnnotationCordonedBy])
		for _, c := range s.Node.Status.Conditions {
			if c.Type != corev1.NodeReady {
				fmt.Fprintf(&b, " %s=%s/%s", c.Type, c.Status, c.Reason)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Cordoned reports whether n is cordoned by the agent (unschedulable and
// carrying the ownership annotation).
func Cordoned(n *corev1.Node) bool {
	_, ours := n.Annotations[v1alpha1.AnnotationCordonedBy]
	return n.Spec.Unschedulable && ours
}

// ConditionIs reports whether n has condition typ with status and reason
// (empty reason: any).
func ConditionIs(n *corev1.Node, typ string, status corev1.ConditionStatus, reason string) bool {
	c := NodeCondition(n, typ)
	return c != nil && c.Status == status && (reason == "" || c.Reason == reason)
}
