"""The decider's preview overlay (D135): the just-in-time end check evolves an append over a view
of the state whose collections copy an entry on first read and keep writes and deletions to
themselves. No rule iterates a previewed collection yet, so its mapping protocol is tested here
directly: a rule that does must see exactly the entries the append would leave."""

from __future__ import annotations

from missionweave_server.services.authority.decider import _CopyOnRead


def test_the_overlay_sees_the_appends_writes_and_deletions_and_leaves_the_state_alone() -> None:
    base = {"a": [1], "b": [2], "c": [3]}
    view = _CopyOnRead(base)
    view["b"].append(20)  # read: copied, then changed in the copy only
    view["d"] = [4]
    del view["a"]
    assert list(view) == ["b", "d", "c"] and len(view) == 3
    assert dict(view) == {"b": [2, 20], "d": [4], "c": [3]}
    assert "a" not in view and "c" in view
    assert base == {"a": [1], "b": [2], "c": [3]}
    view["a"] = [10]  # written again after its deletion
    assert sorted(view) == ["a", "b", "c", "d"] and len(view) == 4 and view["a"] == [10]
    assert len(_CopyOnRead({})) == 0 and list(_CopyOnRead({})) == []
