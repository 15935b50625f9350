package drivers

import (
	"context"
	"strings"
	"testing"
)

// TestCordonStepLeavesAnotherCordon: a node already cordoned is left as it
// is and its cordon not owned, so this event's abort will not lift it; the
// progress names whose cordon it is — an earlier event of ours (a drain
// that succeeded leaves its cordon for an uncordon) or someone else.
func TestCordonStepLeavesAnotherCordon(t *testing.T) {
	for _, tt := range []struct {
		name, owner, want string
	}{
		{"an earlier event of ours", "drain-1", "node was already cordoned by lifecycle-agent for drain-1; leaving that cordon in place: this event does not own it (an uncordon lifts it)"},
		{"someone else", "", "node was already cordoned by someone else; leaving that cordon in place"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rt := newFake()
			rt.event = "drain-2"
			rt.api.cordoned, rt.api.cordonOwner = true, tt.owner
			if err := cordonStep(context.Background(), rt); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(rt.progress, "\n"); got != tt.want {
				t.Errorf("progress %q, want %q", got, tt.want)
			}
			if rt.Owns(Change{Kind: "cordon", Key: rt.node}) {
				t.Errorf("the cordon is owned by drain-2: its abort would lift a cordon it did not make")
			}
			if !rt.api.cordoned || rt.api.cordonOwner != tt.owner {
				t.Errorf("the cordon changed: cordoned=%v owner %q", rt.api.cordoned, rt.api.cordonOwner)
			}
		})
	}
}
