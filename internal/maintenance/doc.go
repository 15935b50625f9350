// Package maintenance decides when a disruptive event may start: weekly
// maintenance windows (maintenance.windows) and gates (gates.*: Prometheus
// alerts, blocking pods, a local command), as kured's --reboot-days,
// --start-time/--end-time/--time-zone, --prometheus-url with
// --alert-filter-regexp, and --blocking-pod-selector do (issue 15.3, 15.4).
//
// Where the engine asks: before the disruption slot and the claim of an
// event whose plan has a disruptive step (an uncordon never waits). So a
// waiting event is Pending with a message saying what it waits for (the
// next opening, or each blocker), the Node says MaintenancePlanned=True
// (reason MaintenanceWindow for a window; the event's cause, e.g.
// AdminRequested, for gates, the blockers in the message), it holds no
// disruption slot (a node whose pod blocks does not starve the others, as
// kured checks its blockers before it takes its lock), and its sla does not
// run: DESIGN's sla counts from the claim, so a Pending event has no
// deadline, it waits until its window opens or its gates pass, or until it
// is deleted. An event that waited gets MaintenancePlanned=False reason
// MaintenanceStarted with its claim.
//
// Decisions where the issue is silent:
//
//   - A window belongs to the day it opens: Friday 22:00–04:00 is open
//     until Saturday 04:00 even without Saturday in days (kured looks at the
//     current day instead). End not after start crosses midnight; end equal
//     to start is 24 hours. Times are wall-clock in the window's IANA zone,
//     across DST changes; "Local" is refused (a fleet's windows must not
//     depend on each host's zone). The zone database is built in.
//   - The window is checked once, before the claim: an event that started
//     inside its window runs to its end, later disruptive steps included (a
//     reboot after a drain that ran past the window's close), because
//     stopping a drained node halfway until next week is worse than
//     finishing late. Choose windows longer than the events' sla.
//   - The gates are checked at the same point, the last safe point before
//     the first disruptive step. While they block they are evaluated again
//     on a back-off (10 s, doubling to 2 minutes); a pass resets it and
//     stands for 10 s (an event that then waits for a disruption slot,
//     polled every 2 s, does not query Prometheus at each poll). A gate
//     that cannot be evaluated (Prometheus unreachable, a command that times
//     out) blocks: "unknown" never lets a reboot through.
//   - Per event, parameter maintenanceWindow=ignore skips the windows and
//     gates=ignore the gates, for an admin who knows (an urgent GPU reset
//     while the alert about that GPU fires). Any other value fails the
//     event, naming the parameter. The engine takes both out of the
//     parameters before the driver sees them.
//   - The command gate runs /bin/sh -c from root-owned config, in host.mode
//     simulate too (it must be a read-only probe), killed with its process
//     group at gates.commandTimeout.
//   - Only firing alerts block (pending ones do not, as kured's default of
//     --alert-firing-only is not); alertNames narrows what blocks,
//     ignoreAlerts (kured's --alert-filter-regexp) removes from it.
//   - The shutdown path never asks: logind's shutdown is not an event, and
//     the gates run in the engine's loop, not in the shutdown guard.
//
// Tests: the alert gate against a server of Prometheus' documented wire
// format in make test, and against a real Prometheus built from the module
// proxy in make test-prometheus (its cold build, about 12 CPU-minutes, does
// not fit CI's budget); the windows and the pod and command gates end to end
// on the real API server (test/e2e TestMaintenanceWindow, TestGates).
package maintenance
