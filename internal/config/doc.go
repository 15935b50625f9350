// Package config loads and validates the agent's configuration.
//
// # Sources and precedence
//
// Load layers these sources with viper; the first that sets a key wins:
//
//  1. flags the user gave (registered from the key table by AddFlags);
//  2. environment variables LIFECYCLE_AGENT_<KEY>: the key in upper snake
//     case with "." and "-" as "_" (nodeName → LIFECYCLE_AGENT_NODE_NAME,
//     host.mode → LIFECYCLE_AGENT_HOST_MODE); each is bound explicitly with
//     viper.BindEnv, there is no AutomaticEnv; empty variables are ignored;
//  3. the administrator's drop-ins, DropInDir/*.yaml;
//  4. the config file: --config, else LIFECYCLE_AGENT_CONFIG, else
//     DefaultPath. A missing DefaultPath means "no file"; a missing file that
//     was named explicitly is an error;
//  5. the package's defaults, VendorDir/*.yaml;
//  6. the defaults in the key table.
//
// osUpgrade.profiles and exec.drivers hold commands that run as root, so
// they come from files only (DESIGN §7), never from env or flags.
//
// # Files and drop-ins
//
// Why: the config file is a dpkg conffile, and dpkg asks what to do when
// both the administrator and the package changed one; an unattended
// upgrade has nobody to answer. So the package never changes it (its text
// is comments that change only with their meaning) and ships the defaults
// it may want to change as vendor drop-ins in VendorDir
// (/usr/lib/lifecycle-agent/config.d, plain files dpkg replaces without
// asking), and the administrator may keep site settings in drop-ins of
// their own (DropInDir, /etc/lifecycle-agent/config.d, which the package
// creates empty), as systemd and sshd do. layers (layers.go) decides:
//
//   - Order, lowest first: VendorDir/*.yaml, the config file,
//     DropInDir/*.yaml. Within a directory, lexical (byte) order of the
//     file names, as os.ReadDir returns them; "10-" sorts before "9-".
//   - Only names ending in ".yaml" and not starting with "." are read.
//     Everything else is ignored without a word, as systemd ignores names
//     without its suffix: dpkg's x.yaml.dpkg-dist, .dpkg-old, .dpkg-new and
//     .dpkg-tmp, x.yml, README, editor backups and swap files. An entry
//     with a .yaml name that is not a regular file (a directory) is an
//     error, not skipped.
//   - Masking, systemd's rule: a drop-in in DropInDir with the same name as
//     one in VendorDir replaces it entirely; the vendor file is not read
//     (not even checked). An empty file masks it with nothing.
//   - Merging is per key, the later file winning; a key's value is never
//     merged across files. Lists (readiness.checks, gpu.services, ...) and
//     the file-only sections osUpgrade.profiles (a map), exec.drivers and
//     maintenance.windows come whole from the last file that gives them a
//     value: predictable, and a profile or driver is never assembled from
//     two files that each looked valid alone. [] or {} clears an earlier
//     file's value; a key left empty (null) changes nothing, as everywhere.
//   - --config FILE or LIFECYCLE_AGENT_CONFIG=FILE: the drop-ins come from
//     dir(FILE)/config.d, and the vendor drop-ins only when FILE is
//     DefaultPath (after filepath.Clean). They are the package's defaults
//     for the package's config file; a config file elsewhere (the tests',
//     a second instance's) is self-contained and does not change with the
//     host's package. The unit runs `lifecycle-agent run` without --config.
//   - The drop-ins are read even when DefaultPath does not exist.
//   - Every file gets readFile: the ownership check below (on the file and
//     its directory, so on config.d too) and decodeFile's validation; an
//     error names that file and line. Cross-key checks made after merging
//     (checkInert) name the file and line whose value won.
//
// Config.Source names, for each key, the flag, variable or file:line that
// won; Config.Files lists the files read, lowest first.
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
// No file is given to viper to interpret. decodeFile parses each with
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
// Only the typed, checked values are handed to viper (one MergeConfigMap
// of the files' values, merged by Load in file order) for layering; env and flag values, which reach Load as strings, are parsed
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
