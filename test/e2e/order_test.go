package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// What the cluster sees at the end never says "done" before the Node does:
// at the moment an event's Succeeded arrives on a watch, the Node already
// reports the transition ended (LifecycleTransition=False with the end
// state, naming this event). A rollout tool that waits for Succeeded and
// then reads the Node must never find it mid-transition.
func TestEndStateAfterNodeConditions(t *testing.T) {
	node := "order-node"
	newNode(t, node)
	startAgent(t, node, agentOpts{retention: time.Hour})
	lc := clients(t, env.AdminConfig())
	waitFor(t, "transitions", 30*time.Second, func() bool {
		_, err := lc.Transitions.Get(context.Background(), transitionName(node, "uncordon"), metav1.GetOptions{})
		return err == nil
	})
	for i := range 6 {
		name := fmt.Sprintf("order-%d", i)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		w, err := lc.Events.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		createEvent(t, name, node, transitionName(node, "uncordon"), nil, nil)
		var got *corev1.NodeCondition
		for ev := range w.ResultChan() {
			le, ok := ev.Object.(*v1alpha1.LifecycleEvent)
			if !ok || le.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
				continue
			}
			n := getNode(t, node)
			got = nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition)
			break
		}
		w.Stop()
		cancel()
		if got == nil {
			t.Fatalf("%s: no Succeeded seen, or no LifecycleTransition condition on the Node", name)
		}
		if got.Status != corev1.ConditionFalse || !strings.Contains(got.Message, name) {
			t.Fatalf("%s: when Succeeded was visible the Node said LifecycleTransition=%s/%s (%q): the end status came before the Node's", name, got.Status, got.Reason, got.Message)
		}
		waitEvent(t, name, time.Minute)
		if err := lc.Events.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
