"""A griffe extension for the API reference: Sphinx roles in docstrings become links.

turnloom's docstrings name other objects with Sphinx roles
(``:class:`~turnloom.runtime.Foundation```). mkdocstrings renders Markdown, so
this turns a role naming a full ``turnloom.`` path into an autorefs
cross-reference (``[`Foundation`][turnloom.runtime.Foundation]``), which
``mkdocs build --strict`` fails on when nothing documents the target, and any
other role (a short name, resolved by the reader) into inline code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|attr|exc|mod|data|obj):`(~?)([^`]+)`")


def _replace(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    target = target.strip().removesuffix("()")
    shown = target.rpartition(".")[2] if tilde else target
    if target.startswith("turnloom."):
        return f"[`{shown}`][{target}]"
    return f"`{shown.lstrip('.')}`"


def convert_roles(text: str) -> str:
    """``text`` with each Sphinx role replaced by a cross-reference or inline code."""
    return _ROLE.sub(_replace, text)


class SphinxRoles(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`convert_roles`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert_roles(obj.docstring.value)
