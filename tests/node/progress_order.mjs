// Progress notifications seen by the TypeScript MCP SDK's client (@modelcontextprotocol/client,
// the SDK inside Claude Code). It handles a notification in a microtask but a response at once:
// a progress notification that arrives in the same read as its request's result finds its token
// gone ("Received a progress notification for an unknown token"), which Claude Code counts as a
// transport error (and in 2.1.330 dropped the STDIO connection).
//
// Usage: node progress_order.mjs IPYBOX_BIN WORKSPACE
// Env: MCP_CLIENT_DIR = the directory of the @modelcontextprotocol/client package.
// Calls execute_ipython_cell with a progress callback: quick cells that print, and cells that
// print lines every 50 ms and end at every offset from a notification. Prints one JSON line:
//   {"calls", "errors": [client errors], "progress": N, "min_gap_ms": smallest time from a
//    call's last progress callback to its result, "texts": [result texts]}
// and exits 0; the Rust test judges.
import { pathToFileURL } from "node:url";
import path from "node:path";
import { performance } from "node:perf_hooks";

const [bin, workspace] = process.argv.slice(2);
const dir = process.env.MCP_CLIENT_DIR;
const { Client } = await import(pathToFileURL(path.join(dir, "dist/index.mjs")).href);
const { StdioClientTransport } = await import(pathToFileURL(path.join(dir, "dist/stdio.mjs")).href);

const errors = [];
const client = new Client({ name: "ipybox-progress-check", version: "1.0.0" });
client.onerror = (e) => errors.push(String(e?.message ?? e));
const transport = new StdioClientTransport({
  command: bin,
  // No session handle in the first result: every result is compared whole.
  args: ["--workspace", workspace, "--checkpoint-after", "off"],
  env: { ...process.env },
  stderr: "ignore",
});
await client.connect(transport);
const cells = [];
for (let i = 0; i < 8; i++) cells.push(`print(${i})`);
// 5 to 12 lines 50 ms apart: the cells end at every offset from the 250 ms notification grid.
for (let n = 5; n <= 12; n++) {
  cells.push(`import time\nfor j in range(${n}):\n    print(j, flush=True)\n    time.sleep(0.05)`);
}
let progress = 0;
let minGap = Infinity;
const texts = [];
for (const code of cells) {
  let last = null;
  const result = await client.callTool(
    { name: "execute_ipython_cell", arguments: { code } },
    {
      onprogress: () => {
        progress += 1;
        last = performance.now();
      },
    },
  );
  const answered = performance.now();
  if (last !== null) minGap = Math.min(minGap, answered - last);
  texts.push(result.content?.[0]?.text ?? "");
}
// Let queued microtasks and late notifications land before judging.
await new Promise((r) => setTimeout(r, 300));
await client.close();
console.log(
  JSON.stringify({
    calls: cells.length,
    errors,
    progress,
    min_gap_ms: minGap === Infinity ? null : Math.round(minGap * 10) / 10,
    texts,
  }),
);
