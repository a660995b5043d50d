"""A checker of recorded histories (``simulation.history``) in the manner of Jepsen's.

``check(history)`` returns the anomalies the history shows, in a deterministic order (by Group,
then kind in the order of ``KINDS``, then the time of the first operation involved). It takes
O(n log n) time in the size of the history (records plus delivered events).

Terms. An *attempt* is one INVOKE record and the completion record that follows it for the same
process (OK, FAIL or INFO; an attempt never completed counts as INFO). A *command* is a
(group_id, command_id) pair; retries re-send the same command_id, so one command may have several
attempts. A command is *acknowledged* by an OK attempt; the answer names ``seq``, the sequence of
the command's first event. In a final log a command's events (the entries carrying its command_id)
form a *run* of consecutive entries; its *position* is that run (first and last seq). When the
history has no final log for a Group, a command's position is the seq of its first OK answer.
Entries with an empty command_id (events the Authority emits by itself) belong to no command. A
command A *precedes* an operation B when A's OK was recorded before B's INVOKE (real-time order).
The rules that need a final log apply only to Groups present in ``history.final_logs``.

The anomalies (``Anomaly.kind``):

``lost``
    An acknowledged command whose command_id is not in its Group's final log, or is there but no
    run of it starts at the seq the OK answer named.
``duplicate``
    A command_id in two (or more) separate runs of a final log (applied twice); or OK answers for
    one command naming different seqs.
``gap``
    A final log whose seqs are not exactly 1, 2, ..., n in order; or a READ whose delivered seqs
    are not exactly after+1, after+2, ... in delivery order (a read may stop early, never skip).
``stale-read``
    A READ (OK) told a head ``h > 0`` below the *floor* at its invocation: the highest seq known to
    exist before the read began, i.e. the end of the position of every command acknowledged before
    the read was invoked and the head and highest delivered seq of every READ completed before it
    was invoked (linearizability of each Group's log: a read cannot observe an older log than one
    already acknowledged or observed). A read told no head (``head == 0``) or that stopped before
    the floor is not stale: it simply stopped early. (A read that delivered past an acknowledged
    seq without delivering it, or delivered another command there, is a ``gap`` or a ``phantom``.)
``split-brain``
    OK answers (from any shards) for two different command_ids of one Group naming the same seq:
    two writers both believed they appended at that position. (Overlapping ownership that did not
    produce two answers at one seq is visible only as ``lost``/``duplicate``/``phantom``.)
``phantom``
    A READ delivered (seq, command_id) that disagrees with the final log at that seq (a fork, or an
    event the final log does not have); without a final log, a READ that disagrees with an OK answer
    or an earlier READ at that seq; a READ that delivered a command before the command was first
    invoked (an event from the future); a non-empty command_id in a final log (or, without one,
    delivered by a READ) that no attempt ever invoked for that Group.
``reordered``
    A command whose position starts at or below the floor (as for ``stale-read``) at the invocation
    of its first attempt: it was appended at a seq that was already acknowledged or observed before
    it was ever sent (appends out of real-time order). Also applies to commands whose outcome was
    unknown (INFO) but which are in the final log. (When the floor was shown by a READ that
    delivered the command itself, that read is reported as a ``phantom`` instead.)
``failed-but-applied``
    A command with a position whose attempts invoked before the position's first seq was *shown*
    (the floor first reached it: an OK answer or a READ completed) all FAILed; with no such showing,
    all its attempts. A FAIL promises that nothing was written, so some attempt that did not fail
    must have appended it, and it must have been invoked before its event was shown to exist. (A
    failed attempt followed by a retry that was answered OK is legitimate when nothing showed the
    command's seq in between.)

INFO (unknown outcome) commands may or may not be in the final log: neither is an anomaly.

A history that breaks the format (a completion with no open INVOKE of that process, a second INVOKE
while one is open, times not strictly increasing, a completion of another kind or Group than its
INVOKE) raises ``ValueError``.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from simulation.history import History, Kind, Op, Phase

KINDS: tuple[str, ...] = (
    "lost",
    "duplicate",
    "gap",
    "stale-read",
    "split-brain",
    "phantom",
    "reordered",
    "failed-but-applied",
)
_KIND_ORDER = {kind: i for i, kind in enumerate(KINDS)}


@dataclass(frozen=True)
class Anomaly:
    kind: str  # one of KINDS
    group_id: str
    detail: str  # names the operations' times and processes (and the seqs)
    ops: tuple[Op, ...] = ()  # the records involved (invoke and completion of each attempt)


@dataclass
class _Attempt:
    invoke: Op
    done: Op | None = None

    @property
    def phase(self) -> Phase:
        return self.done.phase if self.done is not None else Phase.INFO

    @property
    def ops(self) -> tuple[Op, ...]:
        return (self.invoke,) if self.done is None else (self.invoke, self.done)

    @property
    def command_id(self) -> str:
        if self.done is not None and self.done.command_id:
            return self.done.command_id
        return self.invoke.command_id

    def describe(self) -> str:
        inv = self.invoke
        what = f"command {self.command_id!r}" if inv.kind is Kind.COMMAND else f"read after={inv.after}"
        text = f"{what} by {inv.process} (invoke t={inv.time}"
        done = self.done
        if done is None:
            return text + ", never completed)"
        text += f", {done.phase.value} t={done.time}"
        if done.phase is Phase.OK and inv.kind is Kind.COMMAND:
            text += f" seq={done.seq}"
        if done.phase is Phase.OK and inv.kind is Kind.READ:
            text += f" head={done.head} delivered={_span(done.events)}"
        if done.shard:
            text += f" shard={done.shard}"
        return text + ")"


def _span(events: tuple[tuple[int, str], ...]) -> str:
    if not events:
        return "nothing"
    return f"{len(events)} events seq {events[0][0]}..{events[-1][0]}"


@dataclass
class _Floor:
    """The highest seq known to exist in a Group log, with what showed it."""

    seq: int = 0
    witness: _Attempt | None = None

    def raise_to(self, seq: int, witness: _Attempt) -> None:
        if seq > self.seq:
            self.seq = seq
            self.witness = witness


@dataclass
class _FinalLog:
    seq_to_cid: dict[int, str] = field(default_factory=dict)
    runs: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # command_id -> (first, last)
    entries: list[tuple[int, str]] = field(default_factory=list)
    contiguous: bool = True  # seqs are exactly 1..n: entries[seq - 1] is the entry at seq


def _pair(history: History) -> list[_Attempt]:
    attempts: list[_Attempt] = []
    open_by_process: dict[str, _Attempt] = {}
    last_time: int | None = None
    for op in history.ops:
        if last_time is not None and op.time <= last_time:
            raise ValueError(f"times not strictly increasing at t={op.time} (after t={last_time})")
        last_time = op.time
        if op.phase is Phase.INVOKE:
            if op.process in open_by_process:
                raise ValueError(f"{op.process} invoked at t={op.time} with an operation still open")
            attempt = _Attempt(op)
            open_by_process[op.process] = attempt
            attempts.append(attempt)
            continue
        opened = open_by_process.pop(op.process, None)
        if opened is None:
            raise ValueError(f"{op.process} completed at t={op.time} with no operation open")
        if opened.invoke.kind is not op.kind or opened.invoke.group_id != op.group_id:
            raise ValueError(f"{op.process}'s completion at t={op.time} does not match its invoke")
        if op.kind is Kind.COMMAND and op.command_id and op.command_id != opened.invoke.command_id:
            raise ValueError(f"{op.process}'s completion at t={op.time} names another command_id")
        opened.done = op
    return attempts


def _index_final_log(group_id: str, log: list[tuple[int, str]], found: list[Anomaly]) -> _FinalLog:
    index = _FinalLog(entries=log)
    previous_cid: str | None = None
    for position, (seq, cid) in enumerate(log):
        expected = position + 1
        if seq != expected:
            index.contiguous = False
            found.append(
                Anomaly(
                    "gap",
                    group_id,
                    f"final log entry #{expected} has seq {seq} (expected {expected}; "
                    f"previous seq {log[position - 1][0] if position else 'none'})",
                )
            )
        index.seq_to_cid.setdefault(seq, cid)
        if cid:
            runs = index.runs.setdefault(cid, [])
            if previous_cid == cid:
                runs[-1] = (runs[-1][0], seq)
            else:
                runs.append((seq, seq))
        previous_cid = cid
    return index


def check(history: History) -> list[Anomaly]:
    """The anomalies of ``history`` (see the module docstring), sorted deterministically."""
    attempts = _pair(history)
    found: list[Anomaly] = []

    finals: dict[str, _FinalLog] = {}
    for group_id in sorted(history.final_logs):
        finals[group_id] = _index_final_log(group_id, history.final_logs[group_id], found)

    # Commands: (group, command_id) -> attempts, in invoke order.
    commands: dict[tuple[str, str], list[_Attempt]] = {}
    reads: list[_Attempt] = []
    for attempt in attempts:
        if attempt.invoke.kind is Kind.COMMAND:
            commands.setdefault((attempt.invoke.group_id, attempt.invoke.command_id), []).append(attempt)
        else:
            reads.append(attempt)

    # Final logs against what was invoked: duplicates, never invoked.
    for group_id, final_log in finals.items():
        for cid, cid_runs in final_log.runs.items():
            if len(cid_runs) > 1:
                where = ", ".join(f"seq {a}..{b}" for a, b in cid_runs)
                found.append(
                    Anomaly(
                        "duplicate",
                        group_id,
                        f"command {cid!r} applied {len(cid_runs)} times in the final log: {where}",
                        tuple(op for a in commands.get((group_id, cid), []) for op in a.ops),
                    )
                )
            if (group_id, cid) not in commands:
                found.append(
                    Anomaly(
                        "phantom",
                        group_id,
                        f"command {cid!r} is in the final log at seq {cid_runs[0][0]} but was never invoked",
                    )
                )

    # Answers: duplicate answers, split-brain, lost.
    oks_at_seq: dict[tuple[str, int], dict[str, _Attempt]] = {}
    for (group_id, cid), cmd_attempts in commands.items():
        oks = [a for a in cmd_attempts if a.phase is Phase.OK]
        for ok in oks:
            assert ok.done is not None
            oks_at_seq.setdefault((group_id, ok.done.seq), {}).setdefault(cid, ok)
        answered = sorted({ok.done.seq for ok in oks if ok.done is not None})
        if len(answered) > 1:
            found.append(
                Anomaly(
                    "duplicate",
                    group_id,
                    f"command {cid!r} answered OK at different seqs {answered}: "
                    + "; ".join(ok.describe() for ok in oks),
                    tuple(op for ok in oks for op in ok.ops),
                )
            )
        final = finals.get(group_id)
        if final is None:
            continue
        runs = final.runs.get(cid)
        if oks:
            if runs is None:
                found.append(
                    Anomaly(
                        "lost",
                        group_id,
                        f"command {cid!r} acknowledged but not in the final log: "
                        + "; ".join(ok.describe() for ok in oks),
                        tuple(op for ok in oks for op in ok.ops),
                    )
                )
            else:
                starts = {first for first, _ in runs}
                wrong = [ok for ok in oks if ok.done is not None and ok.done.seq not in starts]
                if wrong:
                    found.append(
                        Anomaly(
                            "lost",
                            group_id,
                            f"command {cid!r} is in the final log at seq "
                            f"{', '.join(str(s) for s in sorted(starts))}, not where acknowledged: "
                            + "; ".join(ok.describe() for ok in wrong),
                            tuple(op for ok in wrong for op in ok.ops),
                        )
                    )

    for (group_id, seq), by_cid in oks_at_seq.items():
        if len(by_cid) > 1:
            involved = sorted(by_cid.values(), key=lambda a: a.invoke.time)
            found.append(
                Anomaly(
                    "split-brain",
                    group_id,
                    f"{len(by_cid)} different commands acknowledged at seq {seq}: "
                    + "; ".join(a.describe() for a in involved),
                    tuple(op for a in involved for op in a.ops),
                )
            )

    found.extend(_check_real_time(history, commands, finals))
    found.extend(_check_reads(reads, commands, finals))
    found.sort(key=_sort_key)
    return found


def _position(
    group_id: str, cid: str, cmd_attempts: list[_Attempt], finals: dict[str, _FinalLog]
) -> tuple[int, int] | None:
    final = finals.get(group_id)
    if final is not None:
        runs = final.runs.get(cid)
        return runs[0] if runs else None
    for attempt in cmd_attempts:
        if attempt.phase is Phase.OK and attempt.done is not None:
            return (attempt.done.seq, attempt.done.seq)
    return None


def _check_real_time(
    history: History,
    commands: dict[tuple[str, str], list[_Attempt]],
    finals: dict[str, _FinalLog],
) -> list[Anomaly]:
    """Stale reads, reordered appends, failed-but-applied: one sweep in time order keeping each
    Group's floor (the highest seq known to exist) and when it rose."""
    found: list[Anomaly] = []
    positions = {key: _position(key[0], key[1], atts, finals) for key, atts in commands.items()}
    by_completion: dict[int, _Attempt] = {}
    for cmd_attempts in commands.values():
        for attempt in cmd_attempts:
            if attempt.done is not None:
                by_completion[attempt.done.time] = attempt
    cmd_floor: dict[str, _Floor] = {}
    read_floor: dict[str, _Floor] = {}
    first_invoke_floor: dict[tuple[str, str], tuple[int, _Attempt | None]] = {}
    read_open_floor: dict[int, _Floor] = {}  # read invoke time -> floor then
    open_reads: dict[str, Op] = {}
    # Per Group, each rise of the floor: (floor, time, what showed it), floors increasing.
    rises: dict[str, tuple[list[int], list[int], list[_Attempt]]] = {}

    def combined(group_id: str) -> _Floor:
        c = cmd_floor.get(group_id, _Floor())
        r = read_floor.get(group_id, _Floor())
        return _Floor(c.seq, c.witness) if c.seq >= r.seq else _Floor(r.seq, r.witness)

    def rose(group_id: str, time: int) -> None:
        now = combined(group_id)
        floors, times, witnesses = rises.setdefault(group_id, ([], [], []))
        if now.witness is not None and (not floors or now.seq > floors[-1]):
            floors.append(now.seq)
            times.append(time)
            witnesses.append(now.witness)

    for op in history.ops:
        group_id = op.group_id
        if op.kind is Kind.COMMAND:
            if op.phase is Phase.INVOKE:
                key = (group_id, op.command_id)
                if key not in first_invoke_floor:
                    floor = combined(group_id)
                    first_invoke_floor[key] = (floor.seq, floor.witness)
            elif op.phase is Phase.OK:
                attempt = by_completion[op.time]
                position = positions.get((group_id, attempt.command_id))
                if position is not None:
                    cmd_floor.setdefault(group_id, _Floor()).raise_to(position[1], attempt)
                    rose(group_id, op.time)
            continue
        if op.phase is Phase.INVOKE:
            open_reads[op.process] = op
            read_open_floor[op.time] = combined(group_id)
            continue
        invoke = open_reads.pop(op.process)
        floor = read_open_floor.pop(invoke.time)
        if op.phase is not Phase.OK:
            continue
        read = _Attempt(invoke, op)
        if op.head and op.head < floor.seq and floor.witness is not None:
            witness = floor.witness
            found.append(
                Anomaly(
                    "stale-read",
                    group_id,
                    f"{read.describe()} was told head {op.head}, but seq {floor.seq} was known to exist "
                    f"before it was invoked: {witness.describe()}",
                    witness.ops + read.ops,
                )
            )
        # The last delivered seq is the highest one unless the read has a gap (flagged as such).
        seen = max(op.head, op.events[-1][0] if op.events else 0)
        read_floor.setdefault(group_id, _Floor()).raise_to(seen, read)
        rose(group_id, op.time)
    for key, (floor_seq, earlier) in first_invoke_floor.items():
        position = positions.get(key)
        if position is None or earlier is None or position[0] > floor_seq:
            continue
        if earlier.invoke.kind is Kind.READ and earlier.done is not None:
            if any(cid == key[1] for _, cid in earlier.done.events):
                continue  # a read of the command before it was invoked: a phantom (see _check_reads)
        cmd_attempts = commands[key]
        found.append(
            Anomaly(
                "reordered",
                key[0],
                f"command {key[1]!r} is at seq {position[0]}, but seq {floor_seq} was known to exist "
                f"before it was first invoked: {earlier.describe()}; then "
                + "; ".join(a.describe() for a in cmd_attempts),
                earlier.ops + tuple(op for a in cmd_attempts for op in a.ops),
            )
        )
    for key, cmd_attempts in commands.items():
        position = positions.get(key)
        if position is None or not any(a.phase is Phase.FAIL for a in cmd_attempts):
            continue
        floors, times, witnesses = rises.get(key[0], ([], [], []))
        i = bisect_left(floors, position[0])
        shown_at = times[i] if i < len(floors) else None
        before = [a for a in cmd_attempts if shown_at is None or a.invoke.time < shown_at]
        if not before or any(a.phase is not Phase.FAIL for a in before):
            continue
        shown = "never shown before the end" if shown_at is None else f"shown by {witnesses[i].describe()}"
        found.append(
            Anomaly(
                "failed-but-applied",
                key[0],
                f"command {key[1]!r} is at seq {position[0]} ({shown}), but every attempt of it invoked "
                "before then failed: " + "; ".join(a.describe() for a in before),
                tuple(op for a in before for op in a.ops) + (() if shown_at is None else witnesses[i].ops),
            )
        )
    return found


