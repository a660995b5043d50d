"""The history checker (issue 40 part 4): valid histories pass; each anomaly is flagged as its kind.

Each anomalous history below is built by hand to show exactly one anomaly (or, where one fault
necessarily shows as two, exactly the two named); each rule of ``simulation.checker`` has a test
here that fails if that rule is removed.
"""

from __future__ import annotations

import random
import time

import pytest

from simulation.checker import KINDS, Anomaly, check
from simulation.history import History, Kind, Phase

G = "grp_1"


class H:
    """A small builder: records in call order, as a real recorder would."""

    def __init__(self) -> None:
        self.history = History()

    def invoke(self, process: str, cid: str, group: str = G) -> H:
        self.history.record(process, Kind.COMMAND, Phase.INVOKE, group, command_id=cid)
        return self

    def ok(self, process: str, cid: str, seq: int, shard: str = "s1", group: str = G) -> H:
        self.history.record(process, Kind.COMMAND, Phase.OK, group, command_id=cid, seq=seq, shard=shard)
        return self

    def fail(self, process: str, cid: str, group: str = G) -> H:
        self.history.record(process, Kind.COMMAND, Phase.FAIL, group, command_id=cid)
        return self

    def info(self, process: str, cid: str, group: str = G) -> H:
        self.history.record(process, Kind.COMMAND, Phase.INFO, group, command_id=cid)
        return self

    def command(self, process: str, cid: str, seq: int, group: str = G) -> H:
        return self.invoke(process, cid, group).ok(process, cid, seq, group=group)

    def read_invoke(self, process: str, after: int = 0, group: str = G) -> H:
        self.history.record(process, Kind.READ, Phase.INVOKE, group, after=after)
        return self

    def read_ok(self, process: str, events: list[tuple[int, str]], head: int = 0, group: str = G) -> H:
        self.history.record(process, Kind.READ, Phase.OK, group, events=tuple(events), head=head)
        return self

    def read(self, process: str, events: list[tuple[int, str]], head: int = 0, after: int = 0) -> H:
        return self.read_invoke(process, after).read_ok(process, events, head)

    def final(self, log: list[tuple[int, str]], group: str = G) -> History:
        self.history.final_logs[group] = log
        return self.history


def kinds(anomalies: list[Anomaly]) -> list[str]:
    return [a.kind for a in anomalies]


# ---------------------------------------------------------------------------------------- valid


def test_concurrent_clients_and_readers_pass() -> None:
    h = (
        H()
        .invoke("c1", "a")
        .invoke("c2", "b")
        .read_invoke("r1")
        .ok("c2", "b", 1)
        .read_ok("r1", [(1, "b")], head=1)
        .ok("c1", "a", 2)
        .read("r2", [(1, "b"), (2, "a")], head=2)
        .read("r3", [(2, "a")], head=2, after=1)
    )
    assert check(h.final([(1, "b"), (2, "a")])) == []


def test_retries_answered_with_the_same_seq_pass() -> None:
    h = (
        H()
        .invoke("c1", "a")
        .info("c1", "a")  # timeout: it was applied after all
        .invoke("c1", "a")
        .ok("c1", "a", 1)  # the retry is answered as replayed
        .invoke("c1", "a")
        .ok("c1", "a", 1, shard="s2")  # a retry at another shard after a takeover: same seq
        .command("c2", "b", 2)
    )
    assert check(h.final([(1, "a"), (2, "b")])) == []


def test_info_commands_either_way_and_failures_absent_pass() -> None:
    h = (
        H()
        .invoke("c1", "applied")
        .info("c1", "applied")
        .invoke("c2", "not-applied")
        .info("c2", "not-applied")
        .invoke("c3", "refused")
        .fail("c3", "refused")
        .invoke("c4", "never-answered")  # the client crashed: open at the end, counts as info
        .invoke("c5", "x")
        .info("c5", "x")
        .invoke("c5", "x")
        .fail("c5", "x")  # a later attempt refused: the info attempt may have applied it
    )
    assert check(h.final([(1, "applied"), (2, "x")])) == []


def test_reads_that_stop_early_or_know_no_head_pass() -> None:
    h = (
        H()
        .command("c1", "a", 1)
        .command("c1", "b", 2)
        .command("c1", "c", 3)
        .read("r1", [], head=0)  # told nothing
        .read("r1", [(1, "a")], head=3)  # stopped after one event (page limit)
        .read("r1", [], head=3, after=3)  # caught up
        .read("r2", [(1, "a"), (2, "b")], head=0)
        .read_invoke("r3", after=1)
    )
    h.history.record("r3", Kind.READ, Phase.INFO, G)  # a broken stream: nothing to check
    h.read("r3", [(2, "b"), (3, "c")], head=3, after=1)
    assert check(h.final([(1, "a"), (2, "b"), (3, "c")])) == []


