package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/lifecycle-agent/lifecycle-agent/internal/maintenance"
)

// The file-only sections osUpgrade.profiles and exec.drivers hold commands
// that run as root, so they are read from the file and nowhere else, and
// every field is checked here with the file's line numbers.

// field is one sub-key of a structured section: its docs and how to decode
// it into a T.
type field[T any] struct {
	name     string
	typ      string
	def      string // applied when absent or empty, in the file's syntax
	required bool
	doc      string
	sub      []docField // sub-keys of a list of mappings, for the docs
	decode   func(d *fileDecoder, n *yaml.Node, at string, dst *T) error
}

// docField is a field without its type parameter, for the docs.
type docField struct {
	name, typ, def, doc string
	required            bool
	sub                 []docField
}

func docFields[T any](fs []field[T]) []docField {
	out := make([]docField, 0, len(fs))
	for _, f := range fs {
		out = append(out, docField{name: f.name, typ: f.typ, def: f.def, doc: f.doc, required: f.required, sub: f.sub})
	}
	return out
}

// decodeFields decodes the mapping n into dst. It refuses unknown and
// repeated keys, reports missing required ones and applies defaults. It
// returns the line of each key written, for cross-field messages.
func decodeFields[T any](d *fileDecoder, n *yaml.Node, at string, fields []field[T], dst *T) (map[string]int, error) {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		return nil, &Error{Source: d.at(n.Line), Key: at, Msg: "want a mapping of keys, got " + describe(n)}
	}
	lines := map[string]int{}
	set := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := deref(n.Content[i]), deref(n.Content[i+1])
		var f *field[T]
		for j := range fields {
			if fields[j].name == kn.Value && kn.ShortTag() == "!!str" {
				f = &fields[j]
			}
		}
		if f == nil {
			names := make([]string, len(fields))
			for j := range fields {
				names[j] = fields[j].name
			}
			return nil, &Error{Source: d.at(kn.Line), Msg: fmt.Sprintf("unknown key %q%s",
				at+"."+kn.Value, suggest(kn.Value, names, at))}
		}
		if first, dup := lines[f.name]; dup {
			return nil, &Error{Source: d.at(kn.Line), Key: at + "." + f.name,
				Msg: fmt.Sprintf("given twice (first at line %d)", first)}
		}
		lines[f.name] = kn.Line
		if isNull(vn) {
			continue
		}
		if err := f.decode(d, vn, at+"."+f.name, dst); err != nil {
			return nil, err
		}
		set[f.name] = true
	}
	for _, f := range fields {
		switch {
		case set[f.name]:
		case f.required:
			return nil, &Error{Source: d.at(n.Line), Key: at, Msg: fmt.Sprintf("missing required key %q", f.name)}
		case f.def != "":
			def := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: f.def, Line: n.Line}
			if err := f.decode(d, def, at+"."+f.name, dst); err != nil {
				return nil, err
			}
		}
	}
	return lines, nil
}

// --- field decoders -------------------------------------------------------

func fieldErr(d *fileDecoder, n *yaml.Node, at string, err error) error {
	return &Error{Source: d.at(n.Line), Key: at, Msg: err.Error()}
}

func stringField[T any](get func(*T) *string, check func(string) error) func(*fileDecoder, *yaml.Node, string, *T) error {
	return func(d *fileDecoder, n *yaml.Node, at string, dst *T) error {
		s, err := nodeString(n)
		if err == nil && check != nil {
			err = check(s)
		}
		if err != nil {
			return fieldErr(d, n, at, err)
		}
		*get(dst) = s
		return nil
	}
}

func enumField[T any](get func(*T) *string, values ...string) func(*fileDecoder, *yaml.Node, string, *T) error {
	return func(d *fileDecoder, n *yaml.Node, at string, dst *T) error {
		s, err := nodeString(n)
		if err != nil || !slices.Contains(values, s) {
			return fieldErr(d, n, at, fmt.Errorf("want %s, got %s", orList(values), describe(deref(n))))
		}
		*get(dst) = s
		return nil
	}
}

func durationField[T any](get func(*T) *time.Duration, check func(any) error) func(*fileDecoder, *yaml.Node, string, *T) error {
	return func(d *fileDecoder, n *yaml.Node, at string, dst *T) error {
		v, err := nodeDuration(n)
		if err == nil {
			err = check(v)
		}
		if err != nil {
			return fieldErr(d, n, at, err)
		}
		*get(dst) = v
		return nil
	}
}

