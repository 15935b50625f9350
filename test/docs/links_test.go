package docs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

var (
	inlineLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	metricName = regexp.MustCompile(`lifecycle_agent_[a-z0-9_]+`)
)

// markdownFiles returns docs/*.md and README.md, relative to root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	var rel []string
	for _, f := range files {
		r, _ := filepath.Rel(root, f)
		rel = append(rel, r)
	}
	sort.Strings(rel)
	return rel
}

// proseLines returns a Markdown file's lines outside fenced code blocks,
// with inline code spans blanked, keyed by line number.
func proseLines(md []byte) map[int]string {
	out := map[int]string{}
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(md))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out[n] = codeSpan.ReplaceAllString(line, "``")
		}
	}
	return out
}

// anchors returns the GitHub anchors of a Markdown file's headings.
func anchors(md []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	lines := proseLines(md)
	raw := strings.Split(string(md), "\n")
	for n := range lines {
		line := raw[n-1]
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		slug := b.String()
		if k := seen[slug]; k > 0 {
			out[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// TestRelativeLinks: every relative link in docs/*.md and README.md points
// to an existing file, and a #fragment into a Markdown file to a heading.
func TestRelativeLinks(t *testing.T) {
	root := testenv.RepoRoot()
	checked := 0
	for _, rel := range markdownFiles(t, root) {
		md, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		lines := proseLines(md)
		nums := make([]int, 0, len(lines))
		for n := range lines {
			nums = append(nums, n)
		}
		sort.Ints(nums)
		for _, n := range nums {
			for _, m := range inlineLink.FindAllStringSubmatch(lines[n], -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, frag, _ := strings.Cut(target, "#")
				file := filepath.Join(root, rel)
				if path != "" {
					file = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
					if _, err := os.Stat(file); err != nil {
						t.Errorf("%s:%d: link %q: %v", rel, n, target, err)
						continue
					}
				}
				if frag == "" || !strings.HasSuffix(file, ".md") {
					continue
				}
				body, err := os.ReadFile(file)
				if err != nil {
					t.Errorf("%s:%d: link %q: %v", rel, n, target, err)
					continue
				}
				if !anchors(body)[frag] {
					t.Errorf("%s:%d: link %q: no heading with anchor #%s in %s", rel, n, target, frag, path)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the pattern or the file list is broken")
	}
	t.Logf("%d relative links checked", checked)
}

// codeMetrics returns the metric names the agent's code registers: every
// "lifecycle_agent_..." string literal in non-test Go files under internal/.
func codeMetrics(t *testing.T, root string) map[string]bool {
	t.Helper()
	lit := regexp.MustCompile(`"(lifecycle_agent_[a-z0-9_]+)"`)
	out := map[string]bool{}
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 5 {
		t.Fatalf("found only %d metric names in internal/: %v", len(out), out)
	}
	return out
}

// knownMetric accepts a registered name or a histogram's series of it.
func knownMetric(known map[string]bool, name string) bool {
	if known[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && known[base] {
			return true
		}
	}
	return false
}

// TestGrafanaDashboard: docs/grafana-dashboard.json parses, has the panels
// docs/metrics.md promises, and queries only metrics the code registers;
// and every lifecycle_agent_* name in the docs is one of them.
func TestGrafanaDashboard(t *testing.T) {
	root := testenv.RepoRoot()
	known := codeMetrics(t, root)
	raw, err := os.ReadFile(filepath.Join(root, "docs", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if !json.Valid(raw) {
		t.Fatal("docs/grafana-dashboard.json is not valid JSON")
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("docs/grafana-dashboard.json: %v", err)
	}
	if dash.Title == "" {
		t.Error("the dashboard has no title")
	}
	want := []string{"events by outcome", "step duration", "claim latency", "outbox depth", "journal commit", "gpu health"}
	for _, w := range want {
		found := false
		for _, p := range dash.Panels {
			if strings.Contains(strings.ToLower(p.Title), w) {
				found = true
			}
		}
		if !found {
			t.Errorf("no panel titled like %q", w)
		}
	}
	for _, p := range dash.Panels {
		if p.Type == "row" || p.Type == "text" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			names := metricName.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no lifecycle_agent_ metric", p.Title, tg.Expr)
			}
			for _, n := range names {
				if !knownMetric(known, n) {
					t.Errorf("panel %q: query names %s, which the code does not register", p.Title, n)
				}
			}
		}
	}
	for _, rel := range markdownFiles(t, root) {
		md, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(md), "\n") {
			for _, n := range metricName.FindAllString(line, -1) {
				if !knownMetric(known, n) {
					t.Errorf("%s:%d: %s is not a metric the code registers", rel, i+1, n)
				}
			}
		}
	}
}