def test_multi_event_commands_and_authority_events_pass() -> None:
    h = (
        H()
        .command("c1", "a", 1)  # appends seq 1..3
        .command("c1", "b", 5)  # seq 4 is the Authority's own event
        .read("r1", [(1, "a"), (2, "a"), (3, "a"), (4, ""), (5, "b")], head=5)
    )
    assert check(h.final([(1, "a"), (2, "a"), (3, "a"), (4, ""), (5, "b")])) == []


def test_several_groups_and_no_final_log_pass() -> None:
    h = H().command("c1", "a", 1).command("c1", "a2", 1, group="g2").command("c2", "b", 2)
    h.read("r1", [(1, "a"), (2, "b")], head=2)
    assert check(h.history) == []  # no final logs at all: answer and read rules only
    assert check(h.final([(1, "a2")], group="g2")) == []


def test_a_random_linearizable_history_of_100k_ops_passes_quickly() -> None:
    history = random_valid_history(seed=40, clients=8, readers=3, groups=4, ops=100_000)
    assert len(history.ops) >= 100_000
    started = time.perf_counter()
    assert check(history) == []
    assert time.perf_counter() - started < 10.0


def random_valid_history(seed: int, clients: int, readers: int, groups: int, ops: int) -> History:
    """A simulated linearizable log per Group: commands apply at a random moment between invoke
    and completion (or not, for info); reads observe a prefix at a moment within their window."""
    rng = random.Random(seed)
    history = History()
    logs: dict[str, list[tuple[int, str]]] = {f"g{i}": [] for i in range(groups)}
    # process -> (kind, group, cid or after, applied?)
    pending: dict[str, tuple[Kind, str, str, int, bool]] = {}
    counter = 0
    processes = [f"c{i}" for i in range(clients)] + [f"r{i}" for i in range(readers)]
    while len(history.ops) < ops:
        process = rng.choice(processes)
        if process not in pending:
            group = rng.choice(sorted(logs))
            if process.startswith("c"):
                counter += 1
                cid = f"cmd{counter}"
                history.record(process, Kind.COMMAND, Phase.INVOKE, group, command_id=cid)
                pending[process] = (Kind.COMMAND, group, cid, 0, False)
            else:
                after = rng.randint(0, len(logs[group]))
                history.record(process, Kind.READ, Phase.INVOKE, group, after=after)
                pending[process] = (Kind.READ, group, "", after, False)
            continue
        kind, group, cid, after, applied = pending[process]
        log = logs[group]
        if kind is Kind.COMMAND and not applied and rng.random() < 0.7:
            n = rng.choice((1, 1, 2))
            first = len(log) + 1
            log.extend((first + i, cid) for i in range(n))
            pending[process] = (kind, group, cid, first, True)
            continue
        del pending[process]
        if kind is Kind.COMMAND:
            if applied:
                if rng.random() < 0.95:
                    history.record(process, kind, Phase.OK, group, command_id=cid, seq=after)
                else:
                    history.record(process, kind, Phase.INFO, group, command_id=cid)
            else:
                phase = Phase.FAIL if rng.random() < 0.5 else Phase.INFO
                history.record(process, kind, phase, group, command_id=cid)
        else:
            stop = rng.randint(after, min(len(log), after + 256))  # at most one page
            head = rng.choice((0, len(log)))
            history.record(process, kind, Phase.OK, group, events=tuple(log[after:stop]), head=head)
    history.final_logs = {g: list(log) for g, log in logs.items()}
    return history


# ------------------------------------------------------------------------------------ anomalies


def test_lost_an_acknowledged_command_missing_from_the_final_log() -> None:
    h = H().command("c1", "a", 1).invoke("c2", "b").info("c2", "b")
    found = check(h.final([(1, "b")]))
    assert kinds(found) == ["lost"]
    assert "'a'" in found[0].detail and "c1" in found[0].detail and "t=2" in found[0].detail
    assert [op.time for op in found[0].ops] == [1, 2]


def test_lost_an_acknowledged_command_at_another_seq_than_answered() -> None:
    h = H().invoke("c1", "a").invoke("c2", "b").ok("c1", "a", 1).info("c2", "b")
    assert kinds(check(h.final([(1, "b"), (2, "a")]))) == ["lost"]


def test_duplicate_a_command_applied_twice_in_the_final_log() -> None:
    h = H().command("c1", "a", 1).command("c2", "b", 2)
    found = check(h.final([(1, "a"), (2, "b"), (3, "a")]))
    assert kinds(found) == ["duplicate"]
    assert "seq 1..1, seq 3..3" in found[0].detail


