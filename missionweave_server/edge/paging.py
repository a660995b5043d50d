"""Page sizes and opaque page tokens of the list RPCs (ListWorkItems, ListMissions, ListIdentities,
ListAgentCardVersions).

A token is the last key of the previous page, base64url-encoded with a prefix naming the list, so
a token of one list is refused by another. It carries no authority: every page is authorized
again, and a key the caller may not see is never in a page it gets.
"""

from __future__ import annotations

import base64
import binascii

from missionweave.kernel.errors import R, Rejected

DEFAULT_PAGE = 100
MAX_PAGE = 1000


def page_size(requested: int) -> int:
    """The size asked for, 0 meaning DEFAULT_PAGE; more than MAX_PAGE is INVALID_ARGUMENT."""
    if requested > MAX_PAGE:
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT,
            f"page_size is at most {MAX_PAGE}",
            field="page_size",
            limit=MAX_PAGE,
        )
    return requested or DEFAULT_PAGE


def encode_token(kind: str, last_key: str) -> str:
    return base64.urlsafe_b64encode(f"{kind}:{last_key}".encode()).decode().rstrip("=")


def decode_token(kind: str, token: str) -> str:
    """The last key a token of ``kind`` names ("" for no token); anything else is INVALID_ARGUMENT."""
    if not token:
        return ""
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        text = ""
    prefix = f"{kind}:"
    if not text.startswith(prefix) or len(text) == len(prefix):
        raise foreign_token()
    return text[len(prefix) :]


def foreign_token() -> Rejected:
    return Rejected(
        R.REJECTION_REASON_INVALID_ARGUMENT, "page_token is not one this list issued", field="page_token"
    )