// argvField decodes a command line: a list whose first item is an absolute
// path. An optional argv may be an empty list (no command).
func argvField[T any](get func(*T) *[]string, optional bool) func(*fileDecoder, *yaml.Node, string, *T) error {
	return func(d *fileDecoder, n *yaml.Node, at string, dst *T) error {
		argv, err := nodeStrings(n)
		if err == nil && (len(argv) > 0 || !optional) {
			err = checkArgv(argv)
		}
		if err != nil {
			return fieldErr(d, n, at, err)
		}
		*get(dst) = argv
		return nil
	}
}

// parsedField decodes a string and converts it with parse (a time of day,
// a time zone).
func parsedField[T, V any](get func(*T) *V, parse func(string) (V, error)) func(*fileDecoder, *yaml.Node, string, *T) error {
	return func(d *fileDecoder, n *yaml.Node, at string, dst *T) error {
		s, err := nodeString(n)
		var v V
		if err == nil {
			v, err = parse(s)
		}
		if err != nil {
			return fieldErr(d, n, at, err)
		}
		*get(dst) = v
		return nil
	}
}

func checkArgv(argv []string) error {
	if len(argv) == 0 {
		return errors.New("want a command: a non-empty list such as [/usr/bin/true]")
	}
	if !filepath.IsAbs(argv[0]) {
		return fmt.Errorf("command %q is not an absolute path ($PATH is not searched)", argv[0])
	}
	return nil
}

// --- osUpgrade.profiles ---------------------------------------------------

var profileFields = []field[OSUpgradeProfile]{
	{
		name: "command", typ: "list of strings", required: true,
		doc: "The command line; the first item is an absolute path. It runs without a shell, after " +
			"the drain, under a logind block inhibitor.",
		decode: argvField(func(p *OSUpgradeProfile) *[]string { return &p.Command }, false),
	},
	{
		name: "timeout", typ: "duration", def: "1h",
		doc:    "The command is killed and the step fails when it runs longer.",
		decode: durationField(func(p *OSUpgradeProfile) *time.Duration { return &p.Timeout }, positive),
	},
	{
		name: "rebootPolicy", typ: "always | never | if-required", def: RebootIfRequired,
		doc: "Reboot after the command: always, never, or if-required: when the command leaves " +
			"/run/reboot-required behind (Debian, Ubuntu).",
		decode: enumField(func(p *OSUpgradeProfile) *string { return &p.RebootPolicy },
			RebootAlways, RebootNever, RebootIfRequired),
	},
	{
		name: "check", typ: "list of strings",
		doc: "Optional command that tells, after the node went down while the command ran (a power " +
			"cut, a crash of the host), whether the upgrade completed: exit 0 yes (the event goes on to " +
			"the reboot and verify), any other exit status no (the command runs again); one that cannot " +
			"be run fails the step. Without a check such an upgrade is never run again blindly: the step " +
			"fails and says so. It gets the command's environment and timeout.",
		decode: argvField(func(p *OSUpgradeProfile) *[]string { return &p.Check }, true),
	},
}

func decodeProfiles(d *fileDecoder, n *yaml.Node, at string) error {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		return fieldErr(d, n, at, fmt.Errorf("want a mapping of profile names, got %s", describe(n)))
	}
	profiles := map[string]OSUpgradeProfile{}
	lines := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := deref(n.Content[i]), n.Content[i+1]
		name := kn.Value
		pat := at + "." + name
		if kn.ShortTag() != "!!str" {
			return fieldErr(d, kn, at, fmt.Errorf("profile name: want a string, got %s", describe(kn)))
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return fieldErr(d, kn, at, fmt.Errorf("invalid profile name %q: %s", name, errs[0]))
		}
		if first, dup := lines[name]; dup {
			return fieldErr(d, kn, pat, fmt.Errorf("given twice (first at line %d)", first))
		}
		lines[name] = kn.Line
		if isNull(vn) {
			return fieldErr(d, kn, pat, errors.New(`missing required key "command"`))
		}
		var p OSUpgradeProfile
		if _, err := decodeFields(d, vn, pat, profileFields, &p); err != nil {
			return err
		}
		profiles[name] = p
	}
	d.osUpgrade.Profiles = profiles
	return nil
}

// --- exec.drivers ---------------------------------------------------------

// maxParams is the API's limit on LifecycleEvent spec.parameters.
const maxParams = 32

var (
	stateRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,62}$`)
	paramRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,62}$`)
	stepRE  = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)
)

