// A process of dropin.test.ts: a server's code as it is, @octokit/rest on
// the global fetch, made to use coordd by one line before it runs. It
// prints "ready" once loaded, then runs each job read from stdin (one JSON
// line: {tokens, calls}): `calls` concurrent users.getAuthenticated(), the
// i-th with tokens[i % tokens.length], and prints one JSON line of results.
//
//	COORDD_ADDR=127.0.0.1:50051 API_BASE=http://127.0.0.1:8080 node octokitworker.js

import { createInterface } from "node:readline";

import { CoorddClient, createFetch } from "../index.js";

// The one line of adoption, before the server's code loads.
globalThis.fetch = createFetch(new CoorddClient(process.env["COORDD_ADDR"]));

const { Octokit } = await import("@octokit/rest");

/** Job is one line of stdin. */
export interface Job {
  tokens: string[];
  calls: number;
}

/** Result is one call's outcome. */
export interface Result {
  token: string;
  status?: number;
  login?: string;
  viewer?: string;
  source?: string;
  error?: string;
}

const octokits = new Map<string, InstanceType<typeof Octokit>>();
function octokit(token: string) {
  let o = octokits.get(token);
  if (!o) {
    o = new Octokit({ baseUrl: process.env["API_BASE"], auth: token });
    octokits.set(token, o);
  }
  return o;
}

async function call(token: string): Promise<Result> {
  try {
    const res = await octokit(token).rest.users.getAuthenticated();
    const data = res.data as unknown as { login: string; viewer: string };
    return { token, status: res.status, login: data.login, viewer: data.viewer, source: res.headers["x-coordd-source"] as string };
  } catch (err) {
    return { token, error: String(err) };
  }
}

const lines = createInterface({ input: process.stdin });
process.stdout.write("ready\n");
for await (const line of lines) {
  const job = JSON.parse(line) as Job;
  const results = await Promise.all(Array.from({ length: job.calls }, (_, i) => call(job.tokens[i % job.tokens.length]!)));
  process.stdout.write(`${JSON.stringify(results)}\n`);
}
