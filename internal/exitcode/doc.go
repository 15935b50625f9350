// Package exitcode is the one exit-code table of both command-line tools,
// lifecycle-agent and kubectl-lifecycle (issue 43): the same code, name and
// meaning for the same outcome, whichever tool a pipeline runs. The numbers
// and names are stable: scripts depend on them.
//
//	0    succeeded    success; when waiting: the event (every rollout node) Succeeded
//	1    failed       the command failed; when waiting: the event (a rollout node) Failed
//	2    usage        bad command line or configuration: nothing was done
//	3    sla-expired  the event's SLA expired
//	4    timeout      --timeout passed first; the event goes on
//	5    cancelled    the event was deleted before it ended
//	6    unavailable  the agent or the API server did not answer: retry later
//	130  interrupted  SIGINT or SIGTERM while waiting; the event goes on
//
// Help is the table as every command's --help prints it (AddToHelp puts it
// there, and so into the man pages); docs/pipelines.md and docs/plugin.md
// carry it as a Markdown table (Markdown), kept in step by tests.
//
// lifecycle-agent run is the one command a signal does not make exit 130:
// SIGTERM is how systemd stops the agent, and a clean stop exits 0.
package exitcode
