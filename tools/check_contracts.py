"""``python tools/check_contracts.py``: the public contract's refusals, one truth (issue 40 part 5).

Four sources say which gRPC status code a refusal gets; this check reads each and reports every
place where they disagree (exit status 1), or prints the zero-valued fields and exits 0:

(a) the ``RejectionReason`` enum in protos/missionweave/v1/common.proto: each value's comment names
    its gRPC code(s);
(b) the comments of protos/missionweave/v1/*.proto (every RPC, message and field): where one pairs
    a reason with a code ("UNKNOWN_IDENTITY with code NOT_FOUND", "PEER_UNAVAILABLE (gRPC
    UNAVAILABLE)", "FAILED_PRECONDITION (SESSION_EPOCH_STALE)", "PERMISSION_DENIED / NOT_A_MEMBER");
(c) docs/errors.md: its table "Every reason and its gRPC code", the same pairings in its prose,
    and the rows of a table with a "status" column (the code) and a "reason" column;
(d) the implementation: ``missionweave_server.edge.status.status_code``, asked for each reason without
    metadata and with metadata ``field`` (an identity a request names is NOT_FOUND);
(e) the Artifact store's error codes (``ArtifactErrorCode`` in artifact_service.proto, carried in
    metadata ``artifact_error``): each value's comment names a gRPC code, and the code raising it
    (missionweave/, missionweave_server/: ``artifact_error(R.REJECTION_REASON_X, "CODE", ...)`` or
    ``Rejected(R.X, ..., artifact_error="ARTIFACT_ERROR_CODE_CODE")``) names the reason, hence the code.

Reported: a reason whose codes differ between (a), (c) and (d); a pairing in (b) or (c) whose code
the implementation never gives for that reason; a reason-like name in a comment or the document
that is no RejectionReason, gRPC code or value of another enum of the contract (a misspelt reason);
an Artifact error code whose comment names another code than its reasons get, or another reason;
a reason missing from the document's table; a reason the implementation maps to UNKNOWN.

It also lists the fields whose comment says what 0, unset, empty or UNSPECIFIED means ("0 means
100", "0 = no limit", "unset = 1 s", "UNSPECIFIED = unchanged"): a field documented that way must
not be refused at that value. tests/test_fuzz_extremes.py sends 0 for each numeric and enum one
reachable from a request, and tests/test_error_contracts.py runs the check.

The protos are compiled with protoc's source info (grpcio-tools), so each comment is read as protoc
attaches it to its element, never by guessing at the .proto text.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2

from missionweave.kernel.rejections import SHUTTING_DOWN

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PUBLIC = "missionweave/v1"
DOC = ROOT / "docs" / "errors.md"
REASON_ENUM = "missionweave.v1.RejectionReason"
REASON_PREFIX = "REJECTION_REASON_"
DOC_TABLE = "Every reason and its gRPC code"
ARTIFACT_ENUM = "missionweave.v1.ArtifactErrorCode"
ARTIFACT_PREFIX = "ARTIFACT_ERROR_CODE_"
# Where Artifact store refusals are raised (searched for artifact error codes with their reasons).
RAISING = ("missionweave", "missionweave_server")

# The google.rpc codes by name (grpc.StatusCode's value is (number, text)).
CODE_NAMES: dict[int, str] = {c.value[0]: c.name for c in grpc.StatusCode}
CODES_BY_NAME = {name: number for number, name in CODE_NAMES.items()}
# Metadata the implementation's mapping may depend on: each reason is asked without metadata and
# with each of these.
PROBE_METADATA: list[dict[str, str]] = [{}, {"field": "probe"}]
# Upper-case words with an underscore that are neither reasons, codes nor enum values, yet
# legitimately appear: environment variables and the enum's prefix itself.
NOT_NAMES = re.compile(r"^(MWP_\w+|REJECTION_REASON_|[A-Z]+_[A-Z]*\d\w*)$")

Codes = Callable[[int, dict[str, str]], int]


@dataclass
class Sources:
    """The texts the check reads: the public protos (path under protos/ -> text), docs/errors.md,
    and the implementation's mapping (reason number, metadata -> google.rpc code number)."""

    protos: dict[str, str]
    doc: str
    codes: Codes
    python: dict[str, str] = field(default_factory=dict)  # path -> source of the code raising refusals

    def replaced(self, path: str, old: str, new: str) -> Sources:
        """A copy with ``old`` replaced by ``new`` once in the proto at ``path`` (or in the document
        for path "doc"), for tests that plant a disagreement; ``old`` must be there."""
        text = self.doc if path == "doc" else self.protos.get(path, self.python.get(path, ""))
        if old not in text:
            raise ValueError(f"{old!r} is not in {path}")
        text = text.replace(old, new, 1)
        if path == "doc":
            return Sources(dict(self.protos), text, self.codes, dict(self.python))
        if path in self.python:
            return Sources(dict(self.protos), self.doc, self.codes, {**self.python, path: text})
        return Sources({**self.protos, path: text}, self.doc, self.codes, dict(self.python))


