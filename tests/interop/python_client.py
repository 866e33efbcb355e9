"""Drives the real durable-mcp server with the Python SDK's client (PyPI `mcp`, 2.x).

Prints one JSON object: what the test asserts. In its default mode the SDK first probes
`server/discover` and speaks the stateless 2026-07-28 protocol when the server offers it;
`MCP_MODE=legacy` makes it `initialize` a 2025-11-25 session instead. With MCP_BEARER_TOKEN
set, every request carries it as a bearer token.

The everyday flow: list the tools, start a task and follow it (`subscriptions/listen` on
2026-07-28, `resources/subscribe` on a session) while reading its status to the end, a bad
call. On 2026-07-28 also the `io.modelcontextprotocol/tasks` extension (SEP-2663), which the
SDK leaves to extensions: a task-only tool called as a task and polled with `tasks/get` to its
inline result, and the travel flow, whose questions arrive as `inputRequests` of the task and
are answered with `tasks/update`; and the same trip without the extension, its questions
arriving as `input_required` results of the call, answered by the SDK's elicitation callback.
"""

import asyncio
import json
import os
import sys
import time
from typing import Any, Literal

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client import ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from pydantic import Field

TERMINAL = ("completed", "failed", "cancelled")
TRIP = {"destination": "Lisbon", "start_date": "2027-05-14", "nights": 3, "budget": 900}
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


class CreatedTask(types.Result):
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    ttl_ms: int | None = Field(None, alias="ttlMs")
    poll_interval_ms: int | None = Field(None, alias="pollIntervalMs")


class TaskState(types.Result):
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(None, alias="statusMessage")
    poll_interval_ms: int | None = Field(None, alias="pollIntervalMs")
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = Field(None, alias="inputRequests")


class TaskIdParams(types.RequestParams):
    task_id: str = Field(serialization_alias="taskId")


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(serialization_alias="inputResponses")


class GetTask(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class UpdateTask(types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


def answer(params: dict[str, Any]) -> dict[str, Any]:
    """What the person answers an elicitation: the first hotel offered, and yes to booking."""
    properties = params["requestedSchema"]["properties"]
    if "hotel" in properties:
        return {"action": "accept", "content": {"hotel": properties["hotel"]["enum"][0]}}
    return {"action": "accept", "content": {"book": True}}


class Tasks(ClientExtension):
    """The tasks extension: a `resultType: "task"` answer is polled to its end, and the
    questions it asks on the way are answered with `tasks/update`."""

    identifier = TASKS_EXTENSION

    def __init__(self, report: dict) -> None:
        self.report = report

    def claims(self):
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.drive)]

    async def drive(self, created: CreatedTask, ctx) -> types.CallToolResult:
        handles = self.report.setdefault("task_handles", [])
        handles.append({"status": created.status, "ttl_ms": created.ttl_ms})
        questions = self.report.setdefault("questions", [])
        answered: set[str] = set()
        get = GetTask(params=TaskIdParams(task_id=created.task_id))
        for _ in range(2400):
            state = await ctx.session.send_request(get, TaskState)
            if state.status == "completed":
                return types.CallToolResult.model_validate(state.result)
            if state.status in ("failed", "cancelled"):
                text = json.dumps(state.error) if state.error else state.status
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=text)], is_error=True
                )
            pending = {
                key: request
                for key, request in (state.input_requests or {}).items()
                if key not in answered
            }
            if state.status == "input_required" and pending:
                responses = {}
                for key, request in pending.items():
                    questions.append({"id": key, "message": request["params"]["message"]})
                    responses[key] = answer(request["params"])
                    answered.add(key)
                update = UpdateTask(
                    params=UpdateParams(task_id=created.task_id, input_responses=responses)
                )
                await ctx.session.send_request(update, types.Result)
                continue
            await anyio.sleep(min(state.poll_interval_ms or 100, 100) / 1000)
        raise TimeoutError(f"task {created.task_id} did not end")


