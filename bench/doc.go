// Package bench measures the agent against a real control plane (see
// docs/benchmarks.md for the scenarios, goals and results). Everything here
// drives the same code the daemon runs: in-process agents are
// internal/agent.Run with host actions simulated; the idle and start-up
// scenarios run bin/lifecycle-agent itself.
package bench
