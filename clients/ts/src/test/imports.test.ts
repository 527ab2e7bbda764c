import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize, relative } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

// src/, from dist/test/.
const SRC = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "src");

/** sources lists the package's own modules (not its tests nor gen/). */
function sources(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) {
      if (e.name !== "test" && e.name !== "gen") out.push(...sources(p));
    } else if (e.name.endsWith(".ts") && !e.name.endsWith(".d.ts")) out.push(p);
  }
  return out;
}

test("the package's modules import one another without a circle (client.ts and fetch.ts meet in index.ts)", () => {
  const graph = new Map<string, string[]>();
  for (const file of sources(SRC)) {
    const deps: string[] = [];
    for (const m of readFileSync(file, "utf8").matchAll(/(?:import|export)\s[^;]*?from\s+"(\.{1,2}\/[^"]+)\.js"/g)) {
      deps.push(normalize(join(dirname(file), m[1]! + ".ts")));
    }
    graph.set(file, deps);
  }
  assert.ok(graph.size > 5, `read ${graph.size} modules under ${SRC}`);
  const state = new Map<string, "open" | "done">();
  const path: string[] = [];
  const visit = (f: string) => {
    if (state.get(f) === "done" || !graph.has(f)) return;
    if (state.get(f) === "open") {
      const cycle = path.slice(path.indexOf(f)).concat(f).map((p) => relative(SRC, p));
      assert.fail(`an import circle: ${cycle.join(" → ")}`);
    }
    state.set(f, "open");
    path.push(f);
    for (const d of graph.get(f)!) visit(d);
    path.pop();
    state.set(f, "done");
  };
  for (const f of graph.keys()) visit(f);
});