async def follow(client: Client, task_id: str, stateless: bool) -> dict:
    """Reads the task's status until it ends, subscribed to it meanwhile; returns the status
    and how many change notifications arrived."""
    uri = f"task://status/{task_id}"
    notified = 0

    async def read_to_end() -> dict:
        for _ in range(1200):
            result = await client.read_resource(uri, cache_mode="bypass")
            status = json.loads(result.contents[0].text)
            if status["status"] in TERMINAL:
                return status
            await asyncio.sleep(0.05)
        raise TimeoutError(f"task {task_id} did not end")

    if not stateless:
        await client.subscribe_resource(uri)
        return {"status": await read_to_end(), "notified": None}
    async with client.listen(resource_subscriptions=[uri]) as subscription:
        honored = subscription.honored.resource_subscriptions

        heard = anyio.Event()

        async def count() -> None:
            nonlocal notified
            async for event in subscription:
                if getattr(event, "uri", None) == uri:
                    notified += 1
                    heard.set()

        async with anyio.create_task_group() as group:
            group.start_soon(count)
            status = await read_to_end()
            # The task may end before the stream's first update is read.
            with anyio.fail_after(10):
                await heard.wait()
            group.cancel_scope.cancel()
    return {"status": status, "notified": notified, "honored": honored}


async def main(url: str) -> None:
    report: dict = {}
    started_at = time.monotonic()
    token = os.environ.get("MCP_BEARER_TOKEN")
    mode = os.environ.get("MCP_MODE", "auto")
    http = None
    if token:
        # The SDK takes headers through the HTTP client it is given.
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(30, read=300),
        )

    def server():
        """The server to connect to: its URL, or a transport over the token's HTTP client (a
        transport serves one connection)."""
        return streamable_http_client(url, http_client=http) if http else url

    async with Client(server(), mode=mode, extensions=[Tasks(report)]) as client:
        report["connect_seconds"] = time.monotonic() - started_at
        report["protocol_version"] = client.protocol_version
        stateless = client.protocol_version == "2026-07-28"
        if stateless:
            extensions = client.server_capabilities.extensions or {}
            report["tasks_extension_advertised"] = TASKS_EXTENSION in extensions
        tools = await client.list_tools()
        report["tools"] = sorted(tool.name for tool in tools.tools)

        started = await client.call_tool(
            "start_batch_processing",
            {"batch_size": 2, "total_items": 6, "processing_delay": 1},
        )
        task_id = started.structured_content["task_id"]
        report["status_uri"] = started.structured_content["status_uri"]
        followed = await follow(client, task_id, stateless)
        report["final_status"] = followed["status"]["status"]
        report["result"] = followed["status"].get("result_data")
        report["notified"] = followed["notified"]

        bad = await client.call_tool("start_batch_processing", {"batch_size": 0, "total_items": 6})
        report["bad_call_is_error"] = bad.is_error
        report["bad_call_text"] = bad.content[0].text

        if stateless:
            batch = await client.call_tool(
                "run_batch_processing", {"batch_size": 2, "total_items": 6, "processing_delay": 1}
            )
            report["task_result"] = batch.structured_content
            trip = await client.call_tool("run_trip_planning", TRIP)
            report["trip_is_error"] = trip.is_error
            report["trip_result"] = trip.structured_content
    if report["protocol_version"] == "2026-07-28":
        # Without the tasks extension, a client that can be asked gets the trip's questions as
        # input_required results of the call itself, which the SDK answers through its
        # elicitation callback and sends again.
        inline_questions = report.setdefault("inline_questions", [])

        async def elicit(_context, params):
            fields = params.model_dump(by_alias=True)
            inline_questions.append(fields["message"])
            return types.ElicitResult.model_validate(answer(fields))

        async with Client(server(), elicitation_callback=elicit) as client:
            trip = await client.call_tool("run_trip_planning", TRIP)
            report["inline_trip_is_error"] = trip.is_error
            report["inline_trip_result"] = trip.structured_content
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
