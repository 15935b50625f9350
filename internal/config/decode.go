package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Error is every error Load returns: one line, naming where the bad value
// came from and the key it belongs to.
//
//	config: /etc/lifecycle-agent/config.yaml:3: unknown key "host.mdoe" (did you mean "host.mode"?)
//	config: env LIFECYCLE_AGENT_EVENT_RETENTION: key eventRetention: invalid duration "banana" (...)
//	config: /etc/lifecycle-agent/config.yaml: file is group- or world-writable (mode 0664); run chmod 600 ...
type Error struct {
	Source string // "<file>:<line>", "<file>", "env NAME", "flag --name", or ""
	Key    string // dotted key, "" when the problem is not one key's
	Msg    string
	Err    error // underlying error, if any
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.Source != "" {
		b.WriteString(e.Source)
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString("key ")
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// kind is how a key's value is typed: how it is read from a YAML node (the
// file) and from a string (env vars, flags, defaults). Values are string,
// time.Duration, int, bool or []string.
type kind struct {
	doc        string
	fromNode   func(n *yaml.Node) (any, error)
	fromString func(s string) (any, error)
}

var (
	kindString = &kind{
		doc:        "string",
		fromNode:   func(n *yaml.Node) (any, error) { return nodeString(n) },
		fromString: func(s string) (any, error) { return s, nil },
	}
	kindDuration = &kind{
		doc:        "duration",
		fromNode:   func(n *yaml.Node) (any, error) { return nodeDuration(n) },
		fromString: func(s string) (any, error) { return parseDuration(s) },
	}
	kindBool = &kind{
		doc:        "bool",
		fromNode:   func(n *yaml.Node) (any, error) { return nodeBool(n) },
		fromString: func(s string) (any, error) { return parseBool(s) },
	}
	// kindTriBool is a bool that may be left unset (empty in the file).
	kindTriBool = &kind{
		doc:        "bool or empty",
		fromNode:   kindBool.fromNode,
		fromString: kindBool.fromString,
	}
	kindInt = &kind{
		doc:        "integer",
		fromNode:   func(n *yaml.Node) (any, error) { return nodeInt(n) },
		fromString: func(s string) (any, error) { return parseInt(s) },
	}
	kindStrings = &kind{
		doc:        "list of strings",
		fromNode:   func(n *yaml.Node) (any, error) { return nodeStrings(n) },
		fromString: func(s string) (any, error) { return splitList(s), nil },
	}
	// Structured, file-only kinds: read by the key's decode function.
	kindProfiles    = &kind{doc: "map of name to profile"}
	kindExecDrivers = &kind{doc: "list of drivers"}
	kindWindows     = &kind{doc: "list of windows"}
)

const durationHint = "want a number and a unit, e.g. 90s, 10m, 24h"

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (%s)", s, durationHint)
	}
	return d, nil
}

func parseInt(s string) (int, error) {
	i, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("want a whole number, got %q", s)
	}
	return i, nil
}

func parseBool(s string) (bool, error) {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("want true or false, got %q", s)
	}
	return b, nil
}

// splitList reads a comma-separated env value; blanks around items and
// empty items are dropped.
func splitList(s string) []string {
	out := []string{}
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// deref follows YAML aliases (*anchor).
func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	n = deref(n)
	return n == nil || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// describe names what a node holds, for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!int", "!!float":
			return "number " + n.Value
		case "!!bool":
			return "boolean " + n.Value
		case "!!null":
			return "nothing"
		case "!!str":
			return strconv.Quote(n.Value)
		}
		return n.Value
	}
	return "an unsupported YAML node"
}

// nodeString accepts a YAML string only: `host.mode: 5` is refused rather
// than read as "5"; quote values that look like numbers or booleans.
func nodeString(n *yaml.Node) (string, error) {
	n = deref(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return "", fmt.Errorf("want a string, got %s", describe(n))
	}
	return n.Value, nil
}

// nodeDuration accepts a Go duration string (90s, 10m, 24h, 1h30m) or 0.
func nodeDuration(n *yaml.Node) (time.Duration, error) {
	n = deref(n)
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!str" && n.ShortTag() != "!!int") {
		return 0, fmt.Errorf("want a duration such as 90s, 10m or 24h, got %s", describe(n))
	}
	return parseDuration(n.Value)
}

// nodeInt accepts a YAML integer only: `maxConcurrent: "2"` is refused.
func nodeInt(n *yaml.Node) (int, error) {
	n = deref(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		return 0, fmt.Errorf("want a whole number, got %s", describe(n))
	}
	return parseInt(n.Value)
}

// nodeBool accepts true or false only (YAML 1.2: yes/no/on/off are strings).
func nodeBool(n *yaml.Node) (bool, error) {
	n = deref(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		return false, fmt.Errorf("want true or false, got %s", describe(n))
	}
	return strconv.ParseBool(strings.ToLower(n.Value))
}

// nodeStrings accepts a list of scalars. Items are taken as written, so
// `[/bin/sleep, 5]` is the argv "/bin/sleep" "5"; null items are refused.
func nodeStrings(n *yaml.Node) ([]string, error) {
	n = deref(n)
	if n.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("want a list of strings, got %s", describe(n))
	}
	out := make([]string, 0, len(n.Content))
	for i, item := range n.Content {
		item = deref(item)
		if item.Kind != yaml.ScalarNode || item.ShortTag() == "!!null" {
			return nil, fmt.Errorf("item %d: want a string, got %s", i, describe(item))
		}
		out = append(out, item.Value)
	}
	return out, nil
}

// editDistance is the Levenshtein distance, case-insensitive; used to
// suggest the key an operator probably meant.
func editDistance(a, b string) int {
	ra, rb := []rune(strings.ToLower(a)), []rune(strings.ToLower(b))
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// suggest returns ` (did you mean "x"?)` for the closest candidate within
// an edit distance of 2, or "".
func suggest(got string, candidates []string, prefix string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(got, c); d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", join(prefix, best))
}

// join builds a dotted key path.
func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}
