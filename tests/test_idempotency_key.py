"""MW-11.4-09: the documented execution idempotency key."""

from __future__ import annotations

import blake3
import pytest

from missionweave.sdk.idempotency import attempt_key


@pytest.mark.req("MW-11.4-09")
def test_attempt_key_is_deterministic_and_separates_every_component() -> None:
    key = attempt_key("mis_a", "wi-1", 1, "charge-card")
    assert key == attempt_key("mis_a", "wi-1", 1, "charge-card")
    assert key.startswith("mwk1_") and len(key) == 5 + 32
    others = {
        attempt_key("mis_b", "wi-1", 1, "charge-card"),
        attempt_key("mis_a", "wi-2", 1, "charge-card"),
        attempt_key("mis_a", "wi-1", 2, "charge-card"),  # a reassignment gets its own keys
        attempt_key("mis_a", "wi-1", 1, "send-mail"),
    }
    assert key not in others and len(others) == 4
    # Length prefixes: moving characters from one part to the next never collides.
    assert attempt_key("mis_a", "wi-1", 1, "xop") != attempt_key("mis_a", "wi-1x", 1, "op")


def test_attempt_key_matches_its_documented_construction() -> None:
    h = blake3.blake3()
    for part in ("mis_a", "wi-1", "3", "op"):
        h.update(len(part).to_bytes(4, "big") + part.encode())
    assert attempt_key("mis_a", "wi-1", 3, "op") == "mwk1_" + h.digest(16).hex()


def test_attempt_key_refuses_invalid_parts() -> None:
    with pytest.raises(ValueError):
        attempt_key("mis_a", "wi-1", 0, "op")
    with pytest.raises(ValueError):
        attempt_key("mis a", "wi-1", 1, "op")
