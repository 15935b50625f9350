// Package agent assembles the daemon from its parts — config, journal, API
// client, host operations, drivers, engine, metrics, control socket,
// sd_notify — and runs it. `lifecycle-agent run` is a thin wrapper around
// Run; benchmarks and tests start agents in-process through the same code.
//
// Start-up order, each step bounded:
//  1. open the journal (integrity check in a subprocess; a corrupt file is
//     moved aside and reported);
//  2. read the unfinished events it holds (replay) and tell systemd READY=1
//     — the API server is not waited for beyond apiTimeout;
//  3. serve metrics and /healthz on the loopback metricsAddress, and the
//     root-only control socket;
//  4. run the engine: resume journal events, publish transitions, watch and
//     claim this node's events.
//
// Once idle for a minute (and again after each event), the agent releases
// the pages of its executable that start-up or the last event touched and
// the heap it freed (trim.go): an idle agent is charged what its idle loop
// uses, not its start-up.
//
// The control socket (socketPath, mode 0600, directory 0700) speaks HTTP:
// GET /status returns the engine's Snapshot as JSON.
package agent