def test_duplicate_two_answers_naming_different_seqs() -> None:
    h = H().command("c1", "a", 1).invoke("c1", "a").ok("c1", "a", 2, shard="s2")
    assert kinds(check(h.history)) == ["duplicate"]  # no final log: only the answers tell


def test_gap_in_the_final_log() -> None:
    h = H().command("c1", "a", 1).command("c1", "b", 3)
    found = check(h.final([(1, "a"), (3, "b")]))
    assert kinds(found) == ["gap"]
    assert "seq 3 (expected 2" in found[0].detail


def test_gap_in_a_read() -> None:
    h = H().command("c1", "a", 1).command("c1", "b", 2).command("c1", "c", 3)
    h.read("r1", [(1, "a"), (3, "c")], head=3)
    found = check(h.final([(1, "a"), (2, "b"), (3, "c")]))
    assert kinds(found) == ["gap"]
    assert "r1" in found[0].detail and "seq 3 where seq 2" in found[0].detail


def test_gap_in_a_read_that_starts_past_its_cursor() -> None:
    h = H().command("c1", "a", 1).command("c1", "b", 2).read("r1", [(2, "b")], head=2, after=0)
    assert kinds(check(h.final([(1, "a"), (2, "b")]))) == ["gap"]


def test_stale_read_behind_an_acknowledged_command() -> None:
    h = H().command("c1", "a", 1).command("c1", "b", 2).read("r1", [(1, "a")], head=1)
    found = check(h.final([(1, "a"), (2, "b")]))
    assert kinds(found) == ["stale-read"]
    assert "head 1" in found[0].detail and "'b'" in found[0].detail


def test_stale_read_behind_a_multi_event_command() -> None:
    # The command's events are seq 1..2: a head of 1 after its OK saw half of it.
    h = H().command("c1", "a", 1).read("r1", [(1, "a")], head=1)
    assert kinds(check(h.final([(1, "a"), (2, "a")]))) == ["stale-read"]


def test_stale_read_behind_an_earlier_read() -> None:
    h = H().invoke("c1", "a").info("c1", "a").invoke("c1", "b").info("c1", "b")  # no OK: no command floor
    h.read("r1", [(1, "a"), (2, "b")], head=2).read("r2", [(1, "a")], head=1)
    found = check(h.final([(1, "a"), (2, "b")]))
    assert kinds(found) == ["stale-read"]
    assert "r1" in found[0].detail and "r2" in found[0].detail


def test_a_read_concurrent_with_a_command_is_not_stale() -> None:
    h = H().command("c1", "a", 1).read_invoke("r1").command("c1", "b", 2).read_ok("r1", [(1, "a")], head=1)
    assert check(h.final([(1, "a"), (2, "b")])) == []


def test_split_brain_two_commands_acknowledged_at_one_seq() -> None:
    h = H().invoke("c1", "a").invoke("c2", "b").ok("c1", "a", 1, shard="s1").ok("c2", "b", 1, shard="s2")
    found = check(h.history)  # no final log: the answers alone show it
    assert kinds(found) == ["split-brain"]
    assert "s1" in found[0].detail and "s2" in found[0].detail and len(found[0].ops) == 4


def test_split_brain_with_a_final_log_also_shows_the_lost_write() -> None:
    h = H().invoke("c1", "a").invoke("c2", "b").ok("c1", "a", 1, shard="s1").ok("c2", "b", 1, shard="s2")
    assert kinds(check(h.final([(1, "a")]))) == ["lost", "split-brain"]


def test_phantom_a_read_forked_from_the_final_log() -> None:
    h = H().invoke("c1", "a").invoke("c2", "b").info("c2", "b").ok("c1", "a", 1)
    h.read("r1", [(1, "b")], head=1)
    found = check(h.final([(1, "a")]))
    assert kinds(found) == ["phantom"]
    assert "'b' at seq 1 where the final log has 'a'" in found[0].detail


def test_phantom_a_read_of_an_event_the_final_log_lacks() -> None:
    h = H().invoke("c1", "a").info("c1", "a").read("r1", [(1, "a")], head=1)
    assert kinds(check(h.final([]))) == ["phantom"]


def test_phantom_a_command_in_the_final_log_never_invoked() -> None:
    h = H().command("c1", "a", 1)
    found = check(h.final([(1, "a"), (2, "ghost")]))
    assert kinds(found) == ["phantom"]
    assert "'ghost'" in found[0].detail


def test_phantom_a_read_of_a_command_before_it_was_invoked() -> None:
    h = H().read("r1", [(1, "a")], head=1).command("c1", "a", 1)
    assert kinds(check(h.final([(1, "a")]))) == ["phantom"]


