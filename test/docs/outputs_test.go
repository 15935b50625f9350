package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// Sample outputs in docs/*.md (see the package doc, "Sample outputs").
//
// An output block is a fenced block whose info string is text, console,
// json or empty. The line right before its opening fence (blank lines
// aside) must be one of
//
//	<!-- output: test/docs -->            the output of the ```sh block right before it
//	                                      (only blank lines and this comment between),
//	                                      or, when its first line starts with "$ ", of
//	                                      the "$ " lines in it, each followed by its output
//	<!-- output: test/docs: COMMAND -->   the output of COMMAND (bash), hidden from the reader
//	<!-- output: from SOURCE -->          produced elsewhere (SOURCE says where: a test,
//	                                      a machine, a date); not checked here
//
// A checked marker may end with "(progress varies)": then only the first
// line (and a "$ " line before it) and the last line are compared, for
// outputs whose lines in between depend on timing (which progress messages
// a poll happens to see).
//
// TestQuickStart runs the checked ones and compares; TestOutputMarkers
// checks that every output block carries a marker.

const (
	markerCheck  = "test/docs"
	markerFrom   = "from "
	markerVaries = "(progress varies)"
)

// docNode is the node name a file's samples use where it is not the quick
// start's (worker-1): the outputs are shown with it.
var docNode = map[string]string{
	"docs/plugin.md": "node-a",
}

// outputDocs are the files whose output blocks must all carry a marker:
// docs/*.md except benchmarks.md (its tables are bench's, checked there).
// unmarkedAllowed lists the output blocks (file and first line) that may
// still lack one, with why: each is a sample nothing checks.
var unmarkedAllowed = map[string]string{}

var (
	markerRe = regexp.MustCompile(`^<!--\s*output:\s*(.*?)\s*-->$`)
)

// mdBlock is one fenced block of a Markdown file.
type mdBlock struct {
	file       string
	start, end int // the fences' lines, 1-based
	info       string
	lines      []string
	marker     string // what follows "output:" in the marker comment; "" if none
	markerLine int
	afterSh    *mdBlock // the ```sh block right before it (only blank lines and the marker between)
}

func (b *mdBlock) isOutput() bool {
	switch b.info {
	case "text", "console", "json", "":
		return true
	}
	return false
}

// checked reports whether the block is compared by the test, and the
// hidden command of a "test/docs: COMMAND" marker.
func (b *mdBlock) checked() (ok bool, command string, varies bool) {
	m := b.marker
	if strings.HasSuffix(m, markerVaries) {
		m, varies = strings.TrimSpace(strings.TrimSuffix(m, markerVaries)), true
	}
	if m == markerCheck {
		return true, "", varies
	}
	if c, found := strings.CutPrefix(m, markerCheck+":"); found {
		return true, strings.TrimSpace(c), varies
	}
	return false, "", false
}

// mdBlocks returns the fenced blocks of a Markdown file.
func mdBlocks(file string, md []byte) ([]*mdBlock, error) {
	var (
		out     []*mdBlock
		cur     *mdBlock
		prev    *mdBlock // the last block, while only blank lines/a marker follow it
		lastNon string   // the last non-blank line outside blocks
		lastN   int
	)
	sc := bufio.NewScanner(bytes.NewReader(md))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if cur != nil {
			if trimmed == "```" {
				cur.end = n
				out = append(out, cur)
				prev, cur = cur, nil
				lastNon, lastN = "", 0
				continue
			}
			cur.lines = append(cur.lines, line)
			continue
		}
		if strings.HasPrefix(trimmed, "```") {
			cur = &mdBlock{file: file, start: n, info: strings.TrimSpace(strings.TrimPrefix(trimmed, "```"))}
			if m := markerRe.FindStringSubmatch(lastNon); m != nil {
				cur.marker, cur.markerLine = m[1], lastN
			}
			if prev != nil && prev.info == "sh" && (lastNon == "" || cur.marker != "") {
				cur.afterSh = prev
			}
			continue
		}
		if trimmed != "" {
			if lastNon != "" || !markerRe.MatchString(trimmed) {
				prev = nil
			}
			lastNon, lastN = trimmed, n
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: unterminated code block", file, cur.start)
	}
	return out, sc.Err()
}

// outputFiles returns docs/*.md without benchmarks.md, relative to root.
func outputFiles(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rel []string
	for _, f := range files {
		r, _ := filepath.Rel(root, f)
		if r == filepath.Join("docs", "benchmarks.md") {
			continue
		}
		rel = append(rel, r)
	}
	sort.Strings(rel)
	return rel
}

