// src/gen must match what `npm run generate` makes from the protos now.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const PKG = fileURLToPath(new URL("../../", import.meta.url)); // clients/ts/

function files(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out.set(relative(dir, p), readFileSync(p, "utf8"));
    }
  };
  walk(dir);
  return out;
}

test("src/gen is up to date with the protos", async () => {
  const tmp = mkdtempSync(join(tmpdir(), "coordd-ts-gen-"));
  try {
    await promisify(execFile)(join(PKG, "node_modules/.bin/buf"), ["generate", "-o", tmp], {
      cwd: PKG,
      env: { ...process.env, PATH: `${join(PKG, "node_modules/.bin")}:${process.env["PATH"] ?? ""}` },
    });
    const got = files(join(PKG, "src/gen"));
    const want = files(join(tmp, "src/gen"));
    assert.deepEqual([...got.keys()].sort(), [...want.keys()].sort(), "generated files differ; run npm run generate");
    for (const [name, text] of want) {
      assert.ok(got.get(name) === text, `src/gen/${name} is out of date; run npm run generate`);
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});