var execStepFields = []field[ExecStep]{
	{
		name: "name", typ: "string", required: true,
		doc: "Step name, unique within the driver; shown in the event's status.steps. Letters, " +
			"digits, '.', '_' and '-', at most 63.",
		decode: stringField(func(s *ExecStep) *string { return &s.Name }, func(v string) error {
			if !stepRE.MatchString(v) {
				return fmt.Errorf("invalid step name %q: letters, digits, '.', '_' and '-', at most 63", v)
			}
			return nil
		}),
	},
	{
		name: "command", typ: "list of strings", required: true,
		doc:    "The command line; the first item is an absolute path. It runs without a shell.",
		decode: argvField(func(s *ExecStep) *[]string { return &s.Command }, false),
	},
	{
		name: "timeout", typ: "duration", def: "10m",
		doc:    "The command, and its check, are killed and the step fails when they run longer.",
		decode: durationField(func(s *ExecStep) *time.Duration { return &s.Timeout }, positive),
	},
	{
		name: "check", typ: "list of strings",
		doc: "Optional command that exits 0 when the step has already taken effect, so that a replay " +
			"after a crash or reboot skips it instead of running it twice.",
		decode: argvField(func(s *ExecStep) *[]string { return &s.Check }, true),
	},
}

var execDriverFields = []field[ExecDriver]{
	{
		name: "name", typ: "string", required: true,
		doc: "<name> publishes driver lifecycle-agent.x-k8s.io/<name>; <vendor-domain>/<name> keeps " +
			"the vendor's domain. <name> is a DNS label; it may not reuse a built-in driver's name.",
		decode: stringField(func(e *ExecDriver) *string { return &e.Name }, checkDriverName),
	},
	{
		name: "start", typ: "string", required: true,
		doc:    "CamelCase start state of the transition, e.g. BIOSUpdateStarted.",
		decode: stringField(func(e *ExecDriver) *string { return &e.Start }, checkState),
	},
	{
		name: "end", typ: "string", required: true,
		doc:    "CamelCase end state, different from start, e.g. BIOSUpdateComplete.",
		decode: stringField(func(e *ExecDriver) *string { return &e.End }, checkState),
	},
	{
		name: "sla", typ: "duration", def: "0s",
		doc:    "Published as the transition's spec.sla: time allowed from claim to end state. 0: none.",
		decode: durationField(func(e *ExecDriver) *time.Duration { return &e.SLA }, nonNegative),
	},
	{
		name: "params", typ: "list of strings",
		doc: "Parameter names an event may pass (letters, digits, '_'; at most 32). An event with any " +
			"other parameter is refused.",
		decode: func(d *fileDecoder, n *yaml.Node, at string, e *ExecDriver) error {
			params, err := nodeStrings(n)
			if err == nil {
				err = checkParams(params)
			}
			if err != nil {
				return fieldErr(d, n, at, err)
			}
			e.Params = params
			return nil
		},
	},
	{
		name: "steps", typ: "list of steps", required: true,
		doc:    "The ordered steps; at least one.",
		sub:    docFields(execStepFields),
		decode: decodeSteps,
	},
}

func checkState(s string) error {
	if !stateRE.MatchString(s) {
		return fmt.Errorf("invalid state %q: want CamelCase letters and digits, at most 63, e.g. DrainStarted", s)
	}
	return nil
}

func checkDriverName(s string) error {
	short := s
	if vendor, name, ok := strings.Cut(s, "/"); ok {
		if errs := validation.IsDNS1123Subdomain(vendor); len(errs) > 0 {
			return fmt.Errorf("invalid driver name %q: vendor domain %q: %s", s, vendor, errs[0])
		}
		short = name
	}
	if errs := validation.IsDNS1123Label(short); len(errs) > 0 {
		return fmt.Errorf("invalid driver name %q: %q: %s", s, short, errs[0])
	}
	return nil
}

func checkParams(params []string) error {
	if len(params) > maxParams {
		return fmt.Errorf("%d parameters; at most %d", len(params), maxParams)
	}
	for i, p := range params {
		if !paramRE.MatchString(p) {
			return fmt.Errorf("invalid parameter name %q: letters, digits and '_', starting with a letter", p)
		}
		if slices.Contains(params[:i], p) {
			return fmt.Errorf("parameter %q listed twice", p)
		}
	}
	return nil
}

var builtinDrivers = []string{DriverDrain, DriverUncordon, DriverReboot, DriverShutdown, DriverOSUpgrade, DriverGPUReset}

func decodeSteps(d *fileDecoder, n *yaml.Node, at string, e *ExecDriver) error {
	n = deref(n)
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		return fieldErr(d, n, at, fmt.Errorf("want a list of at least one step, got %s", describe(n)))
	}
	names := map[string]int{}
	for i, item := range n.Content {
		sat := fmt.Sprintf("%s[%d]", at, i)
		var s ExecStep
		lines, err := decodeFields(d, item, sat, execStepFields, &s)
		if err != nil {
			return err
		}
		if first, dup := names[s.Name]; dup {
			return &Error{Source: d.at(lines["name"]), Key: sat + ".name",
				Msg: fmt.Sprintf("step %q is defined twice (first at line %d)", s.Name, first)}
		}
		names[s.Name] = lines["name"]
		e.Steps = append(e.Steps, s)
	}
	return nil
}

