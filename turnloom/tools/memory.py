"""``turnloom memory``: load and query the embedded SQLite memory from the command line.

* ``turnloom memory add --tenant T [--db PATH] FILE ...`` stores every non-blank
  line of each file as one entry of the tenant's scope (source: the file name);
  the database is created when missing. ``-`` reads standard input.
* ``turnloom memory search --tenant T [--db PATH] [--top-k K] [--text] QUERY``
  prints the best entries, one per line: score, id, source, text. The query
  is FTS5 syntax (``"refund AND flight"``, ``"bag*"``); ``--text`` matches
  any word of free text instead.

Exit status: 0 on success, 2 for a usage error (a missing database or file,
a malformed FTS5 query, a bad scope).
"""

from __future__ import annotations

__all__ = ("add_memory_parser", "add_texts", "read_entries", "run_memory")

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from turnloom.context.memory import MemoryEntry, TenantScope
from turnloom.errors import TurnloomError, excerpt
from turnloom.stores import SQLiteMemory

DEFAULT_DB = "turnloom-memory.db"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{excerpt(text)} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def add_memory_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the ``memory`` command and its ``add`` and ``search`` subcommands."""
    memory = commands.add_parser(
        "memory",
        help="load and query the embedded SQLite memory",
        description="Store text entries for a tenant and search them (SQLite FTS5, BM25).",
    )
    actions = memory.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_text in (
        ("add", "store each non-blank line of FILE as one entry"),
        ("search", "print the entries that best match QUERY"),
    ):
        action = actions.add_parser(name, help=help_text, description=help_text)
        action.add_argument("--db", default=DEFAULT_DB, metavar="PATH", help=f"({DEFAULT_DB})")
        action.add_argument("--tenant", required=True, metavar="T", help="tenant id")
        action.add_argument("--sub-tenant", metavar="S", help="sub-tenant id")
        action.add_argument("--namespace", metavar="N", help="namespace")
        if name == "add":
            action.add_argument("files", nargs="+", metavar="FILE", help="text files, or -")
        else:
            action.add_argument("query", metavar="QUERY", help="FTS5 query (or text with --text)")
            action.add_argument("--top-k", type=_positive, default=5, help="entries (5)")
            action.add_argument("--text", action="store_true", help="QUERY is free text")


def read_entries(lines: Iterable[str]) -> list[str]:
    """The entries of a text: its non-blank lines, stripped of surrounding whitespace."""
    return [line.strip() for line in lines if line.strip()]


def add_texts(memory: SQLiteMemory, scope: TenantScope, texts: list[str], source: str) -> int:
    """Store ``texts`` in ``scope``; return how many distinct entries they are."""
    return len(set(memory.add_many(texts, scope=scope, source=source)))


def _print_entries(entries: list[MemoryEntry], out: TextIO) -> None:
    for entry in entries:
        print(f"{entry.score:.4f}\t{entry.id}\t{entry.source}\t{entry.text}", file=out)


def run_memory(args: argparse.Namespace) -> int:
    """Run ``turnloom memory add|search``; return the exit status."""
    command = f"turnloom memory {args.action}"
    scope = TenantScope(
        tenant_id=args.tenant, sub_tenant_id=args.sub_tenant, namespace=args.namespace
    )
    try:
        if args.action == "add":
            batches: list[tuple[str, list[str]]] = []
            for name in args.files:
                if name == "-":
                    batches.append(("stdin", read_entries(sys.stdin)))
                    continue
                try:
                    with open(name, encoding="utf-8") as file:
                        batches.append((Path(name).name, read_entries(file)))
                except (OSError, UnicodeDecodeError) as exc:
                    reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                    print(f"{command}: error: cannot read {name}: {reason}.", file=sys.stderr)
                    return 2
            with SQLiteMemory(args.db) as memory:
                stored = sum(add_texts(memory, scope, texts, source) for source, texts in batches)
                total = memory.count(scope)
            print(f"stored {stored} entries; tenant {args.tenant!r} holds {total}.")
            return 0
        with SQLiteMemory(args.db, create=False) as memory:
            if args.text:
                entries = memory.search_text(args.query, scope=scope, top_k=args.top_k)
            else:
                entries = memory.search_fts(args.query, scope=scope, top_k=args.top_k)
    except TurnloomError as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 2
    _print_entries(entries, sys.stdout)
    return 0
