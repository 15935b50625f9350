package maintenance

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	_ "time/tzdata" // IANA zones without the host's tzdata (a minimal image, a container)
)

// Window is a weekly maintenance window: it opens on each of Days at Start
// (local time in Loc) and closes at End the same day, or the next day when
// End is not after Start (22:00–04:00 crosses midnight). Days is the day the
// window opens: a Friday 22:00–04:00 window is open until Saturday 04:00.
type Window struct {
	Days       []time.Weekday // empty: every day
	Start, End time.Duration  // since midnight
	Loc        *time.Location
}

// ParseDays reads day names: sun, mon, … or sunday, monday, …, any case.
func ParseDays(names []string) ([]time.Weekday, error) {
	var out []time.Weekday
	for _, n := range names {
		d, ok := dayNames[strings.ToLower(strings.TrimSpace(n))]
		if !ok {
			return nil, fmt.Errorf("unknown day %q; want sun, mon, tue, wed, thu, fri or sat", n)
		}
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out, nil
}

var dayNames = map[string]time.Weekday{}

func init() {
	for d := time.Sunday; d <= time.Saturday; d++ {
		full := strings.ToLower(d.String())
		dayNames[full] = d
		dayNames[full[:3]] = d
	}
}

// ParseClock reads a time of day, "HH:MM" or "HH:MM:SS", 24-hour.
func ParseClock(s string) (time.Duration, error) {
	for _, layout := range []string{"15:04", "15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil && len(s) == len(layout) {
			return time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute + time.Duration(t.Second())*time.Second, nil
		}
	}
	return 0, fmt.Errorf("invalid time of day %q; want HH:MM (24-hour), e.g. 22:00", s)
}

// LoadZone reads an IANA time zone name ("UTC", "Europe/Berlin"); "Local"
// is refused: a fleet's windows must not depend on each host's setting.
func LoadZone(name string) (*time.Location, error) {
	if name == "" || name == "Local" {
		return nil, errors.New(`want an IANA time zone name such as UTC or Europe/Berlin ("Local" is refused: it differs between hosts)`)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q (want an IANA name such as Europe/Berlin)", name)
	}
	return loc, nil
}

// opensOn reports whether w opens on weekday d.
func (w Window) opensOn(d time.Weekday) bool { return len(w.Days) == 0 || slices.Contains(w.Days, d) }

// at returns the instant of the local time of day off on the date of day.
// time.Date normalises a clock time a DST gap skips.
func at(day time.Time, off time.Duration, loc *time.Location) time.Time {
	h, m, s := int(off/time.Hour), int(off%time.Hour/time.Minute), int(off%time.Minute/time.Second)
	return time.Date(day.Year(), day.Month(), day.Day(), h, m, s, 0, loc)
}

// occurrence is the window's opening on the date of day and its close.
func (w Window) occurrence(day time.Time) (open, close time.Time) {
	open = at(day, w.Start, w.Loc)
	end := day
	if w.End <= w.Start {
		end = day.AddDate(0, 0, 1)
	}
	return open, at(end, w.End, w.Loc)
}

// Open reports whether now is inside w; if not, next is when it opens next.
// If it is, until is when this opening closes.
func (w Window) Open(now time.Time) (open bool, until, next time.Time) {
	local := now.In(w.Loc)
	// The window that opened yesterday may still be open; look up to eight
	// days ahead for the next opening.
	for i := -1; i <= 8; i++ {
		day := time.Date(local.Year(), local.Month(), local.Day()+i, 12, 0, 0, 0, w.Loc)
		if !w.opensOn(day.Weekday()) {
			continue
		}
		o, c := w.occurrence(day)
		if !now.Before(o) && now.Before(c) {
			return true, c, time.Time{}
		}
		if o.After(now) && (next.IsZero() || o.Before(next)) {
			next = o
		}
	}
	return false, time.Time{}, next
}

// String is the window as a config would write it: "mon,fri 22:00-04:00 Europe/Berlin".
func (w Window) String() string {
	days := "every day"
	if len(w.Days) > 0 && len(w.Days) < 7 {
		var ds []string
		for _, d := range w.Days {
			ds = append(ds, strings.ToLower(d.String()[:3]))
		}
		days = strings.Join(ds, ",")
	}
	return fmt.Sprintf("%s %s-%s %s", days, clock(w.Start), clock(w.End), w.Loc)
}

func clock(d time.Duration) string {
	s := fmt.Sprintf("%02d:%02d", int(d/time.Hour), int(d%time.Hour/time.Minute))
	if sec := int(d % time.Minute / time.Second); sec != 0 {
		s += fmt.Sprintf(":%02d", sec)
	}
	return s
}

// Windows is a node's set of maintenance windows; empty means "always".
type Windows []Window

// Wait says whether an event that needs a window must wait at now and, if
// so, a message naming the next opening: "" means go. A window that opened
// is open for the whole event: the engine checks it before the claim, and
// an event claimed inside its window is not cut off at its close.
func (ws Windows) Wait(now time.Time) string {
	if len(ws) == 0 {
		return ""
	}
	var next time.Time
	var nextW Window
	for _, w := range ws {
		open, _, n := w.Open(now)
		if open {
			return ""
		}
		// Every window opens within a week: n is set.
		if next.IsZero() || n.Before(next) {
			next, nextW = n, w
		}
	}
	return fmt.Sprintf("waiting for a maintenance window: the next opens %s (window %s)",
		next.In(nextW.Loc).Format("Mon 2006-01-02 15:04 MST"), nextW)
}