def implementation_codes() -> Codes:
    from missionweave.kernel.errors import Rejected
    from missionweave_server.edge.status import status_code

    def codes(reason: int, metadata: dict[str, str]) -> int:
        return status_code(Rejected(reason, "probe", **metadata))  # type: ignore[arg-type]

    return codes


def load_sources() -> Sources:
    protos = {
        str(p.relative_to(PROTO_ROOT)): p.read_text(encoding="utf-8")
        for p in sorted((PROTO_ROOT / PUBLIC).glob("*.proto"))
    }
    python = {
        str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
        for top in RAISING
        for p in sorted((ROOT / top).rglob("*.py"))
        if "/v1/" not in str(p.relative_to(ROOT)) and "artifact_error" in p.read_text(encoding="utf-8")
    }
    return Sources(protos, DOC.read_text(encoding="utf-8"), implementation_codes(), python)


# ------------------------------------------------------------ the protos, with their comments


def compile_protos(protos: dict[str, str]) -> descriptor_pb2.FileDescriptorSet:
    """The descriptors of ``protos`` with source info (comments), compiled by grpcio-tools' protoc
    from a scratch copy (so a mutated text compiles as it is)."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as scratch:
        for path, text in protos.items():
            target = Path(scratch) / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        out = os.path.join(scratch, "contract.pb")
        args = [
            "protoc",
            f"-I{scratch}",
            f"-I{include}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
        ]
        rc = protoc.main([*args, *sorted(protos)])
        if rc != 0:
            raise RuntimeError(f"protoc failed on the public protos (exit {rc})")
        return descriptor_pb2.FileDescriptorSet.FromString(Path(out).read_bytes())


@dataclass(frozen=True)
class Element:
    """One commented element of a proto: ``kind`` message, field, enum, value, service or rpc."""

    kind: str
    name: str  # full name, e.g. missionweave.v1.ListWorkItemsRequest.page_size
    comment: str
    file: str
    type_name: str = ""  # for a field: its scalar type or message/enum full name
    scalar: int = 0  # for a field: its FieldDescriptorProto.Type


def _comments(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    out = {}
    for loc in file.source_code_info.location:
        text = " ".join(part for part in (loc.leading_comments, loc.trailing_comments) if part)
        if text:
            out[tuple(loc.path)] = text
    return out


def elements(fds: descriptor_pb2.FileDescriptorSet) -> list[Element]:
    """Every message, field, enum, enum value, service and RPC of the public protos with its comment
    (descriptor.proto's field numbers: file message_type 4, enum_type 5, service 6; message field 2,
    nested_type 3, enum_type 4; enum value 2; service method 2)."""
    out: list[Element] = []
    for file in fds.file:
        if file.name.startswith(PUBLIC + "/"):
            out.extend(_file_elements(file))
    return out


def _file_elements(file: descriptor_pb2.FileDescriptorProto) -> list[Element]:
    out: list[Element] = []
    notes = _comments(file)
    package = file.package

    def enum(e: descriptor_pb2.EnumDescriptorProto, scope: str, path: tuple[int, ...]) -> None:
        name = f"{scope}.{e.name}"
        out.append(Element("enum", name, notes.get(path, ""), file.name))
        for i, v in enumerate(e.value):
            out.append(Element("value", f"{name}.{v.name}", notes.get((*path, 2, i), ""), file.name))

    def message(m: descriptor_pb2.DescriptorProto, scope: str, path: tuple[int, ...]) -> None:
        name = f"{scope}.{m.name}"
        out.append(Element("message", name, notes.get(path, ""), file.name))
        for i, fd in enumerate(m.field):
            type_name = fd.type_name.lstrip(".") or descriptor_pb2.FieldDescriptorProto.Type.Name(fd.type)
            out.append(
                Element(
                    "field", f"{name}.{fd.name}", notes.get((*path, 2, i), ""), file.name, type_name, fd.type
                )
            )
        for i, nested in enumerate(m.nested_type):
            if not nested.options.map_entry:
                message(nested, name, (*path, 3, i))
        for i, e in enumerate(m.enum_type):
            enum(e, name, (*path, 4, i))

    for i, m in enumerate(file.message_type):
        message(m, package, (4, i))
    for i, e in enumerate(file.enum_type):
        enum(e, package, (5, i))
    for i, service in enumerate(file.service):
        sname = f"{package}.{service.name}"
        out.append(Element("service", sname, notes.get((6, i), ""), file.name))
        for j, rpc in enumerate(service.method):
            out.append(
                Element(
                    "rpc",
                    f"{sname}.{rpc.name}",
                    notes.get((6, i, 2, j), ""),
                    file.name,
                    rpc.input_type.lstrip("."),
                )
            )
    # The rest: a file's header, comments detached from any element (between declarations).
    for loc in file.source_code_info.location:
        detached = " ".join(loc.leading_detached_comments)
        if tuple(loc.path) in ((12,), (2,)):
            detached = " ".join(part for part in (detached, notes.get(tuple(loc.path), "")) if part)
        if detached:
            out.append(Element("comment", f"{file.name} at {list(loc.path)}", detached, file.name))
    return out


def _upper_snake(camel: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", camel).upper()


def enum_names(fds: descriptor_pb2.FileDescriptorSet) -> set[str]:
    """Every enum value of the contract, by full name and without its enum's prefix
    (GATEWAY_ERROR_CODE_HELLO_REQUIRED and HELLO_REQUIRED)."""
    names: set[str] = set()

    def enum(e: descriptor_pb2.EnumDescriptorProto) -> None:
        prefix = _upper_snake(e.name) + "_"
        for v in e.value:
            names.add(v.name)
            names.add(v.name.removeprefix(prefix))

    def message(m: descriptor_pb2.DescriptorProto) -> None:
        for e in m.enum_type:
            enum(e)
        for nested in m.nested_type:
            message(nested)

    for file in fds.file:
        for e in file.enum_type:
            enum(e)
        for m in file.message_type:
            message(m)
    return names


# ------------------------------------------------------------ reading codes and reasons in text

WORD = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_?\b")


def plain(text: str) -> str:
    """Backticks and the enum prefix gone, whitespace collapsed: `REJECTION_REASON_X` reads as X."""
    text = text.replace("`", "")
    text = re.sub(r"\b" + REASON_PREFIX + r"(?=[A-Z])", "", text)
    return re.sub(r"\s+", " ", text)


def codes_in(text: str) -> set[str]:
    return {w for w in WORD.findall(plain(text)) if w in CODES_BY_NAME and w != "OK"}


def _alternation(names: set[str]) -> str:
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))


@dataclass(frozen=True)
class Pairing:
    """A text's claim that refusals for ``reason`` carry gRPC code ``code``."""

    reason: str
    code: str
    where: str
    quote: str


