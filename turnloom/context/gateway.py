"""The gateway protocol: one provider's adapter between Message and NativeContent.

A gateway renders neutral :class:`~turnloom.context.Message` values into the
provider's own request items (``NativeContent``), parses native items (model
output, or a recorded request) back into messages, and knows the provider's
documented structural rules (:meth:`Gateway.validate`).

Gateways are stateless and safe to share between threads. :func:`get_gateway`
returns the shared instance for a :class:`GatewayType`.
"""

from __future__ import annotations

__all__ = (
    "Gateway",
    "GatewayType",
    "NativeContent",
    "Violation",
    "get_gateway",
    "register_gateway",
    "step_join",
)

import enum
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

from turnloom.context.message import Message, NativeKeys, declare_native_keys
from turnloom.context.pairing import StepJoin
from turnloom.errors import InputError, Violation, excerpt

NativeContent: TypeAlias = dict[str, Any]
"""One item of a provider's request, in the provider's own shape (a JSON object)."""


class GatewayType(enum.StrEnum):
    """The providers turnloom renders for."""

    openai_chat = "openai_chat"
    openai_responses = "openai_responses"
    anthropic = "anthropic"
    gemini = "gemini"


@runtime_checkable
class Gateway(Protocol):
    """What every provider adapter provides.

    Items are rendered one message at a time so that a history can cache each
    message's native items and a prepare costs O(new messages). Rules that
    span messages (merging adjacent same-role turns, moving instructions to a
    top-level field) are applied by :meth:`request_body` on the whole input.

    Where system and developer messages live in a Context: OpenAI Chat and
    OpenAI Responses keep them as input messages in place (Responses keeps a
    message parsed from ``instructions`` as an ``{"type": "instructions"}``
    item that ``request_body`` lifts); Anthropic keeps ``{"role": "system"}``
    items and lifts the leading run into ``system``; Gemini keeps
    ``{"role": "system"}`` items and lifts all of them into
    ``systemInstruction``.

    A gateway class may subclass ``Gateway`` to inherit the default
    :meth:`parse_items`. It may also set a class attribute ``step_join`` (a
    :data:`~turnloom.context.StepJoin`, read by :func:`step_join`) when its
    provider needs a model step that the host split over several messages
    joined before rendering; without it each message renders as it is.
    """

    __slots__ = ()

    @property
    def type(self) -> GatewayType:
        """Which provider this gateway speaks for."""
        ...

    @property
    def items_field(self) -> str:
        """The field of :meth:`request_body` that holds the item list.

        ``"messages"`` (OpenAI Chat, Anthropic), ``"input"`` (OpenAI
        Responses), ``"contents"`` (Gemini).
        """
        ...

    def tool_definition(
        self, name: str, description: str, parameters: dict[str, Any]
    ) -> dict[str, Any]:
        """One function tool's declaration, as one entry of the provider's ``tools`` list.

        Args:
            name: the tool's name.
            description: what it does.
            parameters: its arguments as a JSON Schema object.

        Returns:
            a new dict each call (the caller may change it).
        """
        ...

    def render(self, message: Message) -> list[NativeContent]:
        """Render one message into zero or more native items, in order.

        Raises:
            ProviderRuleError: the message holds content this provider cannot
                carry and the gateway documents rejecting it.
        """
        ...

    def parse(self, item: NativeContent) -> Message:
        """Parse one native item (model output or a request item) into a Message.

        Raises:
            InvalidMessageError: the item is not of this provider's shape.
        """
        ...

    def parse_request(self, body: dict[str, Any]) -> list[Message]:
        """Parse a whole request body (as sent to the provider) into messages.

        Instructions held outside the item list (Anthropic ``system``, Gemini
        ``systemInstruction``, Responses ``instructions``) come first, as
        ``system`` messages whose ``layout`` records where they were, so that
        ``request_body`` of the rendered messages reproduces the body's input
        fields exactly.

        Raises:
            InvalidMessageError: the body has no item list or an item is
                malformed.
        """
        ...

    def parse_items(self, items: Sequence[NativeContent]) -> list[Message]:
        """Parse a list of native items into messages, in order.

        By default one :meth:`parse` per item; a gateway whose one message
        spans several items (OpenAI Responses: an assistant message, its
        reasoning and its calls) groups them.

        Raises:
            InvalidMessageError: an item is not of this provider's shape.
        """
        return [self.parse(item) for item in items]

    def validate(
        self, items: Sequence[NativeContent], *, continues_response: bool = False
    ) -> list[Violation]:
        """Check a whole input against the provider's structural rules.

        Args:
            items: the item list of a request body (its :attr:`items_field`).
            continues_response: the request continues a stored response
                (OpenAI Responses ``previous_response_id``), so it may start
                with results of calls made there. Gateways without stored
                responses ignore it.

        Returns:
            every violation found, in item order; empty when the input is valid.
        """
        ...

    def request_body(self, items: Sequence[NativeContent]) -> dict[str, Any]:
        """The input part of a request body for ``items`` (the model call's input).

        For example ``{"messages": [...]}`` for OpenAI Chat. Instructions are
        placed where the API expects them and adjacent turns merged where the
        provider's rules call for it (each gateway documents what it does).
        The caller adds the model name, tools and generation settings. A
        gateway's ``validate`` accepts the item list of this body whenever the
        items were rendered from messages completed by
        :func:`~turnloom.context.complete_pairs` with the gateway's
        ``join`` (:func:`step_join`) and the list is not empty
        (an empty one is the ``empty_input`` violation: no provider accepts it).

        Returns:
            a new body each call (the built-in gateways): every dict and list
            in it is made for this call, none is one of ``items``' or of
            anything turnloom keeps, so the caller may change it freely (a
            rolling ``cache_control`` mark on the last block, say) and the
            change reaches no later body, no ``items`` it passed and no
            later input turnloom prepares. Strings and numbers are shared
            (they are immutable). Costs about one allocation per container
            on top of the fold (``scripts/bench_request_body.py``);
            :meth:`~turnloom.runtime.ContextManager.request_bytes` gives the
            encoded body without building or copying one.
        """
        ...


