// What the MCP HTTP server answers a POST body before the SDK sees it, as
// the Go server's checkJSONRPC does (cmd/mdn-mcp/jsonrpc.go): the same
// refusals, word for word, checked by testdata/mcp-golden/http.json.

import type { IncomingMessage } from "node:http";

/** MAX_BODY_BYTES bounds a POST body, as both SDKs do (4 MiB). */
export const MAX_BODY_BYTES = 4 << 20;

/** Verdict is what checkMessage decided: pass the body on to the SDK
 * (status 0), or answer status with a JSON-RPC error (code set), or with
 * no body at all. */
export interface Verdict {
  status: number;
  /** id is the request's id; without it the answer has none. */
  id?: string | number;
  code?: number;
  message?: string;
  /** body is the parsed message, when it is passed on. */
  body?: unknown;
}

const invalid = (message: string): Verdict => ({ status: 400, code: -32600, message: `Invalid Request: ${message}` });
const NOT_JSON: Verdict = { status: 400, code: -32700, message: "Parse error: the body is not JSON" };
const BATCH = invalid("JSON-RPC batches are not supported (MCP 2025-06-18 removed them); send one message per request");
const NOT_RPC = invalid("not a JSON-RPC 2.0 message");
const BAD_ID = invalid("id must be a string or an integer between -(2^53-1) and 2^53-1");
const BAD_METHOD = invalid("method must be a string");

/**
 * checkMessage decides what to do with a POST body, as MCP (2025-06-18
 * and later) and JSON-RPC 2.0 say: a body that is not JSON is a parse
 * error; a batch (a JSON array), a message without jsonrpc "2.0", an id
 * that is neither a string nor an integer that every peer can echo exactly
 * (a JavaScript safe integer: 1e308, 1.5 and null are refused), or a
 * method that is not a string is an invalid request, answered 400 with an
 * error that has no id. The rest goes to the SDK, which answers a request
 * for a method it does not serve -32601 with its id, and a notification of
 * one 202.
 */
export function checkMessage(text: string): Verdict {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return NOT_JSON;
  }
  if (Array.isArray(v)) return BATCH;
  if (typeof v !== "object" || v === null) return NOT_RPC;
  const msg = v as Record<string, unknown>;
  if (msg["jsonrpc"] !== "2.0") return NOT_RPC;
  if ("id" in msg && !validID(msg["id"])) return BAD_ID;
  if (!("method" in msg)) {
    return "result" in msg || (msg["error"] !== undefined && msg["error"] !== null) ? { status: 0, body: v } : NOT_RPC;
  }
  if (typeof msg["method"] !== "string") return BAD_METHOD;
  return { status: 0, body: v };
}

// validID reports whether id is a string or an integer of magnitude at
// most 2^53-1.
function validID(id: unknown): boolean {
  return typeof id === "string" || (typeof id === "number" && Number.isSafeInteger(id));
}

/** readBody reads req's body as UTF-8, or returns undefined once it passes
 * limit bytes. */
export async function readBody(req: IncomingMessage, limit = MAX_BODY_BYTES): Promise<string | undefined> {
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    n += chunk.length;
    if (n > limit) return undefined;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString("utf8");
}

/** errorBody is the JSON-RPC error answer of a verdict with a code. */
export function errorBody(v: Verdict): string {
  const id = v.id === undefined ? {} : { id: v.id };
  return JSON.stringify({ jsonrpc: "2.0", ...id, error: { code: v.code, message: v.message } });
}
