"""Drives the real durable-mcp server with the Python SDK's client (PyPI `mcp`, 2.x).

Prints one JSON object: what the test asserts. The SDK first probes `server/discover`
(2026-07-28) and falls back to `initialize` when the server refuses; the time that takes is
reported so the test can check the probe was answered at once, not left to its timeout.
With MCP_BEARER_TOKEN set, every request carries it as a bearer token.
"""

import asyncio
import json
import os
import sys
import time

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

TERMINAL = ("completed", "failed", "cancelled")


async def main(url: str) -> None:
    report: dict = {}
    started_at = time.monotonic()
    token = os.environ.get("MCP_BEARER_TOKEN")
    server = url
    if token:
        # The SDK takes headers through the HTTP client it is given.
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(30, read=300),
        )
        server = streamable_http_client(url, http_client=http)
    async with Client(server) as client:
        report["connect_seconds"] = time.monotonic() - started_at
        tools = await client.list_tools()
        report["tools"] = sorted(tool.name for tool in tools.tools)

        started = await client.call_tool(
            "start_batch_processing",
            {"batch_size": 2, "total_items": 6, "processing_delay": 1},
        )
        task_id = started.structured_content["task_id"]
        report["status_uri"] = started.structured_content["status_uri"]
        await client.subscribe_resource(f"task://status/{task_id}")

        status = {}
        for _ in range(1200):
            result = await client.read_resource(f"task://status/{task_id}")
            status = json.loads(result.contents[0].text)
            if status["status"] in TERMINAL:
                break
            await asyncio.sleep(0.05)
        report["final_status"] = status.get("status")
        report["result"] = status.get("result_data")

        bad = await client.call_tool("start_batch_processing", {"batch_size": 0, "total_items": 6})
        report["bad_call_is_error"] = bad.is_error
        report["bad_call_text"] = bad.content[0].text
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
