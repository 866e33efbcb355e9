// Drives the server's MCP tasks (protocol 2025-11-25) with the TypeScript SDK's experimental
// tasks client: a task-augmented call streamed to its result, tasks/get, tasks/result,
// tasks/list, and cancelling a running task twice. Prints one JSON report for the test to check.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const [url] = process.argv.slice(2);
const client = new Client({ name: 'durable-mcp-ts-tasks', version: '1.0.0' });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const tasks = client.experimental.tasks;

const report = {};
report.capability = client.getServerCapabilities().tasks ?? null;
const { tools } = await client.listTools();
report.task_support = Object.fromEntries(
  tools.map((tool) => [tool.name, tool.execution?.taskSupport ?? null]),
);

// The SDK makes the call a task on its own: the tool's taskSupport is "required".
report.stream = [];
const call = { name: 'run_batch_processing', arguments: { total_items: 6, batch_size: 1, processing_delay: 5 } };
for await (const message of tasks.callToolStream(call, CallToolResultSchema, { task: { ttl: 60000 } })) {
  report.stream.push(message.type);
  if (message.type === 'taskCreated') report.created = message.task;
  if (message.type === 'result') report.result = message.result;
  if (message.type === 'error') report.error = String(message.error?.message ?? message.error);
}
const taskId = report.created?.taskId;
report.get = await tasks.getTask(taskId);
report.task_result = await tasks.getTaskResult(taskId, CallToolResultSchema);
report.list = await tasks.listTasks();

let running;
const endless = { name: 'run_batch_processing', arguments: { total_items: 10, batch_size: 1, processing_delay: 3600 } };
for await (const message of tasks.callToolStream(endless, CallToolResultSchema)) {
  if (message.type === 'taskCreated') {
    running = message.task.taskId;
    break;
  }
}
report.cancelled = await tasks.cancelTask(running);
try {
  await tasks.cancelTask(running);
  report.second_cancel = 'accepted';
} catch (error) {
  report.second_cancel = String(error.message ?? error);
}
await client.close();
process.stdout.write(JSON.stringify(report) + '\n');
