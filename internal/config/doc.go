// Package config loads and validates the agent's configuration.
//
// # Sources and precedence
//
// Load layers four sources with viper; the first that sets a key wins:
//
//  1. flags the user gave (registered from the key table by AddFlags);
//  2. environment variables LIFECYCLE_AGENT_<KEY>: the key in upper snake
//     case with "." and "-" as "_" (nodeName → LIFECYCLE_AGENT_NODE_NAME,
//     host.mode → LIFECYCLE_AGENT_HOST_MODE); each is bound explicitly with
//     viper.BindEnv, there is no AutomaticEnv; empty variables are ignored;
//  3. the config file: --config, else LIFECYCLE_AGENT_CONFIG, else
//     DefaultPath. A missing DefaultPath means "no file"; a missing file that
//     was named explicitly is an error;
//  4. the defaults in the key table.
//
// osUpgrade.profiles and exec.drivers hold commands that run as root, so
// they come from the file only (DESIGN §7), never from env or flags.
//
// # One table
//
// keys (keys.go) lists every key once: name, flag, env, type, default,
// allowed values, check and description. Load, AddFlags, Reference
// (docs/configuration.md) and Example (packaging/config.yaml) are all
// derived from it, and TestGeneratedFilesUpToDate fails when the two
// generated files are stale: run `go run ./internal/config/gen-docs`.
//
// # Validation policy: strict, one line
//
// The file is not given to viper to interpret. decodeFile parses it with
// go.yaml.in/yaml/v3 into nodes and walks them against the key table, so
// that it can refuse, with file and line:
//   - unknown keys at any depth, with a "did you mean" hint (keys are
//     case-sensitive, unlike viper's);
//   - keys given twice, and files with more than one YAML document;
//   - wrong types: a string key takes YAML strings only (host.mode: 5 is
//     refused, quote it), a bool takes true/false only, a duration takes a
//     Go duration ("90s", "24h") or 0;
//   - values outside their enum or range, non-loopback metricsAddress,
//     malformed profiles and exec drivers.
//
// Only the typed, checked values are handed to viper (MergeConfigMap) for
// layering; env and flag values, which reach Load as strings, are parsed
// and checked by the same kind and check functions. A key written but left
// empty ("key:") is the same as a key left out.
//
// The file is also refused when it, or its directory (unless sticky), is
// group- or world-writable, and, when the process runs as root, when either
// is not owned by root. Checks are made on the opened file descriptor.
//
// Every error Load returns is an *Error: one line of the form
//
//	config: <file>:<line>|env NAME|flag --name: key <key>: <problem>
//
// The CLI exits 2 on any of them (see cmd/lifecycle-agent).
//
// # Defaults that depend on the host
//
// nodeName "" means the host name, lowercased (as the kubelet does).
// drivers.<name>.enabled is a tri-state *bool: nil means the driver's
// default, which Config.DriverEnabled resolves (gpu-reset needs NVML,
// os-upgrade needs a profile).
//
// # No key that does nothing
//
// effect_test.go walks every key of the table the reference is generated
// from: a non-default value of each reaches its Config field and no other
// (TestEveryKeyReachesItsField), and each field, and each field of the
// structured keys, is read by code outside this package, directly or
// through a Config method called from outside (TestEveryKeyIsRead). A key
// added without a reader fails there; what each reader does is proven by
// the behaviour tests (test/e2e TestDrainTimeout, ...).
package config

//go:generate go run ./gen-docs -root ../..