def step_join(gateway: Gateway) -> StepJoin:
    """How ``gateway`` needs a step of several messages joined: its ``step_join``, or ``"none"``.

    OpenAI Chat: ``"calls"``; OpenAI Responses: ``"reasoning"``; Anthropic and
    Gemini: ``"none"`` (their request bodies merge adjacent turns).
    """
    join = getattr(gateway, "step_join", "none")
    if join == "calls":
        return "calls"
    return "reasoning" if join == "reasoning" else "none"


_FACTORIES: dict[GatewayType, Callable[[], Gateway]] = {}
_INSTANCES: dict[GatewayType, Gateway] = {}


def register_gateway(
    kind: GatewayType, factory: Callable[[], Gateway], native_keys: NativeKeys | None = None
) -> None:
    """Register the factory of the gateway for ``kind`` (used by gateway modules).

    Args:
        kind: the provider.
        factory: makes the gateway.
        native_keys: the keys the gateway writes itself and its layout hints,
            declared once, here; the door
            (:func:`~turnloom.context.check_message`) refuses extras holding
            those keys and layouts naming ``kind`` that break the hints. A
            gateway that declares nothing gets no layout accepted.
    """
    if native_keys is not None:
        declare_native_keys(GatewayType(kind).value, native_keys)
    _FACTORIES[kind] = factory
    _INSTANCES.pop(kind, None)


def get_gateway(kind: GatewayType | str) -> Gateway:
    """The shared gateway instance for ``kind``.

    Raises:
        InputError: ``kind`` names no known or registered gateway.
    """
    try:
        key = GatewayType(kind)
    except ValueError:
        known = ", ".join(t.value for t in GatewayType)
        raise InputError(f"Unknown gateway {excerpt(kind)}; known gateways: {known}.") from None
    gateway = _INSTANCES.get(key)
    if gateway is None:
        factory = _FACTORIES.get(key)
        if factory is None:
            raise InputError(f"Gateway {excerpt(key.value)} is not available in this build.")
        gateway = _INSTANCES[key] = factory()
    return gateway
