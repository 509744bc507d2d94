"""``Context``: the append-only, provider-native item list of one conversation.

Areas append through
:meth:`Context.emplace_message` (a neutral message rendered by the active
gateway); model output is appended verbatim with :meth:`Context.push_back`;
only the Collector removes items, and only a tail, with
:meth:`Context.detach_tail`.

A Context is owned by one thread at a time; it does no locking.
"""

from __future__ import annotations

__all__ = ("Context",)

from collections.abc import Iterator, Sequence
from typing import overload

from turnloom.context.gateway import Gateway, GatewayType, NativeContent, get_gateway
from turnloom.context.message import Message, admit_message
from turnloom.errors import InputError, what_type


class _Snapshot(Sequence[NativeContent]):
    """A read-only, fixed-length view of a list (shallow: items are shared)."""

    __slots__ = ("_items",)

    def __init__(self, items: tuple[NativeContent, ...]) -> None:
        self._items = items

    @overload
    def __getitem__(self, index: int) -> NativeContent: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[NativeContent]: ...
    def __getitem__(self, index: int | slice) -> NativeContent | Sequence[NativeContent]:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[NativeContent]:
        return iter(self._items)

    def __repr__(self) -> str:
        return f"<Context snapshot of {len(self._items)} items>"


class Context:
    """An append-only list of NativeContent rendered for one gateway.

    Args:
        gateway: the provider whose native shape the items have; a
            :class:`GatewayType` (or its name) or a :class:`Gateway` instance.

    Raises:
        InputError: ``gateway`` names no known gateway.
    """

    __slots__ = ("_gateway", "_items")

    def __init__(self, gateway: GatewayType | str | Gateway) -> None:
        self._gateway = gateway if isinstance(gateway, Gateway) else get_gateway(gateway)
        self._items: list[NativeContent] = []

    @property
    def gateway(self) -> Gateway:
        """The active gateway."""
        return self._gateway

    def __len__(self) -> int:
        return len(self._items)

    def emplace_message(self, message: Message) -> int:
        """Validate ``message``, render it with the gateway and append the items.

        Returns:
            how many native items were appended (zero when the message renders
            to nothing, for example whitespace-only text).

        Raises:
            InvalidMessageError, InvalidTextError, DuplicateIdError: the message
                is malformed; nothing was appended.
            ProviderRuleError: the gateway rejects the content; nothing was
                appended.
        """
        rendered = self._gateway.render(admit_message(message)[0])
        self._items.extend(rendered)
        return len(rendered)

    def push_back(self, item: NativeContent) -> None:
        """Append one native item (model output) verbatim.

        Raises:
            InputError: ``item`` is not a JSON object (dict).
        """
        if not isinstance(item, dict):
            raise InputError(f"A native item must be a dict, not {what_type(item)}.")
        self._items.append(item)

    def snapshot(self, start: int = 0, stop: int | None = None) -> Sequence[NativeContent]:
        """A read-only view of items ``[start, stop)`` (the whole list by default).

        The view cannot be resized; the items themselves are shared, not copied,
        and must be treated as read-only.
        """
        return _Snapshot(tuple(self._items[start:stop]))

    def detach_tail(self, start: int) -> list[NativeContent]:
        """Remove and return items ``[start, len)``; for the Collector only.

        Raises:
            InputError: ``start`` is outside ``[0, len]``.
        """
        if not 0 <= start <= len(self._items):
            raise InputError(
                f"detach_tail({start}) is outside the context of {len(self._items)} items."
            )
        tail = self._items[start:]
        del self._items[start:]
        return tail

    def request_body(self) -> dict[str, object]:
        """The gateway's request body for the whole context (see ``Gateway.request_body``)."""
        return self._gateway.request_body(self._items)
