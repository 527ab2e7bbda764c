// Fixtures in the shape MDN serves: a page's index.json and search results.

export const MAP_PATH = "/en-US/docs/Web/JavaScript/Reference/Global_Objects/Array/map";

export const mapPage = {
  doc: {
    title: "Array.prototype.map()",
    summary:
      "The map() method of Array instances creates a new array populated with the results of calling a provided function on every element in the calling array.",
    mdn_url: MAP_PATH,
    body: [
      {
        type: "prose",
        value: {
          id: null,
          title: null,
          isH3: false,
          content:
            '<p>The <strong><code>map()</code></strong> method of <a href="/en-US/docs/Web/JavaScript/Reference/Global_Objects/Array"><code>Array</code></a> instances creates a new array.</p>\n' +
            '<div class="code-example"><div class="example-header"><span class="language-name">js</span></div>' +
            '<pre class="brush: js notranslate"><code>const array1 = [1, 4, 9, 16];\n\n// Pass a function to map\nconst map1 = array1.map((x) =&gt; x * 2);\n</code></pre></div>',
        },
      },
      {
        type: "prose",
        value: {
          id: "syntax",
          title: "Syntax",
          isH3: false,
          content:
            '<div class="code-example"><div class="example-header"><span class="language-name">js</span></div><pre class="brush: js notranslate"><code>map(callbackFn)\nmap(callbackFn, thisArg)\n</code></pre></div>\n' +
            '<h3 id="parameters">Parameters</h3>\n<dl>\n<dt id="callbackfn"><a href="#callbackfn"><code>callbackFn</code></a></dt>\n' +
            "<dd>\n<p>A function to execute for each element in the array. It is called with:</p>\n<dl>\n" +
            "<dt><code>element</code></dt>\n<dd>\n<p>The current element being processed in the array.</p>\n</dd>\n</dl>\n</dd>\n</dl>",
        },
      },
      {
        type: "prose",
        value: {
          id: "description",
          title: "Description",
          isH3: false,
          content:
            "<p>The <code>map()</code> method is an <a href=\"/en-US/docs/Web/JavaScript/Reference/Global_Objects/Array#iterative_methods\">iterative method</a>. It calls:</p>\n" +
            "<ul>\n<li>once for each element &amp; index,</li>\n<li>never for <em>empty slots</em> in <a href=\"https://tc39.es/\">sparse arrays</a>.</li>\n</ul>\n" +
            '<div class="notecard note"><p><strong>Note:</strong> <code>map()</code> returns a new array &mdash; it does not mutate.</p></div>',
        },
      },
      {
        type: "specifications",
        value: {
          id: "specifications",
          title: "Specifications",
          isH3: false,
          specifications: [
            {
              bcdSpecificationURL: "https://tc39.es/ecma262/multipage/indexed-collections.html#sec-array.prototype.map",
              title: "ECMAScript® 2026 Language Specification",
            },
          ],
        },
      },
      {
        type: "browser_compatibility",
        value: { id: "browser_compatibility", title: "Browser compatibility", isH3: false, query: "javascript.builtins.Array.map" },
      },
    ],
  },
};

export const searchResults = {
  documents: Array.from({ length: 12 }, (_, i) => ({
    mdn_url: `/en-US/docs/Result/${i + 1}`,
    title: `Result ${i + 1}`,
    summary: `Summary of result ${i + 1}.`,
  })),
};
