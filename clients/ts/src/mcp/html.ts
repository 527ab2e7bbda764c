// A small HTML-to-markdown converter for MDN prose sections: headings,
// paragraphs, fenced code blocks with their language, inline code,
// emphasis, links made absolute (http and https only), lists, definition
// lists, notes as block quotes, tables as pipe rows, and entities. Any
// other tag is dropped and its text kept; scripts, styles, forms and
// embedded frames are dropped whole.
//
// Hand-rolled (a forgiving tokenizer, a tree and a renderer) to keep the
// package free of an HTML parser dependency: the input is narrow, MDN's own
// well-formed HTML, and a page that trips it still reads as text.

interface Element {
  tag: string;
  attrs: Record<string, string>;
  children: Node[];
}
type Node = Element | string;

const VOID = new Set(["area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"]);
const DROP = new Set([
  "script", "style", "template", "svg", "math", "noscript", "iframe", "object", "embed", "form", "head", "title",
]);
const BLOCK = new Set([
  "address", "article", "aside", "body", "details", "div", "figcaption", "figure", "footer",
  "header", "html", "main", "nav", "p", "section", "summary",
]);

const TOKEN = /<!--[\s\S]*?-->|<!\[CDATA\[[\s\S]*?\]\]>|<![^>]*>|<\/?([a-zA-Z][a-zA-Z0-9-]*)((?:[^>"']|"[^"]*"|'[^']*')*)>|[^<]+|</g;
const ATTR = /([^\s=/]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+)))?/g;

function parse(html: string): Element {
  const root: Element = { tag: "#root", attrs: {}, children: [] };
  const stack: Element[] = [root];
  for (const m of html.matchAll(TOKEN)) {
    const tok = m[0];
    const top = stack[stack.length - 1]!;
    if (m[1] === undefined) {
      if (!tok.startsWith("<!")) top.children.push(tok === "<" ? "&lt;" : tok);
      continue;
    }
    const tag = m[1].toLowerCase();
    if (tok.startsWith("</")) {
      // Close the nearest open element of that name, and any left open in it.
      const i = stack.map((e) => e.tag).lastIndexOf(tag);
      if (i > 0) stack.length = i;
      continue;
    }
    const attrs: Record<string, string> = {};
    for (const a of (m[2] ?? "").matchAll(ATTR)) {
      attrs[a[1]!.toLowerCase()] = decodeEntities(a[2] ?? a[3] ?? a[4] ?? "");
    }
    const el: Element = { tag, attrs, children: [] };
    top.children.push(el);
    if (!VOID.has(tag) && !tok.endsWith("/>")) stack.push(el);
  }
  return root;
}

const NAMED: Record<string, string> = {
  amp: "&", lt: "<", gt: ">", quot: '"', apos: "'", nbsp: " ", shy: "", zwsp: "",
  hellip: "…", mdash: "—", ndash: "–", lsquo: "‘", rsquo: "’", ldquo: "“", rdquo: "”",
  laquo: "«", raquo: "»", copy: "©", reg: "®", trade: "™", times: "×", divide: "÷",
  larr: "←", rarr: "→", uarr: "↑", darr: "↓", harr: "↔", le: "≤", ge: "≥", ne: "≠",
  middot: "·", bull: "•", deg: "°", plusmn: "±", para: "¶", sect: "§",
};

/** decodeEntities replaces HTML character references; unknown ones stay. */
export function decodeEntities(s: string): string {
  return s.replace(/&(#[xX][0-9a-fA-F]+|#[0-9]+|[a-zA-Z][a-zA-Z0-9]*);/g, (whole, ref: string) => {
    if (ref[0] === "#") {
      const cp = ref[1] === "x" || ref[1] === "X" ? parseInt(ref.slice(2), 16) : parseInt(ref.slice(1), 10);
      return cp > 0 && cp <= 0x10ffff ? String.fromCodePoint(cp) : whole;
    }
    return NAMED[ref] ?? NAMED[ref.toLowerCase()] ?? whole;
  });
}

function textContent(n: Node): string {
  if (typeof n === "string") return decodeEntities(n);
  if (DROP.has(n.tag)) return "";
  if (n.tag === "br") return "\n";
  return n.children.map(textContent).join("");
}

/** Options for htmlToMarkdown. */
export interface MarkdownOptions {
  /** baseUrl resolves relative links. Without it, relative links keep
   * their text and lose their target. */
  baseUrl?: string;
}

/**
 * safeLink resolves href against base and returns it ready for a markdown
 * link, or "" for an in-page anchor, an unparsable href or a scheme other
 * than http(s) (javascript:, data:, ...).
 */
export function safeLink(href: string, base?: string): string {
  href = href.trim();
  if (href === "" || href.startsWith("#")) return "";
  let u: URL;
  try {
    u = new URL(href, base);
  } catch {
    return "";
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") return "";
  return u.href.replace(/\(/g, "%28").replace(/\)/g, "%29").replace(/ /g, "%20");
}

/** htmlToMarkdown renders HTML as markdown-ish plain text. */
export function htmlToMarkdown(html: string, opts: MarkdownOptions = {}): string {
  const out = new Renderer(opts).children(parse(html));
  return tidy(out);
}

// Blocks are separated by "\n\n" on both sides; tidy squeezes the runs.
function block(s: string): string {
  s = s.trim();
  return s === "" ? "" : `\n\n${s}\n\n`;
}

function indent(s: string, first: string, rest: string): string {
  return s
    .split("\n")
    .map((line, i) => (i === 0 ? first : line === "" ? "" : rest) + line)
    .join("\n");
}

class Renderer {
  constructor(private readonly opts: MarkdownOptions) {}

  children(el: Element): string {
    return el.children.map((c) => this.node(c)).join("");
  }

  node(n: Node): string {
    if (typeof n === "string") return decodeEntities(n).replace(/\s+/g, " ");
    const tag = n.tag;
    if (DROP.has(tag)) return "";
    const h = /^h([1-6])$/.exec(tag);
    if (h) return block(`${"#".repeat(Number(h[1]))} ${this.inline(n)}`);
    switch (tag) {
      case "br":
        return "\n";
      case "hr":
        return block("---");
      case "pre":
        return this.pre(n);
      case "code":
      case "kbd":
      case "samp":
      case "var":
        return code(textContent(n).replace(/\s+/g, " "));
      case "strong":
      case "b":
        return wrap("**", this.children(n));
      case "em":
      case "i":
        return wrap("_", this.children(n));
      case "a":
        return this.link(n);
      case "img":
        return n.attrs["alt"] ?? "";
      case "ul":
      case "ol":
        return this.list(n);
      case "dl":
        return this.dl(n);
      case "table":
        return this.table(n);
      case "blockquote":
        return this.quote(n);
    }
    const classes = (n.attrs["class"] ?? "").split(/\s+/);
    // MDN's code examples carry a header naming the language; the fence says it.
    if (classes.includes("example-header")) return "";
    // MDN's notes and warnings are block quotes in its own markdown.
    if (classes.includes("notecard")) return this.quote(n);
    const inner = this.children(n);
    return BLOCK.has(tag) ? block(inner) : inner;
  }

  quote(n: Element): string {
    const lines = tidy(this.children(n)).split("\n");
    return block(lines.map((l) => (l === "" ? ">" : `> ${l}`)).join("\n"));
  }

  inline(n: Element): string {
    return this.children(n).replace(/\s+/g, " ").trim();
  }

  pre(n: Element): string {
    const m = /(?:brush:\s*|language-)([\w-]+)/.exec(n.attrs["class"] ?? "");
    const lang = m?.[1] === "plain" ? "" : (m?.[1] ?? "");
    const body = textContent(n).replace(/^\n+|\s+$/g, "");
    const fence = body.includes("```") ? "~~~" : "```";
    return `\n\n${fence}${lang}\n${body}\n${fence}\n\n`;
  }

  link(n: Element): string {
    const text = this.inline(n);
    const target = safeLink(n.attrs["href"] ?? "", this.opts.baseUrl);
    return target && text ? `[${text}](${target})` : text;
  }

  list(n: Element): string {
    let i = Number(n.attrs["start"] ?? 1);
    if (!Number.isFinite(i)) i = 1;
    const items = n.children
      .filter((c): c is Element => typeof c !== "string" && c.tag === "li")
      .map((li) => {
        const marker = n.tag === "ol" ? `${i++}. ` : "- ";
        let body = tidy(this.children(li));
        // An item of text and nested lists stays tight; one with paragraphs
        // or code keeps its blank lines.
        if (!hasParagraphs(li)) body = body.replace(/\n\n+/g, "\n");
        return indent(body, marker, " ".repeat(marker.length));
      });
    return block(items.join("\n"));
  }

  dl(n: Element): string {
    const parts: string[] = [];
    for (const c of n.children) {
      if (typeof c === "string") continue;
      const body = tidy(this.children(c));
      if (c.tag === "dt") parts.push(indent(body, "- ", "  "));
      else if (c.tag === "dd") parts.push(indent(body, "  ", "  "));
    }
    return block(parts.join("\n"));
  }

  table(n: Element): string {
    const rows: string[][] = [];
    const walk = (e: Element) => {
      for (const c of e.children) {
        if (typeof c === "string") continue;
        if (c.tag === "tr") {
          rows.push(
            c.children
              .filter((d): d is Element => typeof d !== "string" && (d.tag === "td" || d.tag === "th"))
              .map((d) => tidy(this.children(d)).replace(/\s*\n\s*/g, " ").replace(/\|/g, "\\|")),
          );
        } else if (c.tag !== "table") {
          walk(c); // thead, tbody, tfoot
        }
      }
    };
    walk(n);
    if (rows.length === 0) return "";
    const width = Math.max(...rows.map((r) => r.length));
    const line = (r: string[]) => `| ${Array.from({ length: width }, (_, k) => r[k] ?? "").join(" | ")} |`;
    const lines = [line(rows[0]!), line(Array(width).fill("---")), ...rows.slice(1).map(line)];
    return block(lines.join("\n"));
  }
}

const PARAGRAPHS = new Set(["p", "pre", "div", "blockquote", "table", "dl", "h1", "h2", "h3", "h4", "h5", "h6"]);

// hasParagraphs says whether el holds, at any depth, block content other
// than lists.
function hasParagraphs(el: Element): boolean {
  return el.children.some((c) => typeof c !== "string" && (PARAGRAPHS.has(c.tag) || hasParagraphs(c)));
}

function wrap(mark: string, s: string): string {
  const t = s.trim();
  if (t === "") return s;
  // Keep surrounding spaces outside the marks: "a **b** c", not "a** b **c".
  const lead = s.startsWith(" ") ? " " : "";
  const trail = s.endsWith(" ") ? " " : "";
  return `${lead}${mark}${t}${mark}${trail}`;
}

function code(s: string): string {
  if (s.trim() === "") return s;
  const ticks = s.includes("`") ? "``" : "`";
  const pad = ticks === "``" ? " " : "";
  return `${ticks}${pad}${s}${pad}${ticks}`;
}

// tidy trims trailing spaces and stray leading spaces, and squeezes blank
// lines, leaving code fences as they are.
function tidy(s: string): string {
  const out: string[] = [];
  let fence: string | undefined;
  for (const line of s.split("\n")) {
    const f = /^\s*(```|~~~)/.exec(line)?.[1];
    if (fence) {
      out.push(line.trimEnd());
      if (f === fence) fence = undefined;
      continue;
    }
    if (f) fence = f;
    // One leading space is an artefact of collapsed HTML whitespace;
    // deeper indentation is list structure and stays.
    const l = line.trimEnd().replace(/^ (?! )/, "");
    if (l === "" && (out.length === 0 || out[out.length - 1] === "")) continue;
    out.push(l);
  }
  while (out.length > 0 && out[out.length - 1] === "") out.pop();
  return out.join("\n");
}
