package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"sigs.k8s.io/yaml"
)

// readmeMaxBytes bounds README.md: it is the front door (what and why, the
// guarantee, quick start, the flow, an index of docs/, the layout); the
// rest lives in docs/.
const readmeMaxBytes = 15 << 10

// docFiles are the Markdown files whose relative links must resolve.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"../README.md"}
	for _, pattern := range []string{"../docs/*.md", "../clients/*/README.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if !slices.Contains(files, "../docs/design.md") {
		t.Fatalf("no docs/design.md among %v", files)
	}
	return files
}

// TestREADMEFrontDoor: README.md stays a front door, and shows the one
// command that runs the tests (CI's hook runs `make test` from it).
func TestREADMEFrontDoor(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > readmeMaxBytes {
		t.Errorf("README.md is %d bytes; want at most %d: move detail into docs/", len(b), readmeMaxBytes)
	}
	for _, want := range []string{"    make test\n", "    go run ./cmd/coordd\n"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("README.md does not show %q", strings.TrimSpace(want))
		}
	}
}

// TestDocLinks checks every relative link of README.md, docs/*.md and the
// clients' READMEs: the file it names exists, and its #anchor, if any, is
// a heading of that file (GitHub's slugs) or an explicit <a id>.
func TestDocLinks(t *testing.T) {
	anchors := map[string]map[string]bool{} // cleaned path → its anchors
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := markdownAnchors(string(b))
		anchors[path] = a
		return a, nil
	}
	links := 0
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, link := range markdownLinks(string(b)) {
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			links++
			target, anchor, _ := strings.Cut(link, "#")
			path := filepath.Clean(file)
			if target != "" {
				path = filepath.Join(filepath.Dir(file), target)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %q: %v", file, link, err)
				continue
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(path, ".md") {
				t.Errorf("%s: link %q: an anchor into a file that is not Markdown", file, link)
				continue
			}
			a, err := anchorsOf(path)
			if err != nil {
				t.Fatal(err)
			}
			if !a[anchor] {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", file, link, path, anchor)
			}
		}
	}
	if links < 50 {
		t.Errorf("found %d relative links; want the docs' cross-links (is the link parser broken?)", links)
	}
}

// TestAlertRunbooks: every alert rule's runbook_url (relative to the
// repository root) names a section of docs/observability.md or
// docs/operations.md that exists, the one headed with the alert's name.
func TestAlertRunbooks(t *testing.T) {
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{} // runbook file → its anchors
	for _, f := range []string{"docs/observability.md", "docs/operations.md"} {
		doc, err := os.ReadFile("../" + f)
		if err != nil {
			t.Fatal(err)
		}
		anchors[f] = markdownAnchors(string(doc))
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			url := r.Annotations["runbook_url"]
			file, anchor, _ := strings.Cut(url, "#")
			a, ok := anchors[file]
			switch {
			case !ok:
				t.Errorf("alert %s: runbook_url %q; want docs/observability.md#… or docs/operations.md#…", r.Alert, url)
			case anchor != githubSlug(r.Alert):
				t.Errorf("alert %s: runbook_url %q; want the anchor #%s, its section", r.Alert, url, githubSlug(r.Alert))
			case !a[anchor]:
				t.Errorf("alert %s: runbook_url %q: %s has no such heading", r.Alert, url, file)
			}
			if _, ok := r.Annotations["runbook"]; ok {
				t.Errorf("alert %s: a runbook annotation; the convention is runbook_url", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("alerts.yml: no rules")
	}
}

func TestGithubSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"Redis failover", "redis-failover"},
		{"CoorddTimerWakeups", "coorddtimerwakeups"},
		{"Tenants, tokens and TLS", "tenants-tokens-and-tls"},
		{"The benchmark report (`cmd/coordbench`, [`bench/REPORT.md`](bench/REPORT.md))", "the-benchmark-report-cmdcoordbench-benchreportmd"},
		{"HTTP, for anything that has no gRPC", "http-for-anything-that-has-no-grpc"},
		{"Followers: the push", "followers-the-push"},
		{"snake_case and-hyphen", "snake_case-and-hyphen"},
	} {
		if got := githubSlug(tc.heading); got != tc.want {
			t.Errorf("githubSlug(%q) = %q; want %q", tc.heading, got, tc.want)
		}
	}
	a := markdownAnchors("# A\n\n```\n# not a heading\n```\n\n## A\n\n## B\n<a id=\"x-y\"></a>\n")
	for _, want := range []string{"a", "a-1", "b", "x-y"} {
		if !a[want] {
			t.Errorf("markdownAnchors: no %q in %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("markdownAnchors: a # line in a code block taken for a heading")
	}
	got := markdownLinks("[a](x.md) `[b](code.md)` [`c`](y.md#z)\n```\n[d](fenced.md)\n```\n    [e](indented.md)\n")
	if want := []string{"x.md", "y.md#z"}; !slices.Equal(got, want) {
		t.Errorf("markdownLinks = %q; want %q", got, want)
	}
}

var (
	linkRE       = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeSpanRE   = regexp.MustCompile("`[^`\n]*`")
	headingRE    = regexp.MustCompile(`^#{1,6}\s+(.+?)\s*#*\s*$`)
	htmlAnchorRE = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// prose returns md's lines outside code blocks: fenced ones, and indented
// ones (four spaces after a blank line, as in CommonMark, where an indented
// line cannot interrupt a paragraph).
func prose(md string) []string {
	var out []string
	fenced, indented, blank := false, false, true
	for _, line := range strings.Split(md, "\n") {
		isBlank := strings.TrimSpace(line) == ""
		switch {
		case strings.HasPrefix(strings.TrimSpace(line), "```"):
			fenced = !fenced
			isBlank = true // a fence ends a block like a blank line does
		case fenced:
		case strings.HasPrefix(line, "    ") && (blank || indented):
			indented = true
		case isBlank:
			out = append(out, line) // an indented block goes on past blank lines
		default:
			indented = false
			out = append(out, line)
		}
		blank = isBlank
	}
	return out
}

// markdownLinks returns the targets of md's inline links outside code.
func markdownLinks(md string) []string {
	var out []string
	for _, line := range prose(md) {
		// Drop code spans that are not a link's text, then read links.
		line = codeSpanRE.ReplaceAllStringFunc(line, func(s string) string { return strings.Repeat("x", len(s)) })
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// markdownAnchors returns the anchors GitHub gives md's headings (with -1,
// -2, ... for repeats) and its explicit <a id> anchors.
func markdownAnchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(md) {
		for _, m := range htmlAnchorRE.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := githubSlug(m[1])
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// githubSlug is the anchor GitHub gives a heading: its text (a link's text
// only), lower-cased, with every character other than a letter, digit,
// space, hyphen or underscore removed and spaces turned into hyphens.
func githubSlug(heading string) string {
	heading = linkRE.ReplaceAllStringFunc(heading, func(s string) string {
		return s[1:strings.Index(s, "](")]
	})
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
