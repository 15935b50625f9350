package main

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// explainedError replaces an error's text with the one line a user needs
// (what failed, why, what to do), keeping the chain for errors.Is.
type explainedError struct {
	msg string
	err error
}

func (e *explainedError) Error() string { return e.msg }
func (e *explainedError) Unwrap() error { return e.err }

// explain rewrites the errors whose raw text leaks internals: package
// prefixes the command name already gives ("journal verify: journal:
// verify: journal: locked"), a syscall's op and path repeated.
func explain(err error) error {
	msg := err.Error()
	switch {
	case errors.Is(err, journal.ErrLocked):
		path := ""
		if _, after, ok := strings.Cut(msg, journal.ErrLocked.Error()+": "); ok {
			path, _, _ = strings.Cut(after, " (")
			path, _, _ = strings.Cut(path, ": ")
			path = " " + path
		}
		return &explainedError{err: err, msg: fmt.Sprintf(
			"the journal%s is in use by another process, most likely the running agent; stop it first (systemctl stop lifecycle-agent), or read its state with 'lifecycle-agent status'", path)}
	case errors.Is(err, journal.ErrCorrupt):
		detail := msg
		if _, after, ok := strings.Cut(msg, journal.ErrCorrupt.Error()+": "); ok {
			detail = after
		}
		return &explainedError{err: err, msg: fmt.Sprintf(
			"the journal is corrupt: %s; the agent moves it aside (journal.db.corrupt-<time>) and starts afresh at its next start, see docs/troubleshooting.md", detail)}
	case errors.Is(err, journal.ErrSchemaTooNew):
		return &explainedError{err: err, msg: trimInternalPrefixes(msg)}
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && errors.Is(err, fs.ErrNotExist) && strings.HasPrefix(msg, "journal: ") {
		return &explainedError{err: err, msg: fmt.Sprintf("no journal at %s (the agent creates it at its first start; is --journal right?)", pe.Path)}
	}
	if t := trimInternalPrefixes(msg); t != msg {
		return &explainedError{err: err, msg: t}
	}
	return err
}

// trimInternalPrefixes drops leading package prefixes that repeat what the
// command's name says.
func trimInternalPrefixes(msg string) string {
	for {
		t := msg
		for _, p := range []string{"journal: verify: ", "journal: compact: ", "journal: export: ", "journal: ", "agent: ", "engine: "} {
			t = strings.TrimPrefix(t, p)
		}
		if t == msg {
			return msg
		}
		msg = t
	}
}
