"""Extras built from misbehaving subclasses of str, int, float, dict and list.

Invariant (DESIGN rule 4, door): the door reads JSON data through the base
types' own methods, so a subclass overriding ``__int__``, ``__float__``,
``isascii``, ``encode``, ``items``, ``__iter__``, ``__len__`` or ``__eq__``
never raises an untyped error out of turnloom: the value is taken as its base
value (the prepared input equals a twin's given plain values, on all four
gateways), or a reserved key is refused with a typed error that changes no
state.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from turnloom.context import Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.errors import InvalidMessageError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

GATEWAYS = ("openai_chat", "openai_responses", "anthropic", "gemini")


class _BadInt(int):
    def __int__(self) -> int:
        raise ValueError("boom")


class _BadFloat(float):
    def __float__(self) -> float:
        raise ValueError("boom")


class _LenLie(list):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 1


class _IterRaise(list):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise RuntimeError("boom")


class _ItemsRaise(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        raise RuntimeError("boom")


class _DictIterRaise(dict):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise RuntimeError("boom")


class _AsciiRaise(str):
    def isascii(self) -> bool:
        raise RuntimeError("boom")


class _EncodeRaise(str):
    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        raise RuntimeError("boom")


class _EqRaise(str):
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("boom")

    __hash__ = str.__hash__


# (hostile extras, the plain extras a twin records)
_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "int": ({"a": [_BadInt(3)]}, {"a": [3]}),
    "float": ({"a": [_BadFloat(2.5)]}, {"a": [2.5]}),
    "len": ({"a": _LenLie([1, 2, 3])}, {"a": [1, 2, 3]}),
    "list-iter": ({"a": _IterRaise([1])}, {"a": [1]}),
    "items": ({"a": _ItemsRaise({"x": 1})}, {"a": {"x": 1}}),
    "top-items": (_ItemsRaise({"x": 1}), {"x": 1}),
    "top-iter": (_DictIterRaise({"x": 1}), {"x": 1}),
    "key-isascii": ({"a": {_AsciiRaise("é"): 1}}, {"a": {"é": 1}}),
    "value-encode": ({"a": [_EncodeRaise("é")]}, {"a": ["é"]}),
    "key-eq": ({_EqRaise("k"): [1]}, {"k": [1]}),
}


def _snapshot(extras: dict[str, Any]) -> TurnSnapshot:
    message = Message(role=Role.user, content=(TextPart(text="hi", extras=extras),), extras=extras)
    return TurnSnapshot(context_id="c", turn_id="t1", input=(message,))


@pytest.mark.parametrize("gateway", GATEWAYS)
@pytest.mark.parametrize("case", sorted(_CASES))
async def test_subclass_json_is_taken_as_its_base_value(
    anyio_backend: str, gateway: str, case: str
) -> None:
    hostile, plain = _CASES[case]
    async with Foundation(gateway=gateway) as foundation, Foundation(gateway=gateway) as twin:
        foundation.manager.accept_turn(_snapshot(hostile))
        twin.manager.accept_turn(_snapshot(plain))
        request = ContextPrepareRequest(context_id="c", turn_id="t1")
        got = await foundation.manager.prepare(request)
        want = await twin.manager.prepare(request)
        assert msgspec.json.encode(got.items) == msgspec.json.encode(want.items)


@pytest.mark.parametrize("gateway", GATEWAYS)
async def test_a_reserved_key_as_a_misbehaving_str_subclass_is_refused_typed(
    anyio_backend: str, gateway: str
) -> None:
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        before = msgspec.structs.asdict(manager.statistics())
        with pytest.raises(InvalidMessageError, match="holds 'role'"):
            manager.accept_turn(_snapshot({_EqRaise("role"): "system"}))
        assert (manager.context_ids(), msgspec.structs.asdict(manager.statistics())) == ((), before)


class _Hostile(str):
    """A str whose every method a door might call raises."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("boom")

    def __hash__(self) -> int:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        raise RuntimeError("boom")

    def isascii(self) -> bool:
        raise RuntimeError("boom")

    def isspace(self) -> bool:
        raise RuntimeError("boom")


class _HostileTuple(tuple):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        raise RuntimeError("boom")


def _turn(s: Any, t: Any) -> tuple[tuple[Message, ...], list[Message]]:
    """A turn's input and outputs with ``s`` wrapping every id and ``t`` every parts tuple."""
    inp = (Message(role=Role.user, content=t((TextPart(text="hi"),)), id=s("m1"), name=s("ann")),)
    outputs = [
        Message(
            role=Role.assistant,
            content=t((ToolCallPart(call_id=s("a"), name=s("f"), arguments='{"x": 1}'),)),
        ),
        Message(
            role=Role.tool,
            content=t((ToolResultPart(call_id=s("a"), content=t((TextPart(text="ok"),))),)),
        ),
    ]
    return inp, outputs


@pytest.mark.parametrize("gateway", GATEWAYS)
async def test_subclassed_ids_and_part_tuples_are_taken_as_their_base_values(
    anyio_backend: str, gateway: str
) -> None:
    """Ids, names, arguments and part tuples of misbehaving subclasses: no untyped error."""
    async with Foundation(gateway=gateway) as foundation, Foundation(gateway=gateway) as twin:
        bodies = []
        for manager, (inp, outputs) in (
            (foundation.manager, _turn(_Hostile, _HostileTuple)),
            (twin.manager, _turn(str, tuple)),
        ):
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=inp))
            manager.record("c", "t1", outputs)
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(_user("y"),)))
            prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
            bodies.append((msgspec.json.encode(prefix.items), manager.request_bytes(prefix)))
        assert bodies[0] == bodies[1]


def _user(text: str) -> Message:
    return Message(role=Role.user, content=text)


async def test_tool_arguments_of_a_misbehaving_str_subclass_are_refused_typed(
    anyio_backend: str,
) -> None:
    """Arguments of a str subclass: refused by the encoder, typed, with no state changed."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_user("x"),)))
        before = msgspec.structs.asdict(manager.statistics())
        bad = Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="a", name="f", arguments=_Hostile('{"x": 1}')),),
        )
        with pytest.raises(InvalidMessageError, match="Encoding objects of type _Hostile"):
            manager.record("c", "t1", [bad])
        assert msgspec.structs.asdict(manager.statistics()) == before
        assert manager.history("c").turn_messages("t1") == (_user("x"),)