// TestOutputMarkers: every output block says whether test/docs produces it
// or where it comes from, and a checked one says from which command.
func TestOutputMarkers(t *testing.T) {
	root := testenv.RepoRoot()
	checked, from := 0, 0
	for _, f := range outputFiles(t, root) {
		md, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := mdBlocks(f, md)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			if !b.isOutput() {
				if b.marker != "" {
					t.Errorf("%s:%d: an output marker on a ```%s block: only text, console, json and bare blocks are outputs", f, b.markerLine, b.info)
				}
				continue
			}
			first := ""
			if len(b.lines) > 0 {
				first = b.lines[0]
			}
			ok, cmd, _ := b.checked()
			switch {
			case ok && cmd == "" && b.afterSh == nil && !strings.HasPrefix(first, "$ "):
				t.Errorf("%s:%d: <!-- output: test/docs --> but no ```sh block right before it and no \"$ \" line in it: which command's output is it?", f, b.start)
			case ok:
				checked++
			case strings.HasPrefix(b.marker, markerFrom) && strings.TrimSpace(strings.TrimPrefix(b.marker, markerFrom)) != "":
				from++
			case b.marker != "":
				t.Errorf("%s:%d: output marker %q: want \"test/docs\", \"test/docs: COMMAND\" or \"from SOURCE\"", f, b.markerLine, b.marker)
			case unmarkedAllowed[f+"\x00"+first] != "":
				t.Logf("%s:%d: unchecked sample (allowed: %s)", f, b.start, unmarkedAllowed[f+"\x00"+first])
			default:
				t.Errorf("%s:%d: a ```%s block without an output marker: put <!-- output: test/docs --> (or \"test/docs: COMMAND\", or \"from SOURCE\") on the line before it, or give it a language (sh, yaml, …) if it is not an output", f, b.start, b.info)
			}
		}
	}
	t.Logf("output blocks: %d checked by TestQuickStart, %d from elsewhere", checked, from)
}

func TestMdBlocksParse(t *testing.T) {
	md := "x\n```sh\nfoo\n```\n\n<!-- output: test/docs -->\n```text\nout\n```\ntext\n```text\nlone\n```\n```sh\nbar\n```\nprose\n```\nbare\n```\n"
	bs, err := mdBlocks("f.md", []byte(md))
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 5 {
		t.Fatalf("%d blocks, want 5", len(bs))
	}
	if bs[1].marker != "test/docs" || bs[1].afterSh != bs[0] || bs[1].markerLine != 6 || bs[1].start != 7 || bs[1].end != 9 {
		t.Errorf("block 2: %+v", bs[1])
	}
	if bs[2].afterSh != nil || bs[2].marker != "" {
		t.Errorf("block 3 (after prose): %+v", bs[2])
	}
	if bs[4].afterSh != nil || bs[4].info != "" {
		t.Errorf("block 5 (bare, after prose): %+v", bs[4])
	}
}

