import assert from "node:assert/strict";
import { test } from "node:test";

import { decodeEntities, htmlToMarkdown } from "../mcp/html.js";

test("htmlToMarkdown", async (t) => {
  const cases: { name: string; html: string; want: string }[] = [
    { name: "paragraphs", html: "<p>one\n  two</p><p>three</p>", want: "one two\n\nthree" },
    { name: "headings", html: '<h2 id="x">Title <code>a</code></h2><h3>Sub</h3>', want: "## Title `a`\n\n### Sub" },
    { name: "emphasis keeps spaces outside", html: "<p>a<strong> b </strong>c <em>d</em></p>", want: "a **b** c _d_" },
    { name: "inline code with a backtick", html: "<code>a`b</code>", want: "`` a`b ``" },
    { name: "entities", html: "<p>&lt;div&gt; &amp; &#x27;q&#39; &nbsp;&hellip; &bogus;</p>", want: "<div> & 'q' … &bogus;" },
    {
      name: "fenced code keeps blank lines and decodes entities",
      html: '<pre class="brush: js notranslate"><code>if (a &lt; b) {\n\n  f();\n}\n</code></pre>',
      want: "```js\nif (a < b) {\n\n  f();\n}\n```",
    },
    { name: "plain code block", html: '<pre class="brush: plain">x</pre>', want: "```\nx\n```" },
    { name: "links resolve against base", html: '<a href="/en-US/docs/A">A</a> <a href="#frag">B</a>', want: "[A](https://mdn.test/en-US/docs/A) B" },
    {
      name: "nested lists",
      html: "<ul><li>a<ul><li>b</li></ul></li><li>c</li></ul><ol start=\"3\"><li>x</li><li>y</li></ol>",
      want: "- a\n  - b\n- c\n\n3. x\n4. y",
    },
    { name: "definition list", html: "<dl><dt><code>k</code></dt><dd><p>v</p></dd></dl>", want: "- `k`\n  v" },
    {
      name: "table",
      html: "<table><thead><tr><th>A</th><th>B</th></tr></thead><tbody><tr><td>1</td><td>x|y</td></tr></tbody></table>",
      want: "| A | B |\n| --- | --- |\n| 1 | x\\|y |",
    },
    { name: "scripts and styles dropped", html: "<p>a</p><script>alert(1)</script><style>p{}</style>", want: "a" },
    { name: "unclosed and stray tags", html: "<p>a <b>b</p><p>c</i> 1 < 2", want: "a **b**\n\nc 1 < 2" },
    { name: "example header dropped", html: '<div class="example-header"><span>js</span></div><p>x</p>', want: "x" },
    { name: "blockquote", html: "<blockquote><p>a</p><p>b</p></blockquote>", want: "> a\n>\n> b" },
    { name: "note as a quote", html: '<div class="notecard note"><p><strong>Note:</strong> x</p></div>', want: "> **Note:** x" },
    { name: "unsafe links lose their target", html: '<a href="javascript:alert(1)">a</a> <a href="data:,x">b</a>', want: "a b" },
    { name: "parens in links escaped", html: '<a href="/w/A_(b)">A</a>', want: "[A](https://mdn.test/w/A_%28b%29)" },
    { name: "forms dropped", html: "<p>a</p><form><input><button>b</button></form>", want: "a" },
  ];
  for (const c of cases) {
    await t.test(c.name, () => {
      assert.equal(htmlToMarkdown(c.html, { baseUrl: "https://mdn.test/en-US/docs/Page" }), c.want);
    });
  }
});

test("decodeEntities leaves out-of-range code points", () => {
  assert.equal(decodeEntities("&#x110000;&#65;"), "&#x110000;A");
});
