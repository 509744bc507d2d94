"""Issue 32's goals printed beside the benches' measured values, one way for every script.

A goal is a bound on a measured value: at most (``<=``, the default) or at
least (``>=``). :func:`goal` prints the bound (``<=1.3x``); :func:`verdict`
says whether a value meets it (``met`` or ``MISSED``); :func:`beside` prints
both (``<=1.3x met``).
"""

from __future__ import annotations


def goal(bound: float, unit: str = "x", *, at_least: bool = False) -> str:
    """The bound as printed: ``<=1.3x``, ``>=100x``, ``<=20 ms`` (``unit`` follows ``%g``)."""
    return f"{'>=' if at_least else '<='}{bound:g}{unit}"


def verdict(value: float, bound: float, *, at_least: bool = False) -> str:
    """``met`` when ``value`` is within ``bound`` (at most, or at least), else ``MISSED``."""
    return "met" if (value >= bound if at_least else value <= bound) else "MISSED"


def beside(value: float, bound: float, unit: str = "x", *, at_least: bool = False) -> str:
    """The bound and the verdict for ``value``: ``<=1.3x met``."""
    return f"{goal(bound, unit, at_least=at_least)} {verdict(value, bound, at_least=at_least)}"