def test_phantom_without_a_final_log_a_read_disagreeing_with_an_answer() -> None:
    h = H().invoke("c2", "b").info("c2", "b").command("c1", "a", 1).read("r1", [(1, "b")], head=1)
    assert kinds(check(h.history)) == ["phantom"]


def test_phantom_without_a_final_log_two_reads_disagreeing() -> None:
    h = H().invoke("c1", "a").info("c1", "a").invoke("c2", "b").info("c2", "b")
    h.read("r1", [(1, "a")], head=1).read("r2", [(1, "b")], head=1)
    assert kinds(check(h.history)) == ["phantom"]


def test_phantom_without_a_final_log_a_read_of_a_command_never_invoked() -> None:
    h = H().read("r1", [(1, "ghost")], head=1)
    assert kinds(check(h.history)) == ["phantom"]


def test_reordered_a_later_command_appended_before_an_acknowledged_one() -> None:
    h = H().command("c1", "a", 2).command("c2", "b", 1)
    found = check(h.final([(1, "b"), (2, "a")]))
    assert kinds(found) == ["reordered"]
    assert "'b'" in found[0].detail and "'a'" in found[0].detail


def test_reordered_an_info_command_found_before_an_earlier_acknowledged_one() -> None:
    h = H().command("c1", "a", 2).invoke("c2", "b").info("c2", "b")
    assert kinds(check(h.final([(1, "b"), (2, "a")]))) == ["reordered"]


def test_reordered_without_a_final_log() -> None:
    h = H().command("c1", "a", 2).command("c2", "b", 1)
    assert kinds(check(h.history)) == ["reordered"]


def test_a_retry_answered_with_an_older_seq_is_not_reordered() -> None:
    h = H().invoke("c1", "a").info("c1", "a").command("c2", "b", 2).invoke("c1", "a").ok("c1", "a", 1)
    assert check(h.final([(1, "a"), (2, "b")])) == []


def test_reordered_a_command_at_a_seq_a_read_had_seen_before_it_was_invoked() -> None:
    h = H().invoke("c1", "a").info("c1", "a").read("r1", [], head=1).invoke("c2", "b").info("c2", "b")
    assert kinds(check(h.final([(1, "b")]))) == ["reordered"]  # 'a' was not applied: what was at 1?


def test_failed_but_applied_shown_by_a_later_command_before_the_retry() -> None:
    h = H().invoke("c1", "a").fail("c1", "a").command("c2", "b", 2).invoke("c1", "a").ok("c1", "a", 1)
    found = check(h.final([(1, "a"), (2, "b")]))
    assert kinds(found) == ["failed-but-applied"]
    assert "shown by command 'b'" in found[0].detail


def test_a_failed_attempt_then_a_retry_that_applied_it_passes() -> None:
    h = H().invoke("c1", "a").fail("c1", "a").invoke("c1", "a").ok("c1", "a", 1).command("c2", "b", 2)
    assert check(h.final([(1, "a"), (2, "b")])) == []


def test_failed_but_applied() -> None:
    h = H().invoke("c1", "a").fail("c1", "a").invoke("c1", "a").fail("c1", "a")
    found = check(h.final([(1, "a")]))
    assert kinds(found) == ["failed-but-applied"]
    assert len(found[0].ops) == 4


# ------------------------------------------------------------------------------- format, order


@pytest.mark.parametrize(
    "build",
    [
        lambda h: h.ok("c1", "a", 1),  # completion with nothing open
        lambda h: h.invoke("c1", "a").invoke("c1", "b"),  # two open at once
        lambda h: h.invoke("c1", "a").read_ok("c1", []),  # a read completing a command
        lambda h: h.invoke("c1", "a").ok("c1", "b", 1),  # another command_id
    ],
)
def test_a_malformed_history_is_refused(build: object) -> None:
    h = H()
    build(h)  # type: ignore[operator]
    with pytest.raises(ValueError):
        check(h.history)


def test_output_order_is_deterministic_and_by_group_then_kind() -> None:
    h = H()
    h.command("c1", "a", 1, group="g2").command("c1", "b", 3, group="g1").command("c1", "c", 9, group="g1")
    h.history.final_logs = {"g2": [], "g1": [(1, "x"), (3, "b")]}
    found = check(h.history)
    assert [(a.group_id, a.kind) for a in found] == [
        ("g1", "lost"),
        ("g1", "gap"),
        ("g1", "phantom"),
        ("g2", "lost"),
    ]
    assert check(h.history) == found
    assert set(KINDS) >= {a.kind for a in found}