def pairings(text: str, reasons: set[str], where: str) -> list[Pairing]:
    """The (reason, code) pairs ``text`` states, in the forms the contract's comments and
    docs/errors.md use (a code only with a word that says it is one, or written before a reason
    that is no code name, in parentheses or after a slash):

        R (gRPC C)          R, gRPC C          R with code C          gRPC status C and a R
        C (R ...)           C / R
    """
    flat = plain(text)
    r, c = _alternation(reasons), _alternation(set(CODES_BY_NAME) - {"OK"})
    # After a code with no word marking it, only a name that is no code can be the reason:
    # "INVALID_ARGUMENT / NOT_FOUND" lists two codes (or reasons), it pairs nothing.
    only = _alternation(reasons - set(CODES_BY_NAME))
    marker = r"(?:gRPC status|gRPC code|gRPC|status code|code|status)"
    patterns = [
        rf"\b(?P<r>{r})\s*\(\s*{marker}:?\s+(?P<c>{c})\b",
        rf"\b(?P<r>{r}),?\s+(?:with\s+)?{marker}:?\s+(?P<c>{c})\b",
        rf"\b{marker}:?\s+(?P<c>{c}),?\s+(?:and|with)\s+(?:an?\s+|the same\s+|the\s+)?(?P<r>{r})\b",
        rf"\b(?P<c>{c})\s*\(\s*(?P<r>{only})\b",
        rf"\b(?P<c>{c})\s*/\s*(?P<r>{only})\b",
    ]
    found: list[Pairing] = []
    seen: set[tuple[str, str, int]] = set()
    for pattern in patterns:
        for m in re.finditer(pattern, flat):
            if m["r"] == m["c"]:
                continue  # INVALID_ARGUMENT (INVALID_ARGUMENT ...): the same name twice says nothing
            key = (m["r"], m["c"], m.start())
            if key not in seen:
                seen.add(key)
                found.append(
                    Pairing(m["r"], m["c"], where, flat[max(0, m.start() - 30) : m.end() + 10].strip())
                )
    return found