def _check_reads(
    reads: list[_Attempt],
    commands: dict[tuple[str, str], list[_Attempt]],
    finals: dict[str, _FinalLog],
) -> list[Anomaly]:
    """Each OK read: contiguous from its cursor, agreeing with the final log (or, without one, with
    OK answers and earlier reads), delivering no command before it was invoked."""
    found: list[Anomaly] = []
    first_invoke: dict[tuple[str, str], int] = {key: atts[0].invoke.time for key, atts in commands.items()}
    # Without a final log: seq -> (command_id, what showed it), OK answers first.
    observed: dict[str, dict[int, tuple[str, _Attempt]]] = {}
    for (group_id, cid), cmd_attempts in commands.items():
        if group_id in finals:
            continue
        seen = observed.setdefault(group_id, {})
        for attempt in cmd_attempts:
            if attempt.phase is Phase.OK and attempt.done is not None:
                seen.setdefault(attempt.done.seq, (cid, attempt))
    # For a contiguous final log: the latest first invocation among the commands at seq 1..j. In a
    # valid history a read that delivered up to seq j completed after all of them were invoked.
    latest_invoke: dict[str, list[int]] = {}
    for group_id, final_log in finals.items():
        if final_log.contiguous:
            prefix = [0]
            for _, cid in final_log.entries:
                prefix.append(max(prefix[-1], first_invoke.get((group_id, cid), 0) if cid else 0))
            latest_invoke[group_id] = prefix
    for read in reads:
        done = read.done
        if done is None or done.phase is not Phase.OK:
            continue
        group_id = read.invoke.group_id
        after = read.invoke.after
        prefix_latest = latest_invoke.get(group_id)
        if prefix_latest is not None and done.events:
            # Fast path: the read delivered exactly a slice of the final log (so no gap, no fork),
            # all of it invoked before the read completed.
            end = after + len(done.events)
            entries = finals[group_id].entries
            if (
                end <= len(entries)
                and prefix_latest[end] <= done.time
                and tuple(entries[after:end]) == done.events
            ):
                continue
        expected = after
        for seq, _ in done.events:
            expected += 1
            if seq != expected:
                found.append(
                    Anomaly(
                        "gap",
                        group_id,
                        f"{read.describe()} delivered seq {seq} where seq {expected} was next",
                        read.ops,
                    )
                )
                break
        final = finals.get(group_id)
        future: list[str] = []
        never: list[str] = []
        for seq, cid in done.events:
            if not cid:
                continue
            invoked_at = first_invoke.get((group_id, cid))
            if invoked_at is None:
                if final is None:
                    never.append(f"seq {seq} {cid!r}")
            elif invoked_at > done.time:
                future.append(f"seq {seq} {cid!r} (first invoked t={invoked_at})")
        if future:
            found.append(
                Anomaly(
                    "phantom",
                    group_id,
                    f"{read.describe()} delivered commands before they were invoked: {', '.join(future)}",
                    read.ops,
                )
            )
        if never:
            found.append(
                Anomaly(
                    "phantom",
                    group_id,
                    f"{read.describe()} delivered commands never invoked: {', '.join(never)}",
                    read.ops,
                )
            )
        if final is not None:
            forks = [
                (seq, cid, final.seq_to_cid.get(seq))
                for seq, cid in done.events
                if final.seq_to_cid.get(seq) != cid
            ]
            if forks:
                seq, cid, there = forks[0]
                shown = "no entry" if there is None else repr(there)
                found.append(
                    Anomaly(
                        "phantom",
                        group_id,
                        f"{read.describe()} delivered {cid!r} at seq {seq} where the final log has {shown}"
                        + (f" (and {len(forks) - 1} more such)" if len(forks) > 1 else ""),
                        read.ops,
                    )
                )
            continue
        seen = observed.setdefault(group_id, {})
        for seq, cid in done.events:
            earlier = seen.get(seq)
            if earlier is None:
                seen[seq] = (cid, read)
            elif earlier[0] != cid:
                found.append(
                    Anomaly(
                        "phantom",
                        group_id,
                        f"{read.describe()} delivered {cid!r} at seq {seq} where {earlier[1].describe()} "
                        f"showed {earlier[0]!r}",
                        earlier[1].ops + read.ops,
                    )
                )
                break
    return found


def _sort_key(anomaly: Anomaly) -> tuple[str, int, int, str]:
    first = min((op.time for op in anomaly.ops), default=0)
    return (anomaly.group_id, _KIND_ORDER[anomaly.kind], first, anomaly.detail)
