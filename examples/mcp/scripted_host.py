"""What an LLM host does through `mwp mcp`, scripted: the calls a model makes to work one WorkItem,
with the mcp SDK's own client over stdio (docs/mcp.md). A real host lets the model choose the calls
from the tool descriptions; this script makes the usual ones in the usual order:

  wait_for_offer -> accept_offer -> start_work -> show_work_item -> read_input (each)
  -> report_progress -> store_output -> submit_work (one Evidence per acceptance criterion)

Run it against `make run` as a registered Worker that is a member of the Group:

  python examples/mcp/scripted_host.py --as worker-1 --key keys/worker-1.key --group $G

It starts `mwp mcp --as ... --key ...` itself (the way a host's configuration does), waits up to
--wait seconds for an offer, and prints each tool's short text. Exit 0 once submitted, 1 on a
refusal (its reason and hint are printed), 2 when no offer came."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult, TextContent


class Refused(Exception):
    pass


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result: CallToolResult = await session.call_tool(tool, arguments)
    text = " ".join(c.text for c in result.content if isinstance(c, TextContent))
    print(f"{tool}: {text}")
    content = result.structured_content or {}
    if result.is_error:
        raise Refused(f"{content.get('reason')}: {content.get('hint')}")
    return content


async def work_one(session: ClientSession, group: str, wait_s: int) -> int:
    offers = (await call(session, "wait_for_offer", group_id=group, timeout_seconds=wait_s)).get("offers", [])
    if not offers:
        return 2
    work_item_id = offers[0]["work_item_id"]
    await call(session, "accept_offer", group_id=group, work_item_id=work_item_id)
    await call(session, "start_work", group_id=group, work_item_id=work_item_id)
    item = await call(session, "show_work_item", group_id=group, work_item_id=work_item_id)
    read = []
    for given in item.get("inputs", []):
        got = await call(session, "read_input", group_id=group, work_item_id=work_item_id, name=given["name"])
        read.append(f"{given['name']}: {len(got.get('text') or got.get('base64') or '')} characters")
    await call(session, "report_progress", group_id=group, work_item_id=work_item_id, phase="writing")
    goal = item["contract"].get("goal", "")
    report = f"# {item.get('title', work_item_id)}\n\nGoal: {goal}\n\nInputs read:\n" + "".join(
        f"- {line}\n" for line in read or ["(none)"]
    )
    stored = await call(
        session,
        "store_output",
        group_id=group,
        work_item_id=work_item_id,
        text=report,
        media_type="text/markdown",
    )
    evidence = [
        {
            "criterion_id": c["criterion_id"],
            "summary": f"checked: {c.get('description', '')}",
            "artifacts": [stored["artifact"]],
        }
        for c in item["contract"].get("acceptance_criteria", [])
    ]
    await call(
        session,
        "submit_work",
        group_id=group,
        work_item_id=work_item_id,
        evidence=evidence,
        summary="report written",
    )
    return 0


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=os.environ.get("MWP_TARGET", "127.0.0.1:50051"))
    parser.add_argument("--as", dest="actor", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--wait", type=int, default=60, help="seconds to wait for an offer")
    args = parser.parse_args()
    server = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "missionweave.cli",
            "--target",
            args.target,
            "mcp",
            "--as",
            args.actor,
            "--key",
            args.key,
        ],
        env=dict(os.environ),
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.discover()
        try:
            return await work_one(session, args.group, args.wait)
        except Refused as refused:
            print(f"refused: {refused}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
