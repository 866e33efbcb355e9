// Drives the real server with the TypeScript SDK's client: lists tools, starts a task,
// subscribes to it, reads its status until completed, and makes one bad call. Prints one JSON
// report for the test to check. With MCP_BEARER_TOKEN set, every request carries it.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ResourceUpdatedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';

const [url] = process.argv.slice(2);
const client = new Client({ name: 'durable-mcp-ts-interop', version: '1.0.0' });
let updates = 0;
client.setNotificationHandler(ResourceUpdatedNotificationSchema, () => { updates += 1; });
const token = process.env.MCP_BEARER_TOKEN;
const requestInit = token ? { headers: { Authorization: `Bearer ${token}` } } : undefined;
await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit }));

const report = {};
report.tools = (await client.listTools()).tools.map((tool) => tool.name).sort();
const started = await client.callTool({
  name: 'start_batch_processing',
  // About a second in all, so the subscription below hears of later steps.
  arguments: { batch_size: 1, total_items: 5, processing_delay: 20 },
});
const uri = started.structuredContent.status_uri;
await client.subscribeResource({ uri });
let status;
for (let i = 0; i < 1200; i += 1) {
  const read = await client.readResource({ uri });
  status = JSON.parse(read.contents[0].text);
  if (['completed', 'failed', 'cancelled'].includes(status.status)) break;
  await new Promise((resolve) => setTimeout(resolve, 50));
}
report.final_status = status.status;
report.processed = status.result_data?.processed;
report.updates = updates;
const bad = await client.callTool({ name: 'start_batch_processing', arguments: { batch_size: 0, total_items: 5 } });
report.bad_is_error = bad.isError;
report.bad_text = bad.content[0].text;
await client.close();
process.stdout.write(JSON.stringify(report) + '\n');
