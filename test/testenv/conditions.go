package testenv

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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// ConditionRecorder records, from a watch on one Node, every change of its
// lifecycle conditions as "Type=Status/Reason", in the order the API
// server stored them.
type ConditionRecorder struct {
	mu    sync.Mutex
	seen  []string
	group []int // seen[i] came in the group-th Node update: one patch, in no order
	last  map[string]string
	n     int
}

// RecordConditions starts a ConditionRecorder on node, through cfg, until
// the end of t.
func RecordConditions(t *testing.T, cfg *rest.Config, node string) *ConditionRecorder {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()})
	if err != nil {
		t.Fatal(err)
	}
	r := &ConditionRecorder{last: map[string]string{}}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			r.mu.Lock()
			r.n++
			for _, typ := range v1alpha1.NodeConditionTypes {
				var c *corev1.NodeCondition
				for i := range n.Status.Conditions {
					if string(n.Status.Conditions[i].Type) == typ {
						c = &n.Status.Conditions[i]
					}
				}
				if c == nil {
					continue
				}
				v := fmt.Sprintf("%s=%s/%s", typ, c.Status, c.Reason)
				if key := v + " " + c.Message; r.last[typ] != key {
					r.last[typ] = key
					r.seen = append(r.seen, v)
					r.group = append(r.group, r.n)
				}
			}
			r.mu.Unlock()
		}
	}()
	return r
}

// Mark returns the position to check from next.
func (r *ConditionRecorder) Mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// Expect waits until the changes recorded from position from contain want
// in that order (other changes may come between; changes of one Node
// update may match in any order), and that none of them is in never.
func (r *ConditionRecorder) Expect(t *testing.T, from int, want []string, never ...string) {
	t.Helper()
	var got []string
	ok := false
	deadline := time.Now().Add(20 * time.Second)
	for !ok && time.Now().Before(deadline) {
		r.mu.Lock()
		got = append([]string(nil), r.seen[from:]...)
		groups := append([]int(nil), r.group[from:]...)
		r.mu.Unlock()
		used := make([]bool, len(got))
		lastGroup, i := 0, 0
		for ; i < len(want); i++ {
			found := false
			for j, g := range got {
				if !used[j] && groups[j] >= lastGroup && g == want[i] {
					used[j], lastGroup, found = true, groups[j], true
					break
				}
			}
			if !found {
				break
			}
		}
		ok = i == len(want)
		if !ok {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !ok {
		t.Fatalf("Node conditions changed\n  %s\nwant, in this order,\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for _, g := range got {
		for _, n := range never {
			if strings.HasPrefix(g, n) {
				t.Errorf("Node condition %s written; never expected %s here:\n  %s", g, n, strings.Join(got, "\n  "))
			}
		}
	}
}
