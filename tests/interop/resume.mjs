// Calls resumable_data_processing with the TypeScript SDK's Streamable HTTP client and prints
// one JSON line per event: {"progress": n} for each progress notification, {"token": id} for
// each resumption token, and finally {"result": ...} or {"error": "..."}. The test that runs
// this kills and restarts the server mid-call; the SDK must resume the call by itself with
// Last-Event-ID and still receive the result of the original request.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const [url, totalRecords] = process.argv.slice(2);
const print = (line) => process.stdout.write(JSON.stringify(line) + '\n');

const transport = new StreamableHTTPClientTransport(new URL(url), {
  reconnectionOptions: {
    initialReconnectionDelay: 200,
    maxReconnectionDelay: 2000,
    reconnectionDelayGrowFactor: 1.5,
    maxRetries: 30,
  },
});
const client = new Client({ name: 'durable-mcp-ts-interop', version: '1.0.0' });
try {
  await client.connect(transport);
  print({ session: transport.sessionId, protocol: transport.protocolVersion });
  const result = await client.callTool(
    {
      name: 'resumable_data_processing',
      arguments: { dataset_name: 'ts', total_records: Number(totalRecords), batch_size: 10, client_id: 'ts-interop' },
    },
    CallToolResultSchema,
    {
      timeout: 120_000,
      resetTimeoutOnProgress: true,
      onprogress: (progress) => print({ progress: progress.progress }),
      onresumptiontoken: (token) => print({ token }),
    },
  );
  print({ result });
  await client.close();
  process.exit(0);
} catch (error) {
  print({ error: String(error) });
  process.exit(1);
}
