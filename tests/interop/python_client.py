"""Drives the real durable-mcp server with the Python SDK's client (PyPI `mcp`, 2.x).

Prints one JSON object: what the test asserts. The SDK first probes `server/discover`
(2026-07-28) and falls back to `initialize` when the server refuses; the time that takes is
reported so the test can check the probe was answered at once, not left to its timeout.
"""

import asyncio
import json
import sys
import time

from mcp import Client

TERMINAL = ("completed", "failed", "cancelled")


async def main(url: str) -> None:
    report: dict = {}
    started_at = time.monotonic()
    async with Client(url) as client:
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
