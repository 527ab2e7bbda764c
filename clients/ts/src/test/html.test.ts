import assert from "node:assert/strict";
import { test } from "node:test";

import { htmlToMarkdown } from "../mcp/html.js";

// The cases of the Go server's TestHTMLToMarkdown (cmd/mdn-mcp/markdown_test.go),
// with the same expectations: the converters are ports of each other.
test("htmlToMarkdown", async (t) => {
  const cases: { name: string; html: string; want: string }[] = [
    { name: "paragraphs", html: "<p>one\n  two</p><p>three</p>", want: "one two\n\nthree" },
    { name: "headings", html: "<h3 id=x><a href=#x>Return value</a></h3><p>A new array.</p>", want: "### Return value\n\nA new array." },
    { name: "inline code and emphasis", html: "<p>The <strong><code>map()</code></strong> method is <em>not</em> lazy.</p>", want: "The **`map()`** method is *not* lazy." },
    { name: "code with a backtick", html: "<p><code>a`b</code></p>", want: "`` a`b ``" },
    { name: "links made absolute", html: "<p>See <a href=\"/en-US/docs/Web/HTTP\">HTTP</a> and <a href=\"https://tc39.es/x(y)\">spec</a>.</p>", want: "See [HTTP](https://developer.mozilla.org/en-US/docs/Web/HTTP) and [spec](https://tc39.es/x%28y%29)." },
    { name: "anchor and script links dropped", html: "<p><a href=\"#see_also\">forEach</a>, <a href=\"javascript:alert(1)\">x</a></p>", want: "forEach, x" },
    { name: "fenced code keeps its lines", html: "<pre class=\"brush: js notranslate\">const a = 1;\n\n  a &lt; 2;\n</pre>", want: "```js\nconst a = 1;\n\n  a < 2;\n```" },
    { name: "language from code class", html: "<pre><code class=\"language-css\">a { }</code></pre>", want: "```css\na { }\n```" },
    { name: "fence longer than the code's backticks", html: "<pre>```\nx\n```</pre>", want: "````\n```\nx\n```\n````" },
    { name: "example header dropped", html: "<div class=\"code-example\"><div class=\"example-header\"><span>js</span></div><pre class=\"brush: js\">x</pre></div>", want: "```js\nx\n```" },
    { name: "lists nest", html: "<ul><li>a</li><li>b<ol><li>c</li><li>d</li></ol></li></ul>", want: "- a\n- b\n  1. c\n  2. d" },
    { name: "definition list", html: "<dl><dt><code>x</code></dt><dd><p>The x.</p></dd><dt>y</dt><dd>Why.</dd></dl>", want: "- `x`\n  The x.\n- y\n  Why." },
    { name: "note as quote", html: "<div class=\"notecard note\"><p><strong>Note:</strong> Careful.</p></div>", want: "> **Note:** Careful." },
    { name: "table", html: "<table><thead><tr><th>Key</th><th>Value</th></tr></thead><tbody><tr><td>a|b</td><td><p>1</p></td></tr></tbody></table>", want: "| Key | Value |\n| --- | --- |\n| a\\|b | 1 |" },
    { name: "line break", html: "<p>one<br>two</p>", want: "one\ntwo" },
    { name: "dropped elements", html: "<p>kept</p><script>alert(1)</script><style>p{}</style><iframe src=\"x\">frame</iframe><!-- c -->", want: "kept" },
    { name: "unknown tags keep their text", html: "<p><span class=badge>Optional</span> <abbr>HTML</abbr></p>", want: "Optional HTML" },
    { name: "empty", html: "", want: "" },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      assert.equal(htmlToMarkdown(c.html, new URL("https://developer.mozilla.org")), c.want);
    });
  }
});
