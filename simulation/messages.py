"""What travels over the simulated network between clients and processes (the RPCs modeled)."""

from __future__ import annotations

from dataclasses import dataclass

from missionweave.v1 import command_pb2


@dataclass(frozen=True)
class CommandRequest:  # AuthorityService.Submit
    request_id: int
    client: str
    command: command_pb2.Command


@dataclass(frozen=True)
class CommandReply:
    request_id: int
    command_id: str
    ok: bool
    seq: int = 0  # ok: the sequence of the command's first event
    replayed: bool = False
    reason: str = ""  # a refusal's RejectionReason name (or a shell condition such as NOT_OWNER)
    owner_hint: str = ""  # NOT_OWNER: the instance that owns the Group
    shard: str = ""


@dataclass(frozen=True)
class OpenSession:  # the membership service's OpenSession
    request_id: int
    client: str


@dataclass(frozen=True)
class SessionOpened:
    request_id: int
    session_epoch: int


@dataclass(frozen=True)
class Upload:  # the artifact store's upload with a manifest signed for a Group
    request_id: int
    client: str
    digest: str
    work_item_id: str
    mission_id: str


@dataclass(frozen=True)
class Uploaded:
    request_id: int
    digest: str


@dataclass(frozen=True)
class Fetch:  # the gateway's read of one member's view of a Group log after a cursor
    request_id: int
    client: str
    group_id: str
    member_id: str
    after: int


@dataclass(frozen=True)
class Entry:
    seq: int
    command_id: str  # the causing command (for the history; a skipped entry carries none to the reader)
    visible: bool  # False: a skipped-sequence marker (the reader may not see this event)
    payload: str = ""
    conversation_id: str = ""
    read_at: int = 0  # the durable head when the gateway decided (its state then decided visibility)


@dataclass(frozen=True)
class Batch:
    request_id: int
    group_id: str
    after: int  # the effective cursor: never before the member's visibility start (MW-8-07)
    entries: tuple[Entry, ...]
    head: int
    ended: bool = False  # the member's Membership ended: nothing more to read


Message = CommandRequest | CommandReply | OpenSession | SessionOpened | Upload | Uploaded | Fetch | Batch
