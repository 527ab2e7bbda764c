// The HTML-to-markdown converter for MDN prose sections, a line-for-line
// port of the Go server's (cmd/mdn-mcp/markdown.go), so that both servers
// give the same text byte for byte: testdata/mcp-golden is the corpus both
// are tested against. Headings, paragraphs, fenced code blocks with their
// language, inline code, emphasis, links made absolute (http and https
// only), lists, definition lists, notes as block quotes, tables as pipe
// rows. Any other tag is dropped and its text kept; scripts, styles, forms
// and embedded frames are dropped whole.
//
// HTML is parsed by parse5, a parser of the WHATWG HTML standard as Go's
// golang.org/x/net/html is, so both see the same tree (entities, implied
// and misnested tags). A general converter (turndown and its GFM plugin)
// was not taken: its escaping, list and table rules differ from any Go
// converter's, so the two servers could not agree byte for byte.

import { defaultTreeAdapter, html as parse5html, parseFragment } from "parse5";
import type { DefaultTreeAdapterMap } from "parse5";

type Node = DefaultTreeAdapterMap["node"];
type Element = DefaultTreeAdapterMap["element"];
type ParentNode = DefaultTreeAdapterMap["parentNode"];

// HARD_BREAK stands for a <br> while inline text is collapsed; it becomes
// a newline when the paragraph is finished.
const HARD_BREAK = "\uE000";

// SPACE is what Go's unicode.IsSpace accepts, which strings.Fields and
// strings.TrimSpace split and trim on (JavaScript's \s differs: it has
// U+FEFF and lacks U+0085).
const SPACE = "[\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
const SPACES = new RegExp(`${SPACE}+`);
const TRIM = new RegExp(`^${SPACE}+|${SPACE}+$`, "g");

const BLOCK = new Set([
  "address", "article", "aside", "blockquote", "details", "div", "dl", "dd", "dt", "fieldset", "figcaption",
  "figure", "footer", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li", "main", "nav", "ol", "p", "pre",
  "section", "summary", "table", "ul",
]);

const DROPPED = new Set([
  "button", "embed", "form", "iframe", "input", "math", "noscript", "object", "script", "select", "style", "svg",
  "template", "textarea",
]);

/** collapse turns every run of whitespace into one space and trims the ends. */
export function collapse(s: string): string {
  return s.split(SPACES).filter(Boolean).join(" ");
}

function trimSpace(s: string): string {
  return s.replace(TRIM, "");
}

function isElement(n: Node): n is Element {
  return "tagName" in n;
}

function isText(n: Node): n is DefaultTreeAdapterMap["textNode"] {
  return n.nodeName === "#text";
}

function children(n: Node): Node[] {
  return "childNodes" in n ? (n as ParentNode).childNodes : [];
}

// isBlock reports whether n starts a block of its own. Custom elements
// (their names have a dash) count as blocks: MDN wraps examples in them.
function isBlock(n: Node): boolean {
  return isElement(n) && (BLOCK.has(n.tagName) || n.tagName.includes("-"));
}

function isDropped(n: Node): boolean {
  return n.nodeName === "#comment" || (isElement(n) && DROPPED.has(n.tagName));
}

function attr(n: Element, key: string): string {
  return n.attrs.find((a) => a.name === key)?.value ?? "";
}

function hasClass(n: Element, cls: string): boolean {
  return collapse(attr(n, "class")).split(" ").includes(cls);
}

// parse parses src as the children of a <div>, as the Go server does.
function parse(src: string): DefaultTreeAdapterMap["childNode"][] {
  const ctx = defaultTreeAdapter.createElement("div", parse5html.NS.HTML, []);
  return parseFragment(ctx, src, {}).childNodes;
}

/** htmlToMarkdown renders the HTML of an MDN prose section as markdown,
 * links made absolute against base. */
export function htmlToMarkdown(src: string, base?: URL): string {
  const root = defaultTreeAdapter.createElement("div", parse5html.NS.HTML, []);
  root.childNodes = parse(src);
  return new Renderer(base).blocks(root).join("\n\n");
}

/** htmlText returns the text of src with its whitespace collapsed. */
export function htmlText(src: string): string {
  return collapse(parse(src).map((n) => textContent(n) + " ").join(""));
}

