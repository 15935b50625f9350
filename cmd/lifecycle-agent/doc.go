// Command lifecycle-agent is the node lifecycle driver host (DESIGN §1): one
// per node, run by systemd as `lifecycle-agent run`.
//
// # Shape
//
// main parses the command line and calls one function per command; commands
// are thin (STYLE rule 1). Each command lives in its own file, cmd_<name>.go,
// as newXCmd (flags and arguments, usage errors) and runX(ctx, *env, opts)
// error (the work). env holds the loaded *config.Config, stdout, stderr and
// a *slog.Logger built from logLevel/logFormat.
//
//	lifecycle-agent run                         run the agent (systemd)
//	lifecycle-agent status [-o json]            ask the running agent (--json: alias)
//	lifecycle-agent request <driver> [--param k=v]... [--wait [--timeout D]] [-o name|json]
//	lifecycle-agent wait <event> [--timeout D] [-o json]   follow an event, after a reboot too
//	lifecycle-agent doctor                      check the node
//	lifecycle-agent journal verify|export|compact
//	lifecycle-agent journal check-file PATH     hidden: in-process integrity check
//	lifecycle-agent manifests                   CRDs, RBAC, admission policy
//	lifecycle-agent version [-o json] | --version
//	lifecycle-agent gen-man DIR                 hidden: man pages for the .deb
//	lifecycle-agent completion bash|zsh|fish    hidden: shell completion (cobra)
//
// version and commit are set with -ldflags "-X main.version=... -X
// main.commit=...". Build with -tags kustomize_disable_go_plugin_support:
// without it, linking kubectl's drain package pulls in Go's plugin package,
// the binary is linked BIND_NOW and go-nvml's lazy symbols fail at exec.
//
// # Configuration
//
// Commands that need it (run, status, request, doctor, journal verify|
// export|compact) load the configuration in the root's PersistentPreRunE with
// config.Load: flags > LIFECYCLE_AGENT_* env > config file > defaults (see
// package config). --config, --node-name, --kubeconfig, --journal, --socket,
// --log-level and --log-format are global; the other config flags are on run
// only. manifests, version, gen-man and completion read no configuration, so
// they work on a host with a broken config file.
//
// # Errors and exit codes
//
// cobra's own printing is silenced; execute prints every error as ONE line on
// stderr and maps it to an exit code. One table for every command of both
// binaries (internal/exitcode; exitcode.AddToHelp appends it to every
// command's --help and so to the man pages; docs/pipelines.md carries it):
//
//	0    succeeded    success (including --help and --version); the event Succeeded
//	1    failed       the command ran and failed; the event Failed
//	2    usage        nothing was done: bad command line, bad configuration, a
//	                  driver or parameter the agent refuses
//	3    sla-expired  the event's SLA expired
//	4    timeout      --timeout passed while the event still ran
//	5    cancelled    the event was deleted before it ended
//	6    unavailable  the agent (or the API server) did not answer: retry later
//	130  interrupted  SIGINT or SIGTERM stopped a command (wait, request
//	                  --wait); run stops cleanly on them and exits 0
//
//	lifecycle-agent: <command>: <error>
//	lifecycle-agent: <command>: <error>; run 'lifecycle-agent <command> --help'
//	lifecycle-agent: config: <file>:<line>: <error>
//
// explain (errors.go) rewrites errors whose raw text leaks internals
// (repeated package prefixes, "dial unix" transcripts) into what failed,
// why and what to do.
//
// Configuration errors exit 2 as usage errors do: systemd's
// RestartPreventExitStatus=2 can then stop a restart loop on a bad config.
package main
