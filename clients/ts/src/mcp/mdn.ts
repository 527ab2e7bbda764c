// The MDN tools, as in the Go server (cmd/mdn-mcp): every upstream access
// is a GetOrFetch through coordd. Failures become tool results with
// isError set, never exceptions, so that the MCP session goes on.

import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";

import { Code, ConnectError, UnreachableError, type Document, type GetOptions } from "../client.js";
import { collapse, htmlText, htmlToMarkdown, safeLink } from "./html.js";
import { retryDelayMs } from "../retryinfo.js";

/** DEFAULT_MDN_BASE is the MDN site the tools read by default. */
export const DEFAULT_MDN_BASE = "https://developer.mozilla.org";

// Limits on tool input, checked before any request.
const MAX_PATH_BYTES = 512;
const MAX_QUERY_BYTES = 200;

/** SEARCH_RESULTS is how many results mdn_search lists. */
export const SEARCH_RESULTS = 10;

/** Getter fetches a document through coordd; CoorddClient is one. */
export interface Getter {
  /** addr is coordd's address, for messages. */
  readonly addr: string;
  get(url: string, opts?: GetOptions): Promise<Document>;
}

/** MDN serves the mdn_doc and mdn_search tools through coordd. */
export class MDN {
  /** base is MDN's base URL: scheme, host, optional path prefix. */
  readonly base: URL;

  /** base must be an absolute http(s) URL without query or fragment. */
  constructor(
    private readonly coordd: Getter,
    base: string = DEFAULT_MDN_BASE,
  ) {
    let u: URL | undefined;
    try {
      u = new URL(base);
    } catch {
      // reported below
    }
    if (!u || (u.protocol !== "http:" && u.protocol !== "https:") || u.search !== "" || u.hash !== "" || base.includes("#")) {
      throw new Error(`mdn base ${JSON.stringify(base)}: want an absolute http(s) URL without query or fragment`);
    }
    this.base = u;
  }

  /** doc is mdn_doc: the page at path as markdown, title, summary, source
   * URL, then each section. */
  async doc(path: string): Promise<CallToolResult> {
    const u = docURL(this.base, path);
    if (typeof u !== "string") return failure(u.error);
    const what = `page ${path.trim()}`;
    const got = await this.fetchJSON(u, what, "mdn_doc");
    if ("error" in got) return failure(got.error, got.retryAfterSeconds);
    const doc = (got.json as { doc?: MDNDoc } | null)?.doc;
    if (!doc || typeof doc !== "object" || !str(doc.title)) {
      return failure(`unexpected answer from MDN for ${what}: no doc.title in its index.json`);
    }
    return success(renderDoc(doc, this.base));
  }

  /** search is mdn_search: MDN's top SEARCH_RESULTS pages for query, with
   * their paths for mdn_doc. */
  async search(query: string): Promise<CallToolResult> {
    const q = collapse(query);
    if (q === "") return failure("query is empty");
    const size = Buffer.byteLength(q);
    if (size > MAX_QUERY_BYTES) return failure(`query is ${size} bytes; the limit is ${MAX_QUERY_BYTES}`);
    if (CONTROL.test(q)) return failure("query contains control characters");
    const u = new URL(this.base);
    u.pathname = trimSlash(this.base.pathname) + "/api/v1/search";
    u.search = new URLSearchParams({ q }).toString();
    const what = `search ${JSON.stringify(q)}`;
    const got = await this.fetchJSON(u.href, what, "mdn_search");
    if ("error" in got) return failure(got.error, got.retryAfterSeconds);
    const res = got.json as SearchResponse | null;
    if (!res || typeof res !== "object" || !Array.isArray(res.documents)) {
      return failure(`unexpected answer from MDN for ${what}: no documents in it`);
    }
    return success(renderSearch(q, res, this.base));
  }

  // fetchJSON gets url through coordd and parses its body; what names the
  // document in messages, tool the tool to call again.
  private async fetchJSON(
    url: string,
    what: string,
    tool: string,
  ): Promise<{ json: unknown } | { error: string; retryAfterSeconds?: number }> {
    let d: Document;
    try {
      d = await this.coordd.get(url);
    } catch (err) {
      return this.explain(what, tool, err);
    }
    const code = d.metadata.statusCode;
    if (code === 404 || code === 410) {
      return { error: `${what} not found on MDN (HTTP ${code}); use mdn_search to find the right path` };
    }
    if (code < 200 || code > 299) return { error: `MDN answered HTTP ${code} for ${what}` };
    try {
      return { json: JSON.parse(d.text()) };
    } catch (err) {
      return { error: `unexpected answer from MDN for ${what}: ${(err as Error).message}` };
    }
  }