/**
 * safeLink resolves href against base and returns it ready for a markdown
 * link, or "" for an in-page anchor, an unparsable href or a scheme other
 * than http(s) (javascript:, data:, ...).
 */
export function safeLink(href: string, base?: URL): string {
  if (href === "" || href.startsWith("#")) return "";
  let u: URL;
  try {
    u = new URL(trimSpace(href), base);
  } catch {
    return "";
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") return "";
  return u.href.replace(/\(/g, "%28").replace(/\)/g, "%29").replace(/ /g, "%20");
}

class Renderer {
  constructor(private readonly base?: URL) {}

  // blocks renders the children of n: runs of inline content become
  // paragraphs, block elements their own blocks.
  blocks(n: Node): string[] {
    const out: string[] = [];
    let para = "";
    const flush = () => {
      const s = finish(para);
      if (s !== "") out.push(s);
      para = "";
    };
    for (const c of children(n)) {
      if (isDropped(c)) continue;
      if (isBlock(c)) {
        flush();
        out.push(...this.block(c as Element));
      } else {
        para += this.inline(c);
      }
    }
    flush();
    return out;
  }

  // block renders one block element.
  block(n: Element): string[] {
    const h = /^h([1-6])$/.exec(n.tagName);
    if (h) {
      const text = this.inlineText(n);
      return text === "" ? [] : [`${"#".repeat(Number(h[1]))} ${text.replaceAll("\n", " ")}`];
    }
    switch (n.tagName) {
      case "pre": {
        const code = textContent(n).replace(/^\n+|\n+$/g, "");
        return trimSpace(code) === "" ? [] : [fence(codeLanguage(n), code)];
      }
      case "ul":
      case "ol":
        return nonEmpty(this.list(n, n.tagName === "ol"));
      case "dl":
        return nonEmpty(this.definitions(n));
      case "table":
        return nonEmpty(this.table(n));
      case "blockquote":
        return nonEmpty(quote(this.blocks(n)));
      case "hr":
        return ["---"];
      case "div":
      case "aside":
      case "section":
        if (hasClass(n, "example-header")) return []; // the language label over a code example
        if (n.tagName === "aside" || hasClass(n, "notecard")) return nonEmpty(quote(this.blocks(n)));
    }
    return this.blocks(n);
  }

  // list renders ul and ol items, tight, with nested blocks indented under
  // their item.
  list(n: Element, ordered: boolean): string {
    const items: string[] = [];
    for (const li of children(n)) {
      if (!isElement(li) || li.tagName !== "li") continue;
      const marker = ordered ? `${items.length + 1}. ` : "- ";
      items.push(indent(this.blocks(li).join("\n"), marker, " ".repeat(marker.length)));
    }
    return items.join("\n");
  }

  // definitions renders a dl as a list of terms, each description indented
  // under its term.
  definitions(n: Element): string {
    const lines: string[] = [];
    for (const c of children(n)) {
      if (!isElement(c)) continue;
      if (c.tagName === "dt") {
        const t = this.inlineText(c);
        if (t !== "") lines.push(indent(t, "- ", "  "));
      } else if (c.tagName === "dd") {
        const b = this.blocks(c).join("\n");
        if (b !== "") lines.push(indent(b, "  ", "  "));
      }
    }
    return lines.join("\n");
  }

  // table renders rows as pipe-separated cells, the first row as the header.
  table(n: Element): string {
    const rows: string[][] = [];
    const walk = (n: Node) => {
      for (const c of children(n)) {
        if (!isElement(c)) continue;
        switch (c.tagName) {
          case "thead":
          case "tbody":
          case "tfoot":
            walk(c);
            break;
          case "tr": {
            const cells = children(c)
              .filter((td): td is Element => isElement(td) && (td.tagName === "td" || td.tagName === "th"))
              .map((td) => this.inlineText(td).replaceAll("\n", " ").replaceAll("|", "\\|"));
            if (cells.length > 0) rows.push(cells);
          }
        }
      }
    };
    walk(n);
    if (rows.length === 0) return "";
    let b = "";
    rows.forEach((row, i) => {
      b += `| ${row.join(" | ")} |\n`;
      if (i === 0) b += `|${" --- |".repeat(row.length)}\n`;
    });
    return b.replace(/\n$/, "");
  }

  // inline returns the inline rendering of n; whitespace is collapsed
  // later, by finish.
  inline(n: Node): string {
    if (isText(n)) return n.value;
    if (!isElement(n) || isDropped(n)) return "";
    switch (n.tagName) {
      case "br":
        return HARD_BREAK;
      case "code":
      case "kbd":
      case "samp":
      case "tt":
      case "var": {
        const t = collapse(textContent(n));
        return t === "" ? "" : codeSpan(t);
      }
      case "a": {
        const text = collapse(this.inner(n));
        const href = this.link(attr(n, "href"));
        if (text === "") return "";
        return href === "" ? text : `[${text}](${href})`;
      }
      case "strong":
      case "b":
        return emphasize(this.inner(n), "**");
      case "em":
      case "i":
        return emphasize(this.inner(n), "*");
      case "img":
        return attr(n, "alt");
    }
    // A block inside inline content, as in a table cell.
    if (isBlock(n)) return ` ${this.inner(n)} `;
    return this.inner(n);
  }

  // inner returns the inline rendering of n's children, not yet collapsed.
  inner(n: Node): string {
    return children(n)
      .map((c) => this.inline(c))
      .join("");
  }

  // inlineText returns n's content as one finished line of inline markdown.
  inlineText(n: Node): string {
    return finish(this.inner(n));
  }

  link(href: string): string {
    return safeLink(href, this.base);
  }
}

// emphasize wraps raw in marker, keeping its outer whitespace outside the
// markers, where markdown needs it.
function emphasize(raw: string, marker: string): string {
  const t = collapse(raw);
  if (t === "") return raw;
  const lead = raw.replace(/^[ \t\r\n]+/, "") !== raw ? " " : "";
  const trail = raw.replace(/[ \t\r\n]+$/, "") !== raw ? " " : "";
  return `${lead}${marker}${t}${marker}${trail}`;
}

// finish collapses inline text and turns hard breaks into newlines.
function finish(s: string): string {
  return trimSpace(
    collapse(s)
      .split(HARD_BREAK)
      .map(trimSpace)
      .join("\n"),
  );
}

// textContent returns the text of n and its descendants as it is, for code.
function textContent(n: Node): string {
  if (isText(n)) return n.value;
  if (isElement(n) && n.tagName === "br") return "\n";
  if (isDropped(n)) return "";
  return children(n).map(textContent).join("");
}

// codeLanguage reads the language of a pre from its class ("brush: js" on
// MDN) or from its code child's ("language-js").
function codeLanguage(pre: Element): string {
  let classes = attr(pre, "class");
  const first = pre.childNodes[0];
  if (first && isElement(first) && first.tagName === "code") classes += " " + attr(first, "class");
  const fields = collapse(classes).split(" ");
  for (let i = 0; i < fields.length; i++) {
    const f = fields[i]!;
    let lang = "";
    if (f === "brush:" && i + 1 < fields.length) lang = fields[i + 1]!;
    else if (f.startsWith("brush:")) lang = f.slice("brush:".length);
    else if (f.startsWith("language-")) lang = f.slice("language-".length);
    lang = lang.toLowerCase();
    if (lang !== "" && /^[a-z0-9+\-_]+$/.test(lang)) return lang;
  }
  return "";
}

// fence wraps code in a fenced block longer than any backtick run in it.
function fence(lang: string, code: string): string {
  let f = "```";
  while (code.includes(f)) f += "`";
  return `${f}${lang}\n${code}\n${f}`;
}

// codeSpan wraps t in backticks, doubled when t holds one.
function codeSpan(t: string): string {
  return t.includes("`") ? "`` " + t + " ``" : "`" + t + "`";
}

// indent prefixes the first line of s with first and the others with rest;
// empty lines stay empty.
function indent(s: string, first: string, rest: string): string {
  return s
    .split("\n")
    .map((l, i) => (i === 0 ? first + l : l !== "" ? rest + l : l))
    .join("\n");
}

// quote renders blocks as a block quote.
function quote(blocks: string[]): string {
  const s = blocks.join("\n\n");
  if (s === "") return "";
  return s
    .split("\n")
    .map((l) => `> ${l}`.replace(/ +$/, ""))
    .join("\n");
}

function nonEmpty(s: string): string[] {
  return s === "" ? [] : [s];
}