def unknown_names(text: str, known: set[str]) -> list[str]:
    """Upper-case names with an underscore that are no reason, code or enum value (a misspelt or
    removed reason), and REJECTION_REASON_X where X is no reason."""
    out = []
    for word in WORD.findall(text.replace("`", " ")):
        if "_" not in word or NOT_NAMES.match(word):
            if (
                word.startswith(REASON_PREFIX)
                and word != REASON_PREFIX
                and word.removeprefix(REASON_PREFIX) not in known
            ):
                out.append(word)
            continue
        if word not in known and word.removeprefix(REASON_PREFIX) not in known:
            out.append(word)
    return out


# ------------------------------------------------------------ docs/errors.md


@dataclass
class Table:
    section: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)


def tables(doc: str) -> list[Table]:
    """The Markdown tables of ``doc``, each with the heading it sits under."""
    out: list[Table] = []
    section = ""
    current: Table | None = None
    for line in doc.splitlines():
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        if not line.startswith("|"):
            current = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if current is None:
            current = Table(section, cells)
            out.append(current)
        elif not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
            current.rows.append(cells)
    return out


def doc_reason_table(doc: str, reasons: set[str]) -> tuple[dict[str, set[str]], list[str]]:
    """The document's "Every reason and its gRPC code" table: reason -> codes, and findings."""
    findings: list[str] = []
    table = next((t for t in tables(doc) if t.section == DOC_TABLE), None)
    if table is None:
        return {}, [f"docs/errors.md: no table under the heading '{DOC_TABLE}'"]
    out: dict[str, set[str]] = {}
    for row in table.rows:
        names = WORD.findall(plain(row[0]))
        if len(names) != 1 or names[0] not in reasons:
            findings.append(f"docs/errors.md '{DOC_TABLE}': {row[0]!r} is not one RejectionReason")
            continue
        codes = codes_in(row[1]) if len(row) > 1 else set()
        if not codes:
            findings.append(f"docs/errors.md '{DOC_TABLE}': {names[0]} names no gRPC code")
        if names[0] in out:
            findings.append(f"docs/errors.md '{DOC_TABLE}': {names[0]} has two rows")
        out[names[0]] = codes
    return out, findings


