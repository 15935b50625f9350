package config

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Options tunes Load. The zero value reads no flags, the process
// environment and DefaultPath.
type Options struct {
	// Flags is the parsed flag set of the command being run (cobra's
	// cmd.Flags()); flags the user set win over everything else. May be nil.
	Flags *pflag.FlagSet
	// DefaultPath replaces DefaultPath, for tests. The drop-ins are read
	// from the config.d beside it.
	DefaultPath string
	// VendorDir replaces VendorDir, for tests and for reading an installed
	// tree (dpkg --root). When DefaultPath is set and VendorDir is not, no
	// vendor directory is read.
	VendorDir string
	// Hostname replaces os.Hostname, for tests.
	Hostname func() (string, error)
}

// Load builds the configuration: flags > LIFECYCLE_AGENT_* env > admin
// drop-ins (config.d/*.yaml) > config file > vendor drop-ins > defaults,
// then validates every value. Every error is an *Error whose message is
// one line naming the file or variable and the key.
func Load(o Options) (*Config, error) {
	path, explicit := configPath(o)
	if path == "" {
		return nil, &Error{Source: "flag --config", Msg: "empty path"}
	}
	files, err := layers(path, explicit, vendorDir(o, path))
	if err != nil {
		return nil, err
	}
	// The files' layered values, merged here (a later file's value wins,
	// lists and all) and handed to viper as one layer, with where each came
	// from.
	merged, fileSource := map[string]any{}, map[string]string{}
	for _, f := range files {
		for name, val := range f.values {
			merged[name] = val
			fileSource[name] = f.at(f.lines[name])
		}
	}

	v := viper.New()
	for _, k := range keys {
		if !k.layered() {
			continue
		}
		if k.hasDefault() {
			def, err := k.defaultValue()
			if err != nil {
				return nil, fmt.Errorf("config: key %s: bad built-in default: %w", k.name, err)
			}
			v.SetDefault(k.name, def)
		}
		if err := v.BindEnv(k.name, k.env()); err != nil {
			return nil, fmt.Errorf("config: bind %s: %w", k.env(), err)
		}
		if f := lookupFlag(o.Flags, k); f != nil {
			if err := v.BindPFlag(k.name, f); err != nil {
				return nil, fmt.Errorf("config: bind --%s: %w", k.flag, err)
			}
		}
	}

	cfg := &Config{sources: map[string]string{}}
	if err := v.MergeConfigMap(nested(merged)); err != nil {
		return nil, &Error{Source: path, Msg: err.Error(), Err: err}
	}
	for _, f := range files {
		if f.path == path {
			cfg.Path = f.path
		}
		cfg.Files = append(cfg.Files, f.path)
		// The file-only sections: the last file that gives one a value
		// gives all of it; nothing is merged across files.
		if f.set["osUpgrade.profiles"] {
			cfg.OSUpgrade = f.osUpgrade
		}
		if f.set["exec.drivers"] {
			cfg.Exec = f.exec
		}
		if f.set["maintenance.windows"] {
			cfg.Maintenance.Windows = f.windows
		}
		for name := range f.set {
			cfg.sources[name] = f.at(f.lines[name])
		}
	}

	for _, k := range keys {
		if !k.layered() {
			continue
		}
		src := source(k, o.Flags, fileSource)
		raw := v.Get(k.name)
		if raw == nil { // an unset tri-state key
			continue
		}
		val, err := coerce(k, raw)
		if err == nil {
			err = k.validate(val)
		}
		if err != nil {
			if src == "default" {
				src = ""
			}
			return nil, &Error{Source: src, Key: k.name, Msg: err.Error()}
		}
		assign(k.field(cfg), val)
		cfg.sources[k.name] = src
	}

	if err := cfg.checkInert(); err != nil {
		return nil, err
	}
	if cfg.NodeName == "" {
		name, err := hostname(o.Hostname)
		if err != nil {
			return nil, &Error{Key: "nodeName", Msg: err.Error() + "; set --node-name or " + lookupKey("nodeName").env(), Err: err}
		}
		cfg.NodeName = name
	}
	return cfg, nil
}

// inertUnless names, for keys that act only when another key has a value,
// that key and value: setting one while the other is off is refused (no
// key that does nothing).
var inertUnless = map[string][2]string{
	"needs.reboot.group":              {"needs.reboot.policy", PolicyRequest},
	"needs.reboot.maxConcurrent":      {"needs.reboot.policy", PolicyRequest},
	"needs.reboot.breakerFailures":    {"needs.reboot.policy", PolicyRequest},
	"gpu.remediation.group":           {"gpu.autoRemediate", "true"},
	"gpu.remediation.maxConcurrent":   {"gpu.autoRemediate", "true"},
	"gpu.remediation.breakerFailures": {"gpu.autoRemediate", "true"},
}

