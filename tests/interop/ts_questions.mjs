// Drives the real server with the TypeScript SDK's client on a 2025-11-25 session that declares
// the elicitation capability: it starts a trip, and the trip's two questions reach its
// elicitation handler, which answers them (the first hotel offered, then yes to booking); the
// trip's status is read until it ends. Prints one JSON report for the test to check.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const [url, clientId] = process.argv.slice(2);
const client = new Client(
  { name: 'durable-mcp-ts-questions', version: '1.0.0' },
  { capabilities: { elicitation: { form: {} } } },
);
const asked = [];
const answers = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  const { message, requestedSchema } = request.params;
  asked.push(message);
  const hotel = requestedSchema.properties.hotel;
  const content = hotel ? { hotel: hotel.enum[0] } : { book: true };
  answers.push(content);
  return { action: 'accept', content };
});
const requestInit = { headers: { 'X-Client-Id': clientId } };
await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit }));

const trip = { destination: 'Lisbon', start_date: '2027-05-14', nights: 3, budget: 900 };
const started = await client.callTool({ name: 'start_trip_planning', arguments: trip });
const uri = started.structuredContent.status_uri;
let status;
for (let i = 0; i < 2400; i += 1) {
  status = JSON.parse((await client.readResource({ uri })).contents[0].text);
  if (['completed', 'failed', 'cancelled'].includes(status.status)) break;
  await new Promise((resolve) => setTimeout(resolve, 50));
}
await client.close();
process.stdout.write(JSON.stringify({ asked, answers, status }) + '\n');