def doc_status_rows(doc: str, reasons: set[str]) -> list[Pairing]:
    """Rows of a table with a column whose header names a status and one naming a reason: the first
    reason of the row's reason cell with the code of its status cell (OK: none, the refusal is in band)."""
    out = []
    for t in tables(doc):
        status = [i for i, h in enumerate(t.header) if "status" in h.lower()]
        reason = [i for i, h in enumerate(t.header) if "reason" in h.lower() and i not in status]
        if not status or not reason:
            continue
        for row in t.rows:
            if max(status[0], reason[0]) >= len(row):
                continue
            named = [w for w in WORD.findall(plain(row[reason[0]])) if w in reasons]
            codes = codes_in(row[status[0]])
            if named and len(codes) == 1:
                out.append(
                    Pairing(
                        named[0],
                        codes.pop(),
                        f"docs/errors.md table under '{t.section}'",
                        f"{row[reason[0]]} | {row[status[0]]}",
                    )
                )
    return out


# ------------------------------------------------------------ the Artifact store's error codes


def raised_artifact_errors(python: dict[str, str]) -> dict[str, set[str]]:
    """Artifact error code (without prefix) -> the reasons raised with it, from calls written with
    literals: ``artifact_error(R.REJECTION_REASON_X, "CODE", ...)`` and
    ``Rejected(<...>.REJECTION_REASON_X, ..., artifact_error="ARTIFACT_ERROR_CODE_CODE")``. A call whose
    reason or code is computed is not seen (missionweave_server/services/artifacts/manifest_check.py's manifest check picks the
    reason from the ManifestError: SIGNATURE_INVALID for a signature, else INVALID_ARGUMENT)."""
    out: dict[str, set[str]] = {}
    for text in python.values():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = node.args[0]
            reason = first.attr if isinstance(first, ast.Attribute) else ""
            if not reason.startswith(REASON_PREFIX):
                continue
            code = None
            if name == "artifact_error" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                code = str(node.args[1].value)
            for keyword in node.keywords:
                if keyword.arg == "artifact_error" and isinstance(keyword.value, ast.Constant):
                    code = str(keyword.value.value).removeprefix(ARTIFACT_PREFIX)
            if code is not None:
                out.setdefault(code, set()).add(reason.removeprefix(REASON_PREFIX))
    return out


# ------------------------------------------------------------ the check


@dataclass
class Report:
    findings: list[str] = field(default_factory=list)
    zero_fields: list[Element] = field(default_factory=list)
    pairings: list[Pairing] = field(default_factory=list)


# A comment that says what a field means at 0, unset, empty or UNSPECIFIED; "0 is refused" is a
# documented refusal, not a meaning.
ZERO = re.compile(
    r"(?<![\w.])0\s*(?:=|means\b|for\b|or unset\b)|\(0\b(?! is refused)|\bunset\s*(?:=|means\b)|\bempty\s*(?:=|means\b)"
    r"|\bUNSPECIFIED\s*(?:=|means\b)|\bat zero\b.*\bmeans\b",
    re.IGNORECASE,
)


def zero_fields(items: list[Element]) -> list[Element]:
    return [e for e in items if e.kind == "field" and ZERO.search(e.comment.replace("`", ""))]