// Normalising an output for comparison: what changes from run to run.
var normalisers = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`), "<time>"},
	{regexp.MustCompile(`\b\d\d:\d\d:\d\d\b`), "<clock>"},
	{regexp.MustCompile(`\b\d{8}-\d{6}-\d{6}\b`), "<stamp>"},
	{regexp.MustCompile(`\b(drain|uncordon|reboot|os-upgrade|gpu-reset)-[a-z0-9]{5}\b`), "$1-<rand>"},
	{regexp.MustCompile(`\b(pod [a-z0-9-]+/[a-z0-9-]+)-[bcdfghjklmnpqrstvwxz2456789]{5}\b`), "$1-<rand>"},
	{regexp.MustCompile(`\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`), "<uuid>"},
	{regexp.MustCompile(`/[0-9a-f]{8}\b`), "/<id>"},
	{regexp.MustCompile(`<1s|\b\d+(\.\d+)?(ns|µs|us|ms|s)\b`), "<d>"},
	{regexp.MustCompile(`\[\s+`), "["},
	{regexp.MustCompile(`[ \t]+`), " "},
}

func normaliseLine(s string) string {
	for _, n := range normalisers {
		s = n.re.ReplaceAllString(s, n.repl)
	}
	return strings.TrimSpace(s)
}

// outputMatches compares a doc's block with an output, line by line after
// normalising; a "…" in the doc's line stands for any text.
func outputMatches(doc, got []string) bool {
	doc, got = trimBlank(doc), trimBlank(got)
	if len(doc) != len(got) {
		return false
	}
	for i := range doc {
		d, g := normaliseLine(doc[i]), normaliseLine(got[i])
		if !strings.Contains(d, "…") {
			if d != g {
				return false
			}
			continue
		}
		parts := strings.Split(d, "…")
		for j := range parts {
			parts[j] = regexp.QuoteMeta(parts[j])
		}
		if !regexp.MustCompile(`^` + strings.Join(parts, `.*`) + `$`).MatchString(g) {
			return false
		}
	}
	return true
}

// renameNode shows the node from as to in lines, keeping a table's columns
// aligned where to is shorter (a cell is followed by two spaces or more).
func renameNode(lines []string, from, to string) []string {
	cell := regexp.MustCompile(regexp.QuoteMeta(from) + `(\S*)(  +)`)
	pad := strings.Repeat(" ", max(len(from)-len(to), 0))
	out := make([]string, len(lines))
	for i, l := range lines {
		l = cell.ReplaceAllString(l, to+"${1}${2}"+pad)
		out[i] = strings.ReplaceAll(l, from, to)
	}
	return out
}

// variesMatches compares the first line (with a "$ " line before it) and
// the last line of a doc's block and an output: a "(progress varies)"
// block.
func variesMatches(doc, got []string) bool {
	doc, got = trimBlank(doc), trimBlank(got)
	head := 1
	if len(doc) > 0 && strings.HasPrefix(doc[0], "$ ") {
		head = 2
	}
	if len(doc) <= head || len(got) <= head {
		return outputMatches(doc, got)
	}
	return outputMatches(doc[:head], got[:head]) && outputMatches(doc[len(doc)-1:], got[len(got)-1:])
}

func trimBlank(ls []string) []string {
	for len(ls) > 0 && strings.TrimSpace(ls[len(ls)-1]) == "" {
		ls = ls[:len(ls)-1]
	}
	return ls
}

func TestRenameNode(t *testing.T) {
	got := renameNode([]string{"NODE       X", "worker-1   worker-1-drain   y", "event worker-1-drain-x"}, "worker-1", "node-a")
	want := []string{"NODE       X", "node-a     node-a-drain     y", "event node-a-drain-x"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestOutputMatches(t *testing.T) {
	for _, c := range []struct {
		doc, got string
		want     bool
	}{
		{"[ 259ms] claimed by worker-1/de85abef, SLA deadline 2026-11-30T11:49:12Z", "[  1.2s] claimed by worker-1/0123abcd, SLA deadline 2027-01-02T03:04:05Z", true},
		{"worker-1-drain-20261130-113908-438243 created", "worker-1-drain-20270102-030405-000001 created", true},
		{"lifecycleevent worker-1-uncordon-g2jfq created", "lifecycleevent worker-1-uncordon-x7k2p created", true},
		{"eviction of pod shop/db-7p2np blocked", "eviction of pod shop/db-x5wz9 blocked", true},
		{"eviction of pod shop/db-7p2np blocked", "eviction of pod shop/web-1 blocked", false},
		{"NAME   AGE\nx      2s", "NAME AGE\nx  14s\n", true},
		{"✗ journal: corrupt: /a: … — fix: restart", "✗ journal: corrupt: /a: bad page 3 — fix: restart", true},
		{"✗ journal: corrupt: /a: … — fix: restart", "✗ journal: corrupt: /b: bad page 3 — fix: restart", false},
		{"SLA 1h", "SLA 2h", false},
		{"a\nb", "a", false},
	} {
		if got := outputMatches(strings.Split(c.doc, "\n"), strings.Split(c.got, "\n")); got != c.want {
			t.Errorf("%q vs %q: %v, want %v", c.doc, c.got, got, c.want)
		}
	}
	for _, c := range []struct {
		doc, got string
		want     bool
	}{
		{"$ x\nstart 1s\nmiddle\nend", "$ x\nstart 2s\nend", true},
		{"start\nmiddle\nend", "start\nother\nmore\nend", true},
		{"start\nmiddle\nend", "start\nother\nEND", false},
		{"$ x\nstart\nend", "$ y\nstart\nend", false},
	} {
		if got := variesMatches(strings.Split(c.doc, "\n"), strings.Split(c.got, "\n")); got != c.want {
			t.Errorf("varies: %q vs %q: %v, want %v", c.doc, c.got, got, c.want)
		}
	}
}

// outputRun is what checkOutputs needs from TestQuickStart.
type outputRun struct {
	// quickstart maps each command of docs/quickstart.md (its line) to its
	// output, as it ran in order.
	quickstart []command
	outputs    map[int]string
	// run runs a command (bash) in the quick start's environment and
	// returns its combined output; its exit code is not checked.
	run func(text string) string
	// node is the quick start's node, shown as docNode[file] in that file.
	node string
	// present turns the test's temporary paths and addresses into a node's
	// defaults, as the docs show them.
	present func(string) string
}

// checkOutputs compares every checked output block of the docs with what
// its command prints, after the quick start ran: the quick start's blocks
// with the outputs its commands printed, in order; the other files' blocks
// by running their commands now (a command that is also one of the quick
// start's is not run again: its output from the quick start is used). With
// UPDATE_DOCS=1 it rewrites every checked block with this run's output
// instead (a block with a "…" only when it differs: the elision is kept).
func checkOutputs(t *testing.T, root string, r outputRun) {
	t.Helper()
	update := os.Getenv("UPDATE_DOCS") == "1"
	qsByText := map[string]string{}
	for _, c := range r.quickstart {
		if _, dup := qsByText[c.text]; !dup {
			qsByText[c.text] = r.present(r.outputs[c.line])
		}
	}
	files := outputFiles(t, root)
	sort.SliceStable(files, func(i, j int) bool { return files[i] == quickstartFile && files[j] != quickstartFile })
	checkedN := 0
	for _, f := range files {
		md, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := mdBlocks(f, md)
		if err != nil {
			t.Fatal(err)
		}
		type edit struct {
			b     *mdBlock
			lines []string
		}
		var edits []edit
		output := func(text string) string {
			if out, ok := qsByText[text]; ok {
				return out
			}
			return r.present(r.run(text))
		}
		for _, b := range blocks {
			ok, hidden, varies := b.checked()
			if !ok || !b.isOutput() {
				continue
			}
			checkedN++
			var got string
			switch {
			case hidden != "":
				got = output(hidden)
			case len(b.lines) > 0 && strings.HasPrefix(b.lines[0], "$ "):
				for _, l := range b.lines {
					if c, ok := strings.CutPrefix(l, "$ "); ok {
						got += l + "\n" + output(c)
					}
				}
			case b.afterSh != nil && f == quickstartFile:
				for _, c := range r.quickstart {
					if c.line > b.afterSh.start && c.line < b.afterSh.end {
						got += r.present(r.outputs[c.line])
					}
				}
			case b.afterSh != nil:
				cmds, err := quickstartCommands([]byte("```sh\n" + strings.Join(b.afterSh.lines, "\n") + "\n```\n"))
				if err != nil {
					t.Errorf("%s:%d: %v", f, b.afterSh.start, err)
					continue
				}
				for _, c := range cmds {
					got += output(c.text)
				}
			default:
				t.Errorf("%s:%d: checked output block without a command (TestOutputMarkers says more)", f, b.start)
				continue
			}
			gotLines := trimBlank(strings.Split(strings.TrimRight(got, "\n"), "\n"))
			if node := docNode[f]; node != "" {
				gotLines = renameNode(gotLines, r.node, node)
			}
			elided := strings.Contains(strings.Join(b.lines, "\n"), "…")
			if update && !elided {
				// Every block from this one run, so that the samples
				// agree with each other (the same event names, times).
				edits = append(edits, edit{b, gotLines})
				continue
			}
			if varies && variesMatches(b.lines, gotLines) || outputMatches(b.lines, gotLines) {
				continue
			}
			if update {
				edits = append(edits, edit{b, gotLines})
				t.Logf("%s:%d: UPDATE_DOCS=1: rewriting the block", f, b.start)
				continue
			}
			t.Errorf("%s:%d: the sample output differs from what the command prints (normalised for times, durations, names and spacing):\n%s\nThe block should read (or run with UPDATE_DOCS=1):\n```%s\n%s\n```",
				f, b.start, lineDiff(b.lines, gotLines), b.info, strings.Join(gotLines, "\n"))
		}
		if len(edits) == 0 {
			continue
		}
		lines := strings.Split(string(md), "\n")
		for i := len(edits) - 1; i >= 0; i-- {
			e := edits[i]
			// lines is 0-based: the block's content is lines[start : end-1].
			lines = append(lines[:e.b.start], append(append([]string{}, e.lines...), lines[e.b.end-1:]...)...)
		}
		if err := os.WriteFile(filepath.Join(root, f), []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if checkedN == 0 {
		t.Errorf("no checked output block in the docs: the markers were lost?")
	}
}

// lineDiff shows a doc's block against an output, line by line.
func lineDiff(doc, got []string) string {
	doc, got = trimBlank(doc), trimBlank(got)
	var b strings.Builder
	for i := 0; i < len(doc) || i < len(got); i++ {
		var d, g string
		if i < len(doc) {
			d = doc[i]
		}
		if i < len(got) {
			g = got[i]
		}
		switch {
		case i < len(doc) && i < len(got) && outputMatches([]string{d}, []string{g}):
			fmt.Fprintf(&b, "  %s\n", d)
		default:
			if i < len(doc) {
				fmt.Fprintf(&b, "- %s\n", d)
			}
			if i < len(got) {
				fmt.Fprintf(&b, "+ %s\n", g)
			}
		}
	}
	return b.String()
}
