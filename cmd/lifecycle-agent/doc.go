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
//	lifecycle-agent status [--json]             ask the running agent
//	lifecycle-agent request <driver> [--param k=v]... [--wait [--timeout D]]
//	lifecycle-agent doctor                      check the node
//	lifecycle-agent journal verify|export|compact
//	lifecycle-agent journal check-file PATH     hidden: in-process integrity check
//	lifecycle-agent manifests                   CRDs, RBAC, admission policy
//	lifecycle-agent version | --version
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
// stderr and maps it to an exit code:
//
//	0  success (including --help and --version)
//	1  the command ran and failed (runtime error, or "not implemented yet")
//	   lifecycle-agent: <command>: <error>
//	2  nothing was done: bad command line (unknown command or flag, wrong
//	   argument count, --param without "=", bad flag value) or bad
//	   configuration (unknown key, wrong type, bad value, unsafe file mode,
//	   missing file given with --config)
//	   lifecycle-agent: <command>: <error>; run 'lifecycle-agent <command> --help'
//	   lifecycle-agent: config: <file>:<line>: <error>
//
// Configuration errors exit 2 as usage errors do: systemd's
// RestartPreventExitStatus=2 can then stop a restart loop on a bad config.
package main