  // explain turns a client error into a message for the assistant, the
  // Go server's words (cmd/mdn-mcp/mdn.go): what coordd said is quoted as
  // "(coordd: MESSAGE)". With a RetryInfo, it says when to call tool again,
  // also as retryAfterSeconds.
  private explain(what: string, tool: string, err: unknown): { error: string; retryAfterSeconds?: number } {
    const ce = ConnectError.from(err);
    const addr = this.coordd.addr;
    if (ce instanceof UnreachableError) {
      const cause = ce.cause instanceof ConnectError ? ce.cause.rawMessage : ce.rawMessage;
      return { error: `cannot get ${what}: coordd at ${addr} is unreachable (${cause})` };
    }
    const said = `(coordd: ${ce.rawMessage})`;
    switch (ce.code) {
      case Code.Unavailable:
      case Code.ResourceExhausted: {
        const why =
          ce.code === Code.ResourceExhausted
            ? "MDN's rate limit is reached and coordd has no copy"
            : "MDN is unavailable and coordd has no copy";
        const after = retryAfterSeconds(ce);
        if (after === undefined) return { error: `cannot get ${what}: ${why} ${said}` };
        return { error: `cannot get ${what}: ${why}. ${retryAdvice(tool, after)} ${said}`, retryAfterSeconds: after };
      }
      case Code.DeadlineExceeded:
        return { error: `cannot get ${what}: timed out ${said}` };
      case Code.PermissionDenied:
        return {
          error: `cannot get ${what}: coordd at ${addr} does not serve ${origin(this.base)} to this client: it is not one of its upstreams (start coordd with --upstream mdn=${origin(this.base)}, or give this server the --mdn-base coordd serves), or the token's tenant is not granted it ${said}`,
        };
      case Code.Unauthenticated:
        return { error: `cannot get ${what}: coordd at ${addr} requires a valid token: set $COORDD_TOKEN or --coordd-token ${said}` };
    }
    return { error: `cannot get ${what} through coordd at ${addr} ${said}` };
  }
}

/** retryAdvice tells an assistant when to call tool again. */
export function retryAdvice(tool: string, seconds: number): string {
  const unit = seconds === 1 ? "second" : "seconds";
  return `Wait ${seconds} ${unit}, then call ${tool} again; calling it sooner fails the same way.`;
}

// retryAfterSeconds is the RetryInfo delay of err (see retryDelayMs) in
// whole seconds rounded up, at least 1.
function retryAfterSeconds(err: ConnectError): number | undefined {
  const ms = retryDelayMs(err);
  return ms === undefined ? undefined : Math.max(1, Math.ceil(ms / 1000));
}

// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * docURL checks that path is a page path on MDN and returns the URL of the
 * page's index.json under base, or what is wrong with path. A trailing "/"
 * or "/index.json" is accepted.
 */