// checkInert refuses a key of inertUnless set to a value other than its
// default while its switch is off.
func (c *Config) checkInert() error {
	on := map[string]bool{
		"needs.reboot.policy": c.Needs.Reboot.Policy == PolicyRequest,
		"gpu.autoRemediate":   c.GPU.AutoRemediate,
	}
	if on["needs.reboot.policy"] && !c.DriverEnabled(DriverReboot, false, false) {
		return &Error{Source: c.sources["needs.reboot.policy"], Key: "needs.reboot.policy",
			Msg: "request needs the reboot driver, and drivers.reboot.enabled is false; enable it, or use report"}
	}
	for _, k := range keys {
		dep, ok := inertUnless[k.name]
		if !ok || on[dep[0]] {
			continue
		}
		def, err := k.defaultValue()
		if err != nil {
			return err
		}
		// The reference's example, uncommented, sets every key to its
		// default: that still loads.
		if src := c.sources[k.name]; src != "" && src != "default" && !reflect.DeepEqual(reflect.ValueOf(k.field(c)).Elem().Interface(), def) {
			return &Error{Source: src, Key: k.name, Msg: "does nothing unless " + dep[0] + " is " + dep[1] + "; set that too, or remove this"}
		}
	}
	return nil
}

// configPath resolves --config > LIFECYCLE_AGENT_CONFIG > the default.
// explicit is true unless the default was used.
func configPath(o Options) (path string, explicit bool) {
	k := lookupKey("config")
	if f := lookupFlag(o.Flags, k); f != nil && f.Changed {
		return f.Value.String(), true
	}
	if p, ok := os.LookupEnv(k.env()); ok && p != "" {
		return p, true
	}
	if o.DefaultPath != "" {
		return o.DefaultPath, false
	}
	return DefaultPath, false
}

func lookupFlag(fs *pflag.FlagSet, k *key) *pflag.Flag {
	if fs == nil || k.flag == "" {
		return nil
	}
	return fs.Lookup(k.flag)
}

// source mirrors viper's precedence to say where k's value came from. Like
// viper, it ignores empty env vars. files maps each key the files set to
// the file and line that won.
func source(k *key, fs *pflag.FlagSet, files map[string]string) string {
	if f := lookupFlag(fs, k); f != nil && f.Changed {
		return "flag --" + k.flag
	}
	if val, ok := os.LookupEnv(k.env()); ok && val != "" {
		return "env " + k.env()
	}
	if at, ok := files[k.name]; ok {
		return at
	}
	return "default"
}

// coerce turns what viper returns into k's Go type: typed values from the
// file and the defaults pass through; strings from env vars and flags are
// parsed by the key's kind.
func coerce(k *key, raw any) (any, error) {
	switch raw.(type) {
	case string:
		return k.kind.fromString(raw.(string))
	case time.Duration:
		if k.kind == kindDuration {
			return raw, nil
		}
	case int:
		if k.kind == kindInt {
			return raw, nil
		}
	case bool:
		if k.kind == kindBool || k.kind == kindTriBool {
			return raw, nil
		}
	case []string:
		if k.kind == kindStrings {
			return raw, nil
		}
	}
	return nil, fmt.Errorf("unexpected value %v (%T)", raw, raw)
}

// assign stores v in the field ptr points at.
func assign(ptr, v any) {
	switch p := ptr.(type) {
	case *string:
		*p = v.(string)
	case *time.Duration:
		*p = v.(time.Duration)
	case *int:
		*p = v.(int)
	case *bool:
		*p = v.(bool)
	case **bool:
		b := v.(bool)
		*p = &b
	case *[]string:
		*p = slices.Clone(v.([]string))
	default:
		panic(fmt.Sprintf("config: field of type %T", ptr))
	}
}

// hostname is the default node name: the host name, trimmed and lowercased
// as the kubelet does when --hostname-override is not given.
func hostname(fn func() (string, error)) (string, error) {
	if fn == nil {
		fn = os.Hostname
	}
	h, err := fn()
	if err != nil {
		return "", fmt.Errorf("cannot read the host name: %w", err)
	}
	h = strings.ToLower(strings.TrimSpace(h))
	if err := checkNodeName(h); err != nil || h == "" {
		return "", fmt.Errorf("host name %q is not a valid node name", h)
	}
	return h, nil
}
