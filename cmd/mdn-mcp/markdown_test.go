package main

import (
	"encoding/json"
	"flag"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var mdnBase = mustParse("https://developer.mozilla.org")

func mustParse(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

func TestHTMLToMarkdown(t *testing.T) {
	tests := []struct {
		name, html, want string
	}{
		{"paragraphs", "<p>one\n  two</p><p>three</p>", "one two\n\nthree"},
		{"headings", "<h3 id=x><a href=#x>Return value</a></h3><p>A new array.</p>", "### Return value\n\nA new array."},
		{"inline code and emphasis", "<p>The <strong><code>map()</code></strong> method is <em>not</em> lazy.</p>", "The **`map()`** method is *not* lazy."},
		{"code with a backtick", "<p><code>a`b</code></p>", "`` a`b ``"},
		{"links made absolute", `<p>See <a href="/en-US/docs/Web/HTTP">HTTP</a> and <a href="https://tc39.es/x(y)">spec</a>.</p>`, "See [HTTP](https://developer.mozilla.org/en-US/docs/Web/HTTP) and [spec](https://tc39.es/x%28y%29)."},
		{"anchor and script links dropped", `<p><a href="#see_also">forEach</a>, <a href="javascript:alert(1)">x</a></p>`, "forEach, x"},
		{"fenced code keeps its lines", "<pre class=\"brush: js notranslate\">const a = 1;\n\n  a &lt; 2;\n</pre>", "```js\nconst a = 1;\n\n  a < 2;\n```"},
		{"language from code class", `<pre><code class="language-css">a { }</code></pre>`, "```css\na { }\n```"},
		{"fence longer than the code's backticks", "<pre>```\nx\n```</pre>", "````\n```\nx\n```\n````"},
		{"example header dropped", `<div class="code-example"><div class="example-header"><span>js</span></div><pre class="brush: js">x</pre></div>`, "```js\nx\n```"},
		{"lists nest", "<ul><li>a</li><li>b<ol><li>c</li><li>d</li></ol></li></ul>", "- a\n- b\n  1. c\n  2. d"},
		{"definition list", "<dl><dt><code>x</code></dt><dd><p>The x.</p></dd><dt>y</dt><dd>Why.</dd></dl>", "- `x`\n  The x.\n- y\n  Why."},
		{"note as quote", `<div class="notecard note"><p><strong>Note:</strong> Careful.</p></div>`, "> **Note:** Careful."},
		{"table", "<table><thead><tr><th>Key</th><th>Value</th></tr></thead><tbody><tr><td>a|b</td><td><p>1</p></td></tr></tbody></table>", "| Key | Value |\n| --- | --- |\n| a\\|b | 1 |"},
		{"line break", "<p>one<br>two</p>", "one\ntwo"},
		{"dropped elements", `<p>kept</p><script>alert(1)</script><style>p{}</style><iframe src="x">frame</iframe><!-- c -->`, "kept"},
		{"unknown tags keep their text", "<p><span class=badge>Optional</span> <abbr>HTML</abbr></p>", "Optional HTML"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := htmlToMarkdown(tt.html, mdnBase); got != tt.want {
				t.Errorf("htmlToMarkdown(%q) =\n%s\nwant\n%s", tt.html, got, tt.want)
			}
		})
	}
}

// goldenDir is the corpus both MCP servers are tested against, byte for
// byte: pages/NAME.json (a page's index.json) renders as pages/NAME.md, and
// search/Q.json (MDN's search answer for Q, "_" for spaces) as
// search/Q.md, with https://developer.mozilla.org as MDN's base.
// clients/ts/src/test/golden.test.ts reads the same files.
const goldenDir = "../../testdata/mcp-golden"

// TestGolden renders the corpus and compares with its markdown (go test
// -run TestGolden -update rewrites the .md files).
func TestGolden(t *testing.T) {
	for _, kind := range []string{"pages", "search"} {
		inputs, err := filepath.Glob(filepath.Join(goldenDir, kind, "*.json"))
		if err != nil || len(inputs) == 0 {
			t.Fatalf("no %s in %s: %v", kind, goldenDir, err)
		}
		for _, in := range inputs {
			name := strings.TrimSuffix(filepath.Base(in), ".json")
			t.Run(kind+"/"+name, func(t *testing.T) {
				raw, err := os.ReadFile(in)
				if err != nil {
					t.Fatal(err)
				}
				var got string
				if kind == "pages" {
					var p mdnPage
					if err := json.Unmarshal(raw, &p); err != nil {
						t.Fatal(err)
					}
					got = p.markdown(mdnBase)
				} else {
					var res searchResponse
					if err := json.Unmarshal(raw, &res); err != nil {
						t.Fatal(err)
					}
					got = res.markdown(strings.ReplaceAll(name, "_", " "), mdnBase)
				}
				golden := strings.TrimSuffix(in, ".json") + ".md"
				if *update {
					if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatal(err)
				}
				if got != string(want) {
					t.Errorf("markdown differs from %s; got:\n%s", golden, got)
				}
			})
		}
	}
}

func TestDocURL(t *testing.T) {
	tests := []struct {
		name, path string
		want       string // "" for an error
		why        string // part of the error
	}{
		{"page", "/en-US/docs/Web/HTTP", "https://developer.mozilla.org/en-US/docs/Web/HTTP/index.json", ""},
		{"trailing slash", "/en-US/docs/Web/HTTP/", "https://developer.mozilla.org/en-US/docs/Web/HTTP/index.json", ""},
		{"index.json given", "/en-US/docs/Web/HTTP/index.json", "https://developer.mozilla.org/en-US/docs/Web/HTTP/index.json", ""},
		{"colon in path", "/en-US/docs/Web/CSS/:hover", "https://developer.mozilla.org/en-US/docs/Web/CSS/:hover/index.json", ""},
		{"escaped", "/en-US/docs/Web/API/Foo%20Bar", "https://developer.mozilla.org/en-US/docs/Web/API/Foo%20Bar/index.json", ""},
		{"empty", "  ", "", "empty"},
		{"relative", "en-US/docs/Web", "", "must start with /"},
		{"url", "https://evil.example/en-US/docs/Web", "", "is a URL"},
		{"protocol-relative", "//evil.example/en-US/docs/Web", "", "is a URL"},
		{"dot dot", "/en-US/docs/../../etc/passwd", "", ".. segments"},
		{"escaped dot dot", "/en-US/docs/%2e%2e/x", "", ".. segments"},
		{"escaped slashes", "/%2F%2Fevil.example/x", "", "even escaped"},
		{"escaped slash inside", "/en-US/docs/a%2fb", "", "escaped /"},
		{"escaped dot", "/en-US/docs/a%2Eb", "", "escaped /"},
		{"escaped percent", "/en-US/docs/a%25b", "", "escaped /"},
		{"escaped backslash", "/en-US/docs/a%5Cb", "", "even escaped"},
		{"dot dot params", "/en-US/docs/..;/x", "", ".. segments"},
		{"dot params", "/en-US/docs/.;x/y", "", ".. segments"},
		{"query", "/en-US/docs/Web?x=1", "", "must not contain"},
		{"fragment", "/en-US/docs/Web#x", "", "must not contain"},
		{"backslash", `/en-US\docs`, "", "must not contain"},
		{"control", "/en-US/docs/\x00", "", "must not contain"},
		{"bad escape", "/en-US/docs/%zz", "", "not a valid path"},
		{"root", "/", "", "names no page"},
		{"too long", "/" + strings.Repeat("a", maxPathBytes), "", "limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := docURL(mdnBase, tt.path)
			switch {
			case tt.want != "" && err != nil:
				t.Fatalf("docURL(%q): %v; want %s", tt.path, err, tt.want)
			case tt.want != "" && u.String() != tt.want:
				t.Errorf("docURL(%q) = %s; want %s", tt.path, u, tt.want)
			case tt.want == "" && err == nil:
				t.Errorf("docURL(%q) = %s; want an error", tt.path, u)
			case tt.want == "" && !strings.Contains(err.Error(), tt.why):
				t.Errorf("docURL(%q) error %q; want it to mention %q", tt.path, err, tt.why)
			}
		})
	}
}
