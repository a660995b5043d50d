"""Echo agent: answers every Message that mentions it, in the same Conversation.

The smallest useful MissionWeave agent, built on the Python SDK (``missionweave.sdk.agent``)::

    .venv/bin/python examples/echo_agent.py --as coord --key coord.key --group GROUP_ID

It subscribes to one Group, and for each ``message.posted`` event that mentions it (in
``content.mentions`` or as ``@<its id>`` in the text) posts ``echo: <text>`` as a reply. The SDK hands it
every event once and in order; its cursor survives restarts in ``--state``. The reply's command id is
derived from the event id, so a reply repeated after a crash (the event is redelivered when the agent
stopped between replying and saving its cursor) is answered by the Authority with the stored result
instead of a second Message (MW-16-14). Over TLS it reads the client settings ``mwp`` reads
(``MWP_TLS_CA``, ``MWP_TLS_CLIENT_CERT``/``_KEY``, ...; docs/tls.md). See examples/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import signal

from missionweave.kernel import ids
from missionweave.sdk.agent import Agent, ClientTLS, CommandRejected, Subscription, post_message
from missionweave.v1 import event_pb2


def mentions(event: event_pb2.Event, agent_id: str) -> bool:
    """Whether a posted Message mentions ``agent_id`` (structured mention or ``@agent_id`` in the text)."""
    content = event.message_posted.content
    pattern = rf"(?<![\w@])@{re.escape(agent_id)}(?![\w:-])"
    return agent_id in content.mentions or re.search(pattern, content.text) is not None


async def start(agent: Agent, group_id: str) -> Subscription:
    """Subscribes the echo handler to ``group_id``; returns the subscription."""
    log = logging.getLogger("echo")

    async def on_event(event: event_pb2.Event) -> None:
        if event.type != "message.posted" or event.actor_id == agent.identity_id:
            return  # not a Message, or our own reply
        if not mentions(event, agent.identity_id):
            return
        posted = event.message_posted
        reply = post_message(
            posted.conversation_id, f"echo: {posted.content.text}", reply_to_message_id=posted.message_id
        )
        command_id = ids.derived_id("cmd", "echo", event.event_id)  # one reply per event, even after a crash
        try:
            result = await agent.execute(event.group_id, reply, command_id=command_id)
        except CommandRejected as refused:  # skip it: raising would retry this event (and hold the Group)
            log.warning("#%d: the reply was refused: %s", event.sequence, refused)
            return
        log.info("#%d %s: replied (revision %d)", event.sequence, event.actor_id, result.group_revision)

    return await agent.subscribe(group_id, on_event)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the gateway (default 127.0.0.1:50051)")
    parser.add_argument("--as", dest="identity", required=True, help="the agent identity, e.g. coord")
    parser.add_argument("--key", required=True, help="its key file (from `mwp keygen`)")
    parser.add_argument("--group", required=True, help="the Group to serve")
    parser.add_argument(
        "--state", default=".echo-state", help="session and cursor files (default .echo-state)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on Windows
            loop.add_signal_handler(sig, stop.set)
    tls = ClientTLS.from_env()  # plain text unless MWP_TLS* ask for TLS
    async with Agent.connect(args.target, args.identity, args.key, cursor_dir=args.state, tls=tls) as agent:
        await start(agent, args.group)
        logging.getLogger("echo").info("serving %s as %s; Ctrl-C stops", args.group, args.identity)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