def check(sources: Sources) -> Report:
    fds = compile_protos(sources.protos)
    items = elements(fds)
    report = Report(zero_fields=zero_fields(items))
    reason_values = {
        e.name.rsplit(".", 1)[1]: e
        for e in items
        if e.kind == "value" and e.name.startswith(REASON_ENUM + ".")
    }
    reasons = {name.removeprefix(REASON_PREFIX) for name in reason_values} - {"UNSPECIFIED"}
    numbers: dict[str, int] = {}
    for file in fds.file:
        for enum in file.enum_type:
            if f"{file.package}.{enum.name}" == REASON_ENUM:
                numbers = {v.name.removeprefix(REASON_PREFIX): v.number for v in enum.value}
    # SHUTTING_DOWN is a reason of the ErrorInfo alone (a stopping server's streams, no Rejection).
    known = reasons | set(CODES_BY_NAME) | enum_names(fds) | {SHUTTING_DOWN}
    find = report.findings.append

    # (d) the implementation, per reason
    implemented: dict[str, set[str]] = {}
    for reason in sorted(reasons):
        got = {CODE_NAMES.get(sources.codes(numbers[reason], dict(meta)), "?") for meta in PROBE_METADATA}
        implemented[reason] = got
        if "UNKNOWN" in got:
            find(
                f"implementation: {reason} has no gRPC code (missionweave_server/edge/status.py CODES): it is answered UNKNOWN"
            )

    # (a) the enum's comments against (d)
    for reason in sorted(reasons):
        said = codes_in(reason_values[REASON_PREFIX + reason].comment)
        if not said:
            find(
                f"common.proto: {reason}'s comment names no gRPC code (the implementation gives {_names(implemented[reason])})"
            )
        elif said != implemented[reason]:
            find(
                f"common.proto: {reason}'s comment says {_names(said)}, the implementation gives {_names(implemented[reason])}"
            )

    # (c) the document's table against (d), and every reason in it
    table, problems = doc_reason_table(sources.doc, reasons)
    report.findings.extend(problems)
    for reason in sorted(reasons):
        if reason not in table:
            if table:
                find(
                    f"docs/errors.md: {reason} is missing from '{DOC_TABLE}' (the implementation gives {_names(implemented[reason])})"
                )
        elif table[reason] and table[reason] != implemented[reason]:
            find(
                f"docs/errors.md '{DOC_TABLE}': {reason} says {_names(table[reason])}, the implementation gives {_names(implemented[reason])}"
            )

    # (b) and (c): every pairing of a reason with a code in a comment or the document's prose
    for e in items:
        if e.comment:
            report.pairings.extend(pairings(e.comment, reasons, f"{e.file} {e.kind} {e.name}"))
    report.pairings.extend(pairings(sources.doc, reasons, "docs/errors.md"))
    report.pairings.extend(doc_status_rows(sources.doc, reasons))
    for p in report.pairings:
        if p.code not in implemented[p.reason]:
            find(
                f'{p.where}: pairs {p.reason} with {p.code}, the implementation gives {_names(implemented[p.reason])}: "{p.quote}"'
            )

    # (e) the Artifact store's error codes: their comments against the reasons raised with them
    artifact = {
        e.name.rsplit(".", 1)[1].removeprefix(ARTIFACT_PREFIX): e
        for e in items
        if e.kind == "value" and e.name.startswith(ARTIFACT_ENUM + ".")
    }
    raised = raised_artifact_errors(sources.python)
    for code, reasons_raised in sorted(raised.items()):
        if code not in artifact:
            find(f"implementation: raises artifact error {code}, which is no ArtifactErrorCode")
            continue
        for r in sorted(reasons_raised - reasons):
            find(f"implementation: artifact error {code} is raised with {r}, which is no RejectionReason")
        gives = set().union(*(implemented[r] for r in reasons_raised & reasons))
        comment = artifact[code].comment
        said = codes_in(comment)
        where = f"artifact_service.proto: ArtifactErrorCode {code}"
        if not said:
            find(
                f"{where}: its comment names no gRPC code (raised with {_names(reasons_raised)}: {_names(gives)})"
            )
        elif said != gives:
            find(
                f"{where}: its comment says {_names(said)}, it is raised with {_names(reasons_raised)}, "
                f"which the implementation gives {_names(gives)}"
            )
        for named in re.findall(r"\breason (\w+)", plain(comment)):
            if named not in reasons_raised:
                find(f"{where}: its comment names reason {named}, it is raised with {_names(reasons_raised)}")

    # where a comment pairs a reason or a code with an artifact error ("RESOURCE_EXHAUSTED, artifact
    # error TOO_LARGE", "QUOTA_EXCEEDED (artifact error STORAGE_FULL)")
    either = _alternation(reasons | set(CODES_BY_NAME))
    for e in items:
        for m in re.finditer(rf"\b(?P<x>{either})\s*[(,]\s*artifact error (?P<a>\w+)", plain(e.comment)):
            x, a = m["x"], m["a"].removeprefix(ARTIFACT_PREFIX)
            if a not in raised:
                continue
            gives = set().union(*(implemented.get(r, set()) for r in raised[a]))
            if x not in raised[a] and x not in gives:
                find(
                    f"{e.file} {e.kind} {e.name}: pairs artifact error {a} with {x}, it is raised with "
                    f'{_names(raised[a])} ({_names(gives)}): "{plain(e.comment)[max(0, m.start() - 30) : m.end() + 10]}"'
                )

    # names that are no reason, code or enum value
    for e in items:
        for word in unknown_names(e.comment, known):
            find(
                f"{e.file} {e.kind} {e.name}: names {word}, which is no RejectionReason, gRPC code or enum value"
            )
    for number, line in enumerate(sources.doc.splitlines(), 1):
        for word in unknown_names(line, known):
            find(
                f"docs/errors.md:{number}: names {word}, which is no RejectionReason, gRPC code or enum value"
            )
    return report


