// Calls one MCP tool with the TypeScript SDK (@modelcontextprotocol/sdk, pinned in
// package.json): a `Client` over `StreamableHTTPClientTransport`.
//
//   node client.mjs --url http://127.0.0.1:PORT/mcp --tool create_task --args '{"title":"a"}' \
//       [--times N] [--header 'Idempotency-Key: k1' ...] [--timeout SECONDS] [--list-first]
//
// This SDK line (1.x) speaks the 2025-11-25 era only: `initialize` handshake, then
// Mcp-Session-Id (if the server mints one) and MCP-Protocol-Version on every request.
// Each of the N calls is a fresh tools/call (a new JSON-RPC id) on the same session, and
// prints one JSON line on stdout:
//   {"isError": bool, "content": [...], "structuredContent": ... or null, "meta": result._meta or null}
// or, when the call failed (timeout, JSON-RPC error, transport failure):
//   {"error": "message", "code": JSON-RPC code or null, "kind": error class}
// (for kind StreamableHTTPError, i.e. a non-2xx HTTP answer, this SDK puts the HTTP status
// in `code` and the raw response body in the message: it does not parse JSON-RPC error bodies).
// Diagnostics go to stderr. Exit status: 0 when every call printed a result, 1 otherwise.

import { parseArgs } from 'node:util';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const { values } = parseArgs({
  options: {
    url: { type: 'string' },
    header: { type: 'string', multiple: true, default: [] },
    tool: { type: 'string' },
    args: { type: 'string', default: '{}' },
    times: { type: 'string', default: '1' },
    timeout: { type: 'string' },
    'list-first': { type: 'boolean', default: false },
  },
  strict: true,
});

if (!values.url || !values.tool) {
  process.stderr.write('usage: node client.mjs --url URL --tool NAME [--args JSON] [--times N] [--header K:V]... [--timeout S]\n');
  process.exit(2);
}

const headers = {};
for (const pair of values.header) {
  const i = pair.indexOf(':');
  if (i <= 0) {
    process.stderr.write(`--header wants K:V, got ${JSON.stringify(pair)}\n`);
    process.exit(2);
  }
  headers[pair.slice(0, i).trim()] = pair.slice(i + 1).trim();
}
const toolArgs = JSON.parse(values.args);
const times = Number.parseInt(values.times, 10);
const requestOptions = values.timeout !== undefined ? { timeout: Number(values.timeout) * 1000 } : {};

function emit(obj) {
  // Top-level keys in sorted order, like client.py (nested objects and spacing differ:
  // compare the two clients' lines as parsed JSON, not as text).
  const sorted = Object.fromEntries(Object.entries(obj).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  process.stdout.write(JSON.stringify(sorted) + '\n');
}

function errorReport(err) {
  const code = typeof err?.code === 'number' ? err.code : null;
  return { error: String(err?.message ?? err), code, kind: err?.constructor?.name ?? typeof err };
}

const transport = new StreamableHTTPClientTransport(new URL(values.url), { requestInit: { headers } });
const client = new Client({ name: 'idemgate-mcp-ts-client', version: '1.0.0' });

let failures = 0;
try {
  await client.connect(transport);
  process.stderr.write(`negotiated protocol version ${transport.protocolVersion ?? '?'}; session ${transport.sessionId ?? 'none'}\n`);
  if (values['list-first']) {
    await client.listTools();
  }
  for (let i = 0; i < times; i++) {
    try {
      const result = await client.callTool({ name: values.tool, arguments: toolArgs }, undefined, requestOptions);
      emit({ isError: Boolean(result.isError), content: result.content ?? [], structuredContent: result.structuredContent ?? null, meta: result._meta ?? null });
    } catch (err) {
      failures++;
      emit(errorReport(err));
      // On a timeout the SDK sends notifications/cancelled fire-and-forget; give that POST
      // time to leave before the next call or close() aborts it.
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  }
} catch (err) {
  failures++;
  emit(errorReport(err));
} finally {
  try {
    await client.close();
  } catch {
    // the server may already be gone (die_after_effect)
  }
}
process.exit(failures ? 1 : 0);