export function docURL(base: URL, path: string): string | { error: string } {
  const p = path.trim();
  const bad = (error: string) => ({ error });
  const q = JSON.stringify(p);
  if (p === "") return bad("path is empty; give a page path such as /en-US/docs/Web/HTTP");
  const size = Buffer.byteLength(p);
  if (size > MAX_PATH_BYTES) return bad(`path is ${size} bytes; the limit is ${MAX_PATH_BYTES}`);
  if (p.includes("://") || p.startsWith("//")) return bad(`path ${q} is a URL; give only its path, such as /en-US/docs/Web/HTTP`);
  if (!p.startsWith("/")) return bad(`path ${q} must start with /, as in /en-US/docs/Web/HTTP`);
  if (/[?#\\]/.test(p) || CONTROL.test(p)) return bad(`path ${q} must not contain ?, #, \\ or control characters`);
  let dec: string;
  try {
    dec = decodeURIComponent(p);
  } catch {
    return bad(`path ${q} is not a valid path: bad percent-encoding`);
  }
  if (/[?#\\]/.test(dec) || CONTROL.test(dec) || dec.startsWith("//")) {
    return bad(`path ${q} must not contain ?, #, \\ or control characters, even escaped`);
  }
  dec = dec.replace(/\/$/, "").replace(/\/index\.json$/, "");
  if (dec.split("/").some((seg) => [".", ".."].includes(seg.split(";")[0]!))) return bad(`path ${q} must not contain . or .. segments`);
  // coordd refuses these too (INVALID_ARGUMENT); say so here, plainly.
  if (/%2F|%2E|%25/i.test(p)) return bad(`path ${q} must not contain an escaped /, . or %`);
  if (dec === "") return bad(`path ${q} names no page`);
  const u = new URL(base);
  // The pathname setter percent-encodes what needs it, except "%" itself.
  u.pathname = trimSlash(base.pathname) + dec.replaceAll("%", "%25") + "/index.json";
  u.search = "";
  u.hash = "";
  return u.href;
}

interface MDNDoc {
  title?: unknown;
  summary?: unknown;
  mdn_url?: unknown;
  body?: unknown;
}

interface SearchResponse {
  documents: { mdn_url?: unknown; title?: unknown; summary?: unknown }[];
  metadata?: { total?: { value?: unknown } };
}

function str(v: unknown): string {
  return typeof v === "string" ? v : "";
}

function trimSlash(p: string): string {
  return p.replace(/\/+$/, "");
}

function origin(base: URL): string {
  return base.href.replace(/\/$/, "");
}

/** renderDoc renders an MDN index.json "doc" as the Go server does: title,
 * the summary unless the opening section starts with it, source URL, then
 * each section under its title. */
export function renderDoc(doc: MDNDoc, base: URL): string {
  const page = safeLink(str(doc.mdn_url), base);
  const body = Array.isArray(doc.body) ? (doc.body as unknown[]) : [];
  const blocks = [`# ${collapse(str(doc.title))}`];
  const summary = collapse(str(doc.summary));
  if (summary && !introSays(body, summary)) blocks.push(summary);
  if (page) blocks.push(`Source: ${page}`);
  for (const s of body) {
    const { type, value } = (s && typeof s === "object" ? s : {}) as { type?: unknown; value?: unknown };
    const v = (value && typeof value === "object" ? value : {}) as Record<string, unknown>;
    const title = collapse(str(v["title"]));
    if (title) blocks.push(`${v["isH3"] === true ? "###" : "##"} ${title}`);
    switch (type) {
      case "browser_compatibility": {
        let line = "See the compatibility table on MDN";
        if (page) line += `: ${page}#${str(v["id"])}`;
        if (str(v["query"])) line += ` (browser-compat-data: \`${str(v["query"])}\`)`;
        blocks.push(line);
        break;
      }
      case "specifications": {
        const specs = (Array.isArray(v["specifications"]) ? (v["specifications"] as Record<string, unknown>[]) : [])
          .map((sp) => ({ title: collapse(str(sp?.["title"])), url: safeLink(str(sp?.["bcdSpecificationURL"]), base) }))
          .filter((sp) => sp.url)
          .map((sp) => `- [${sp.title}](${sp.url})`);
        blocks.push(specs.length > 0 ? specs.join("\n") : "No specification listed.");
        break;
      }
      default: {
        const md = htmlToMarkdown(str(v["content"]), base);
        if (md) blocks.push(md);
      }
    }
  }
  return blocks.join("\n\n") + "\n";
}

// introSays reports whether the page's untitled opening section starts
// with summary, as it usually does: MDN derives the summary from it.
function introSays(body: unknown[], summary: string): boolean {
  const first = body[0] as { type?: unknown; value?: Record<string, unknown> } | undefined;
  if (!first || typeof first !== "object" || first.type !== "prose") return false;
  const v = first.value && typeof first.value === "object" ? first.value : {};
  return str(v["title"]) === "" && htmlText(str(v["content"])).startsWith(summary);
}

/** renderSearch lists the top SEARCH_RESULTS results with their paths. */
export function renderSearch(q: string, res: SearchResponse, base: URL): string {
  const all = res.documents;
  if (all.length === 0) return `No MDN pages found for ${JSON.stringify(q)}.\n`;
  const docs = all.slice(0, SEARCH_RESULTS);
  const reported = res.metadata?.total?.value;
  const total = Math.max(typeof reported === "number" ? reported : 0, all.length);
  const lines = [`Top ${docs.length} of ${total} MDN results for ${JSON.stringify(q)}; read one with mdn_doc and its path.`];
  docs.forEach((d, i) => {
    lines.push("", `${i + 1}. ${collapse(str(d.title))}`, `   path: ${pagePath(str(d.mdn_url), base)}`);
    const sum = collapse(str(d.summary));
    if (sum) lines.push(`   ${sum}`);
  });
  return lines.join("\n") + "\n";
}

// pagePath returns the path of an mdn_url, which MDN gives as a path but
// might give as an absolute URL, without base's path prefix.
function pagePath(mdnURL: string, base: URL): string {
  let p: string;
  try {
    p = new URL(mdnURL, base).pathname;
  } catch {
    return mdnURL;
  }
  const prefix = trimSlash(base.pathname);
  return prefix && p.startsWith(prefix + "/") ? p.slice(prefix.length) : p;
}

function success(text: string): CallToolResult {
  return { content: [{ type: "text", text }] };
}

function failure(text: string, retryAfterSeconds?: number): CallToolResult {
  const r: CallToolResult = { content: [{ type: "text", text }], isError: true };
  if (retryAfterSeconds !== undefined) r.structuredContent = { retryAfterSeconds };
  return r;
}