func decodeExecDrivers(d *fileDecoder, n *yaml.Node, at string) error {
	n = deref(n)
	if n.Kind != yaml.SequenceNode {
		return fieldErr(d, n, at, fmt.Errorf("want a list of drivers, got %s", describe(n)))
	}
	seen := map[string]int{}
	var drivers []ExecDriver
	for i, item := range n.Content {
		iat := fmt.Sprintf("%s[%d]", at, i)
		var e ExecDriver
		lines, err := decodeFields(d, item, iat, execDriverFields, &e)
		if err != nil {
			return err
		}
		if e.Start == e.End {
			return &Error{Source: d.at(lines["end"]), Key: iat + ".end", Msg: fmt.Sprintf("must differ from start (%s)", e.Start)}
		}
		full := e.FullName()
		// The transition is <node>-<short name>: a short name a built-in
		// driver (or another exec driver) has would publish over it.
		short := full[strings.LastIndex(full, "/")+1:]
		for _, b := range builtinDrivers {
			switch {
			case full == DriverPrefix+b:
				return &Error{Source: d.at(lines["name"]), Key: iat + ".name",
					Msg: fmt.Sprintf("%q is a built-in driver; choose another name", full)}
			case short == b:
				return &Error{Source: d.at(lines["name"]), Key: iat + ".name",
					Msg: fmt.Sprintf("%q would publish its transition as <node>-%s, the built-in %s driver's; choose another name", full, short, b)}
			}
		}
		if first, dup := seen[full]; dup {
			return &Error{Source: d.at(lines["name"]), Key: iat + ".name",
				Msg: fmt.Sprintf("driver %q is defined twice (first at line %d)", full, first)}
		}
		if first, dup := seen["/"+short]; dup {
			return &Error{Source: d.at(lines["name"]), Key: iat + ".name",
				Msg: fmt.Sprintf("driver %q has the short name %q of the driver at line %d: both would publish the transition <node>-%s", full, short, first, short)}
		}
		seen[full], seen["/"+short] = lines["name"], lines["name"]
		drivers = append(drivers, e)
	}
	d.exec.Drivers = drivers
	return nil
}

// --- maintenance.windows -------------------------------------------------

var windowFields = []field[maintenance.Window]{
	{
		name: "days", typ: "list of strings", def: "",
		doc: "Days the window opens on: sun, mon, tue, wed, thu, fri, sat (or the full names). " +
			"Absent: every day. A window that crosses midnight belongs to the day it opens.",
		decode: func(d *fileDecoder, n *yaml.Node, at string, dst *maintenance.Window) error {
			names, err := nodeStrings(n)
			if err == nil && len(names) == 0 {
				err = errors.New("want at least one day (leave the key out for every day)")
			}
			if err == nil {
				dst.Days, err = maintenance.ParseDays(names)
			}
			if err != nil {
				return fieldErr(d, n, at, err)
			}
			return nil
		},
	},
	{
		name: "start", typ: "string", required: true,
		doc:    "Time of day the window opens, HH:MM (24-hour; HH:MM:SS also read), in timeZone.",
		decode: parsedField(func(w *maintenance.Window) *time.Duration { return &w.Start }, maintenance.ParseClock),
	},
	{
		name: "end", typ: "string", required: true,
		doc: "Time of day the window closes, HH:MM. Not after start: it closes the next day " +
			"(22:00 to 04:00); equal to start: open 24 hours.",
		decode: parsedField(func(w *maintenance.Window) *time.Duration { return &w.End }, maintenance.ParseClock),
	},
	{
		name: "timeZone", typ: "string", def: "UTC",
		doc:    "IANA time zone of start and end (Europe/Berlin), as kured's --time-zone; \"Local\" is refused.",
		decode: parsedField(func(w *maintenance.Window) **time.Location { return &w.Loc }, maintenance.LoadZone),
	},
}

func decodeWindows(d *fileDecoder, n *yaml.Node, at string) error {
	n = deref(n)
	if n.Kind != yaml.SequenceNode {
		return fieldErr(d, n, at, fmt.Errorf("want a list of windows, got %s", describe(n)))
	}
	var out maintenance.Windows
	for i, item := range n.Content {
		var w maintenance.Window
		if _, err := decodeFields(d, item, fmt.Sprintf("%s[%d]", at, i), windowFields, &w); err != nil {
			return err
		}
		out = append(out, w)
	}
	d.windows = out
	return nil
}
