"""An A2A client of `mwp bridge a2a-server` (docs/bridge-a2a-server.md), with the a2a-sdk's own
client: it proposes work to a Group with a message, follows what becomes of the proposal for a while,
then follows the whole Mission from the last cursor it saw, as a client does after a disconnect.

  python examples/a2a/propose_and_follow.py --url http://127.0.0.1:50071 --token-file token \
      --group $G --text "Draft the audit letter"

Each event is printed as one line: its task, A2A state, MWP state and resume cursor. Sending the
same --message-id again gives the same task (the send is idempotent). Exit 0; 1 when the endpoint
refuses (the MWP reason is in the message)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.client import ClientCallContext
from a2a.client.errors import A2AClientError
from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import A2AError


def line(response: Any) -> tuple[str, str]:
    """One event as a line, and its resume cursor."""
    kind = response.WhichOneof("payload")
    event = getattr(response, kind)
    fields = event.metadata.fields
    cursor = fields["mwp.cursor"].string_value if "mwp.cursor" in fields else ""
    task = event.id if kind == "task" else event.task_id
    state = a2a.TaskState.Name(event.status.state) if kind in ("task", "status_update") else "-"
    mwp_state = fields["mwp.state"].string_value if "mwp.state" in fields else "-"
    return f"{kind:14} {task:50} {state:26} {mwp_state:18} cursor {cursor}", cursor


async def for_a_while(stream: AsyncIterator[Any], seconds: float) -> str:
    """Prints the stream's events until it ends or ``seconds`` pass; the last cursor seen."""
    cursor = ""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            async for response in stream:
                text, seen = line(response)
                print(text, flush=True)
                cursor = seen or cursor
    return cursor


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", default="http://127.0.0.1:50071", help="the endpoint's JSON-RPC URL (its card)"
    )
    parser.add_argument("--token-file", type=Path, required=True, help="the token --new-token printed")
    parser.add_argument("--group", required=True)
    parser.add_argument("--text", default="Draft the audit letter", help="the work proposed")
    parser.add_argument("--message-id", default="propose-and-follow-1", help="the same id: the same task")
    parser.add_argument("--seconds", type=float, default=5, help="how long to follow each stream")
    args = parser.parse_args()
    auth = {"Authorization": f"Bearer {args.token_file.read_text().strip()}"}
    async with httpx.AsyncClient(headers=auth) as http:
        card = await A2ACardResolver(http, args.url).get_agent_card()
        config = ClientConfig(
            streaming=True,
            supported_protocol_bindings=["GRPC"],
            grpc_channel_factory=grpc.aio.insecure_channel,
            httpx_client=http,
        )
        client = ClientFactory(config).create(card)
        call = ClientCallContext(service_parameters=auth)
        send = a2a.SendMessageRequest(
            message=a2a.Message(
                message_id=args.message_id,
                context_id=args.group,
                role=a2a.ROLE_USER,
                parts=[a2a.Part(text=args.text)],
            )
        )
        try:
            print(f"proposing to {args.group}: {args.text!r}")
            await for_a_while(client.send_message(send, context=call), args.seconds)
            print(f"following mission:{args.group}: a snapshot of it now, then what happens")
            mission = a2a.SubscribeToTaskRequest(id=f"mission:{args.group}")
            cursor = await for_a_while(client.subscribe(mission, context=call), args.seconds)
            resumed = ClientCallContext(service_parameters={**auth, "MWP-Cursor": cursor})
            print(f"reconnected, resuming after cursor {cursor}: every later event once, in order")
            await for_a_while(client.subscribe(mission, context=resumed), args.seconds)
        except (A2AError, A2AClientError) as err:
            print(f"refused: {err}", file=sys.stderr)
            return 1
        finally:
            await client.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
