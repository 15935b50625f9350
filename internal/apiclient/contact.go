package apiclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"
)

// Contact is when the agent last heard from the API server, and since when
// it has not: every HTTP response (any status code: the server answered)
// and every byte read from a response body (a watch's events and bookmarks
// stream through one) counts as hearing from it; a request that fails
// without a response (refused, reset, timed out, TLS handshake cut) counts
// as not. It answers "is this agent deaf?" for `status` and the metric
// lifecycle_agent_api_last_contact_timestamp_seconds.
type Contact struct {
	now func() time.Time

	mu        sync.Mutex
	lastHeard time.Time // last response or body read
	lastFail  time.Time // last request that got no response
	failSince time.Time // first failure after lastHeard (zero while reachable)
	lastErr   string
	regained  chan struct{}
}

// ContactState is a copy of Contact's state.
type ContactState struct {
	// Reachable: the most recent request got a response (or none failed yet).
	Reachable bool
	LastHeard time.Time // zero: never
	// UnreachableSince is the first failure after the last response (zero
	// while reachable).
	UnreachableSince time.Time
	LastError        string
}

func newContact(now func() time.Time) *Contact {
	return &Contact{now: now, regained: make(chan struct{}, 1)}
}

func (c *Contact) heard() {
	t := c.now()
	c.mu.Lock()
	back := !c.failSince.IsZero()
	c.lastHeard, c.failSince = t, time.Time{}
	c.mu.Unlock()
	if back {
		select {
		case c.regained <- struct{}{}:
		default:
		}
	}
}

// Regained receives (at most one pending value) each time the server
// answers after one or more requests had failed: the moment to look again
// at everything a broken watch may have missed.
func (c *Contact) Regained() <-chan struct{} { return c.regained }

func (c *Contact) failed(err error) {
	t := c.now()
	c.mu.Lock()
	c.lastFail, c.lastErr = t, err.Error()
	if c.failSince.IsZero() {
		c.failSince = t
	}
	c.mu.Unlock()
}

// State returns the current state.
func (c *Contact) State() ContactState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ContactState{Reachable: c.failSince.IsZero(), LastHeard: c.lastHeard, UnreachableSince: c.failSince, LastError: c.lastErr}
}

// contactTransport records every round trip's outcome in a Contact.
type contactTransport struct {
	next http.RoundTripper
	c    *Contact
}

// WrappedRoundTripper lets client-go reach the transport under this one
// to cancel a request; without it every client-side timeout logged
// "Unable to cancel request for *apiclient.contactTransport".
func (t *contactTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

func (t *contactTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	if err != nil {
		// A request we cancelled ourselves says nothing about the server.
		if r.Context().Err() == nil {
			t.c.failed(err)
		}
		return resp, err
	}
	t.c.heard()
	if resp.Body != nil {
		resp.Body = &contactBody{ReadCloser: resp.Body, c: t.c, ctx: r.Context()}
	}
	return resp, nil
}

// contactBody marks the server heard on every successful read, so a long
// watch that streams events or bookmarks keeps the contact fresh.
type contactBody struct {
	io.ReadCloser
	c   *Contact
	ctx context.Context
}

func (b *contactBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.c.heard()
	}
	// A stream cut under a watch (the connection reset, or closed by the
	// HTTP/2 health check) is a failure too; the end of a body, or a body
	// we closed ourselves, is not.
	if err != nil && err != io.EOF && b.ctx.Err() == nil && !errors.Is(err, context.Canceled) {
		b.c.failed(err)
	}
	return n, err
}