def _names(codes: set[str]) -> str:
    return " or ".join(sorted(codes)) or "none"


def reason_table(sources: Sources) -> str:
    """docs/errors.md's table as the implementation has it (``--table``): paste it when a reason is added."""
    fds = compile_protos(sources.protos)
    rows = ["| reason | gRPC code |", "|---|---|"]
    for file in fds.file:
        for e in file.enum_type:
            if f"{file.package}.{e.name}" != REASON_ENUM:
                continue
            for v in e.value[1:]:
                codes = [CODE_NAMES[sources.codes(v.number, dict(meta))] for meta in PROBE_METADATA]
                text = (
                    f"`{codes[0]}`"
                    if len(set(codes)) == 1
                    else f"`{codes[0]}`; `{codes[1]}` with metadata `field`"
                )
                rows.append(f"| `{v.name.removeprefix(REASON_PREFIX)}` | {text} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sources = load_sources()
    if args == ["--table"]:
        print(reason_table(sources))
        return 0
    report = check(sources)
    print(
        f"{len(report.pairings)} pairings of a reason with a code read; fields documented at 0, unset or empty:"
    )
    for e in report.zero_fields:
        print(f"  {e.name} ({e.type_name}): {_zero_phrase(e.comment)}")
    for line in report.findings:
        print(f"DISAGREES {line}")
    print(f"{len(report.findings)} disagreements")
    return 1 if report.findings else 0


def _zero_phrase(comment: str) -> str:
    flat = plain(comment)
    m = ZERO.search(flat)
    return flat[max(0, m.start() - 40) : m.end() + 50].strip() if m else flat[:90]


def documented_at_zero() -> list[Element]:
    """The fields of the public protos (as on disk) whose comment says what 0, unset or empty means:
    tests/test_fuzz_extremes.py sends each that a client sends so (numbers and enums 0, Durations
    and Timestamps unset or zero, strings, lists and messages empty)."""
    return zero_fields(elements(compile_protos(load_sources().protos)))


def iter_zero_numeric(report: Report) -> Iterator[Element]:
    """The zero-documented fields the fuzz can set to 0: numeric, enum, Duration and Timestamp."""
    skip = {"TYPE_STRING", "TYPE_BYTES", "TYPE_BOOL"}
    for e in report.zero_fields:
        if e.scalar == descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE and e.type_name not in (
            "google.protobuf.Duration",
            "google.protobuf.Timestamp",
        ):
            continue
        if descriptor_pb2.FieldDescriptorProto.Type.Name(e.scalar) in skip:  # type: ignore[arg-type]
            continue
        yield e


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
