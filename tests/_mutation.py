"""Reaching every container a caller's object holds, and changing each (isolation tests)."""

from __future__ import annotations

from typing import Any

import msgspec


def containers(value: Any) -> dict[int, Any]:
    """Every dict and list reachable from ``value`` (a message, part or JSON data), by id."""
    out: dict[int, Any] = {}
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, msgspec.Struct):
            stack.extend(getattr(node, field) for field in node.__struct_fields__)
        elif isinstance(node, tuple):
            stack.extend(node)
        elif isinstance(node, dict | list) and id(node) not in out:
            out[id(node)] = node
            stack.extend(node.values() if isinstance(node, dict) else node)
    return out


def mutate(value: Any) -> None:
    """Change every dict and list reachable from ``value``: each dict is emptied and
    given ``{"MUT": ["MUT"]}``, each list gets ``"MUT"`` appended."""
    for container in list(containers(value).values()):
        if isinstance(container, dict):
            container.clear()
            container["MUT"] = ["MUT"]
        else:
            container.append("MUT")
