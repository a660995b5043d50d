"""``mwp context add|ls|show|select|rm``: saved sets of connection options (context_store.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from missionweave.cli.common import UsageError, add_json_flag, columns, emit
from missionweave.cli.context_store import (
    BY_NAME,
    OPTIONS,
    Option,
    SavedContext,
    check_name,
    chosen,
    effective,
    missing_file,
    store,
)


def _given(args: argparse.Namespace, option: Option) -> Any:
    """The value ``context add`` was given for ``option``: its own flag, else the same global flag
    before ``context`` (``mwp --target X context add prod`` saves X too)."""
    value = getattr(args, f"set_{option.name}", None)
    return getattr(args, option.dest, None) if value is None else value


def cmd_add(args: argparse.Namespace) -> int:
    contexts = store()
    values: dict[str, Any] = {}
    for option in OPTIONS:
        value = _given(args, option)
        if value is None:
            continue
        if option.kind == "path":  # referenced where it is, never copied: stored absolute
            value = str(Path(value).expanduser().resolve())
        values[option.name] = float(value) if option.kind == "seconds" else value
    if ("tls_client_cert" in values) != ("tls_client_key" in values):
        raise UsageError(
            "a client certificate needs its key and a key its certificate: give both --tls-client-cert and --tls-client-key"
        )
    if values.get("timeout", 0) < 0:
        raise UsageError("--timeout must be >= 0 seconds (0: wait as long as it takes)")
    context = SavedContext(check_name(args.name), args.description or "", values)
    path = contexts.save(context, force=args.force)
    if args.select:
        contexts.select(context.name)
    for name, value in values.items():
        if missing_file(BY_NAME[name], value):  # may well be made later (mwp keygen): a note, not a refusal
            print(
                f"mwp: note: context {context.name!r} names {BY_NAME[name].what} {value}, which does not exist yet",
                file=sys.stderr,
            )
    lines = [f"saved context {context.name} ({path})"] + (
        [f"selected context {context.name}"] if args.select else []
    )
    emit(args, lines, _document(context, path, contexts.selected() == context.name))
    return 0


def _document(context: SavedContext, path: Path, selected: bool) -> dict[str, Any]:
    return {"name": context.name, "file": str(path), "selected": selected, **context.document()}


def cmd_ls(args: argparse.Namespace) -> int:
    contexts = store()
    selected = contexts.selected()
    saved = [contexts.load(name) for name in contexts.names()]
    rows = [["", "NAME", "TARGET", "IDENTITY", "DESCRIPTION"]] + [
        [
            "*" if c.name == selected else "",
            c.name,
            c.values.get("target", "-"),
            c.values.get("identity", "-"),
            c.description,
        ]
        for c in saved
    ]
    lines = (
        columns(rows)
        if saved
        else [f"no contexts in {contexts.directory} (mwp context add NAME --target ADDR ...)"]
    )
    document = {
        "directory": str(contexts.directory),
        "selected": selected,
        "contexts": [_document(c, contexts.file(c.name), c.name == selected) for c in saved],
    }
    emit(args, lines, document)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    contexts = store()
    context = chosen(args, contexts, args.name)
    if context is None:
        raise UsageError(
            "no context is selected: name one (mwp context show NAME) or select one (mwp context select NAME)"
        )
    path = contexts.file(context.name)
    selected = contexts.selected() == context.name
    values = effective(args, context)
    rows = [["OPTION", "FLAG", "VALUE", "FROM"]]
    for option in OPTIONS:
        resolved = values[option.name]
        source = {"context": f"context {context.name}", "env": f"${option.env}"}.get(
            resolved.source, resolved.source
        )
        missing = " (missing)" if missing_file(option, resolved.value) else ""
        rows.append([option.name, option.flag, f"{resolved.value or '-'}{missing}", source])
    lines = [
        f"context {context.name}{' (selected)' if selected else ''}"
        + (f": {context.description}" if context.description else ""),
        f"  file {path}",
        "  effective values (a flag beats $MWP_*, which beats the context, which beats the default):",
        *columns(rows, "  "),
    ]
    document = {
        **_document(context, path, selected),
        "effective": {
            name: {"value": v.value, "source": v.source, "env": BY_NAME[name].env}
            for name, v in values.items()
        },
    }
    emit(args, lines, document)
    return 0


def cmd_select(args: argparse.Namespace) -> int:
    store().select(check_name(args.name))
    emit(args, [f"selected context {args.name}"], {"selected": args.name})
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    was_selected = store().remove(check_name(args.name))
    tail = "; no context is selected now" if was_selected else ""
    emit(args, [f"removed context {args.name}{tail}"], {"removed": args.name, "was_selected": was_selected})
    return 0


TEXT_METAVARS = {"target": "ADDR", "tls_server_name": "NAME", "identity": "ID"}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ctx = sub.add_parser(
        "context",
        help="saved connection options: target, TLS, identity (like nats context)",
        description="Contexts are stored in $MWP_CONTEXT_DIR, else $XDG_CONFIG_HOME/missionweave/context, "
        "else ~/.config/missionweave/context.",
    ).add_subparsers(dest="sub", required=True)

    a = ctx.add_parser("add", help="save a context (every option optional)")
    a.add_argument("name")
    for option in OPTIONS:
        kind: dict[str, Any] = (
            {"action": "store_true", "default": None}
            if option.kind == "switch"
            else {"type": float, "metavar": "SECONDS"}
            if option.kind == "seconds"
            else {"metavar": "FILE"}
            if option.kind == "path"
            else {"metavar": TEXT_METAVARS[option.name]}
        )
        a.add_argument(option.flag, dest=f"set_{option.name}", help=f"{option.what} (${option.env})", **kind)
    a.add_argument("--description", help="a line saying what it is for")
    a.add_argument("--select", action="store_true", help="also select it")
    a.add_argument("--force", action="store_true", help="replace a context of that name")
    a.set_defaults(func=cmd_add)

    ls = ctx.add_parser("ls", help="list the saved contexts; * marks the selected one")
    ls.set_defaults(func=cmd_ls)

    s = ctx.add_parser("show", help="a context and the values in effect with it")
    s.add_argument("name", nargs="?", help="default: --context, $MWP_CONTEXT, else the selected one")
    s.set_defaults(func=cmd_show)

    sel = ctx.add_parser("select", help="use this context when no --context or $MWP_CONTEXT names one")
    sel.add_argument("name")
    sel.set_defaults(func=cmd_select)

    rm = ctx.add_parser("rm", help="delete a context (its key files are left alone)")
    rm.add_argument("name")
    rm.set_defaults(func=cmd_rm)

    for p in (a, ls, s, sel, rm):
        add_json_flag(p)
        # These manage contexts rather than use one: a broken context must stay showable and removable.
        p.set_defaults(ignores_contexts=True)
