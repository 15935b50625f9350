package apiclient

import (
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// The claim's writes have a token bucket of their own on the same
// connections: with the main bucket dry (events back to back), a claim
// does not wait for it.
func TestClaimLane(t *testing.T) {
	c, err := New(&rest.Config{Host: "https://127.0.0.1:1"}, "n", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	main, claim := c.LC.REST.(*rest.RESTClient), c.claimLane().REST.(*rest.RESTClient)
	if main.Client != claim.Client {
		t.Error("the claim lane has an HTTP client of its own, want the main one's connections")
	}
	for main.GetRateLimiter().TryAccept() {
	}
	if !claim.GetRateLimiter().TryAccept() {
		t.Fatal("the main bucket dry took the claim lane's with it")
	}
	n := 1
	for claim.GetRateLimiter().TryAccept() {
		n++
	}
	if n < claimBurst || n > claimBurst+1 {
		t.Errorf("claim lane burst %d, want %d", n, claimBurst)
	}
	// A Client not made by New (tests) claims on LC.
	var bare Client
	bare.LC = c.LC
	if bare.claimLane() != c.LC {
		t.Error("claimLane of a bare Client is not LC")
	}
}
