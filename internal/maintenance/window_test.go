package maintenance

import (
	"strings"
	"testing"
	"time"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := LoadZone(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func hm(h, m int) time.Duration { return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute }

func TestWindowOpen(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	// Weeknights 22:00–04:00 Berlin: Friday night's window runs into Saturday.
	weeknights := Window{Days: []time.Weekday{time.Monday, time.Tuesday, time.Wednesday, time.Thursday, time.Friday},
		Start: hm(22, 0), End: hm(4, 0), Loc: berlin}
	at := func(s string) time.Time {
		tm, err := time.ParseInLocation("2006-01-02 15:04", s, berlin)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, c := range []struct {
		now        string
		open       bool
		until      string // when open
		next       string // when closed
		w          Window
		commentary string
	}{
		// 2026-12-04 is a Friday.
		{now: "2026-12-04 21:59", w: weeknights, next: "2026-12-04 22:00", commentary: "a minute before Friday's opening"},
		{now: "2026-12-04 22:00", w: weeknights, open: true, until: "2026-12-05 04:00", commentary: "the opening instant is inside"},
		{now: "2026-12-05 03:59", w: weeknights, open: true, until: "2026-12-05 04:00", commentary: "Friday's window on Saturday morning"},
		{now: "2026-12-05 04:00", w: weeknights, next: "2026-12-07 22:00", commentary: "the close is outside; no Saturday or Sunday opening"},
		{now: "2026-12-06 23:00", w: weeknights, next: "2026-12-07 22:00", commentary: "Sunday night: Sunday is not a window day"},
		{now: "2026-12-07 01:00", w: weeknights, next: "2026-12-07 22:00", commentary: "Monday 01:00 belongs to Sunday's (absent) window"},
		{now: "2026-12-08 02:00", w: weeknights, open: true, until: "2026-12-08 04:00", commentary: "Tuesday 02:00 is Monday night's"},
		// Every day, a daytime window; start == end: 24 hours.
		{now: "2026-12-05 12:00", w: Window{Start: hm(9, 0), End: hm(17, 0), Loc: berlin}, open: true, until: "2026-12-05 17:00"},
		{now: "2026-12-05 17:30", w: Window{Start: hm(9, 0), End: hm(17, 0), Loc: berlin}, next: "2026-12-06 09:00"},
		{now: "2026-12-06 17:30", w: Window{Days: []time.Weekday{time.Sunday}, Start: 0, End: 0, Loc: berlin}, open: true, until: "2026-12-07 00:00"},
	} {
		open, until, next := c.w.Open(at(c.now))
		if open != c.open {
			t.Errorf("%s at %s (%s): open %v, want %v", c.w, c.now, c.commentary, open, c.open)
			continue
		}
		if c.open && !until.Equal(at(c.until)) {
			t.Errorf("%s at %s: open until %s, want %s", c.w, c.now, until.In(berlin), c.until)
		}
		if !c.open && !next.Equal(at(c.next)) {
			t.Errorf("%s at %s: next %s, want %s", c.w, c.now, next.In(berlin), c.next)
		}
	}
}

// Across a DST change the window keeps its wall-clock times: Europe/Berlin
// went from CEST to CET on 2026-10-25 (the night of Saturday to Sunday).
func TestWindowAcrossDST(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	w := Window{Start: hm(1, 0), End: hm(5, 0), Loc: berlin}
	before := time.Date(2026, 10, 24, 23, 0, 0, 0, time.UTC) // Sun 01:00 CEST
	open, until, _ := w.Open(before)
	if !open {
		t.Fatalf("01:00 CEST on the change night: closed")
	}
	// 05:00 CET is 04:00 UTC: the night is five hours long, not four.
	if want := time.Date(2026, 10, 25, 4, 0, 0, 0, time.UTC); !until.Equal(want) {
		t.Fatalf("closes %s, want %s (05:00 CET)", until.UTC(), want)
	}
}

func TestWindowsWait(t *testing.T) {
	utc := mustZone(t, "UTC")
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC) // a Wednesday
	if msg := Windows(nil).Wait(now); msg != "" {
		t.Fatalf("no windows: %q, want to go at once", msg)
	}
	ws := Windows{
		{Days: []time.Weekday{time.Saturday}, Start: hm(2, 0), End: hm(6, 0), Loc: utc},
		{Days: []time.Weekday{time.Thursday}, Start: hm(22, 0), End: hm(23, 30), Loc: mustZone(t, "America/New_York")},
	}
	msg := ws.Wait(now)
	// Thursday 22:00 New York (EST, -5) is Friday 03:00 UTC: before Saturday's.
	for _, want := range []string{"waiting for a maintenance window", "Thu 2026-12-03 22:00 EST", "thu 22:00-23:30 America/New_York"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Wait = %q, want it to contain %q", msg, want)
		}
	}
	if msg := ws.Wait(time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)); msg != "" {
		t.Errorf("inside Saturday's window: %q", msg)
	}
}

func TestParse(t *testing.T) {
	days, err := ParseDays([]string{"Fri", "monday", "fri"})
	if err != nil || len(days) != 2 || days[0] != time.Monday || days[1] != time.Friday {
		t.Fatalf("ParseDays = %v, %v", days, err)
	}
	if _, err := ParseDays([]string{"fri", "funday"}); err == nil || !strings.Contains(err.Error(), `"funday"`) {
		t.Errorf("ParseDays(funday) = %v", err)
	}
	for s, want := range map[string]time.Duration{"22:00": hm(22, 0), "04:30": hm(4, 30), "00:00:05": 5 * time.Second} {
		if got, err := ParseClock(s); err != nil || got != want {
			t.Errorf("ParseClock(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"24:00", "9:00pm", "22", "22:00 ", ""} {
		if _, err := ParseClock(s); err == nil {
			t.Errorf("ParseClock(%q) accepted", s)
		}
	}
	for _, z := range []string{"Local", "", "Mars/Olympus"} {
		if _, err := LoadZone(z); err == nil {
			t.Errorf("LoadZone(%q) accepted", z)
		}
	}
}
