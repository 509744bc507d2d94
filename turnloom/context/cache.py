"""Provider prompt caches: Anthropic breakpoints and their budget, OpenAI cache keys.

Every provider caches a request by exact prefix; turnloom keeps each input a
byte-for-byte extension of the previous one while history only grows. This
module holds the provider rules that sit on top of that, as pure functions
over request bodies (callable from any thread):

* **Anthropic** marks where a cached prefix ends with ``cache_control``
  breakpoints. :func:`anthropic_breakpoints` finds them in a body (in the
  order the API reads a request: ``tools``, ``system``, ``messages``; a
  top-level ``cache_control``, Anthropic's automatic caching, takes one slot
  too), :func:`breakpoint_violations` checks the budget and TTL rules, and
  :func:`place_breakpoints` is the automatic policy (see its docstring).
* **OpenAI** (Chat and Responses) routes requests by an optional
  ``prompt_cache_key``: :func:`prompt_cache_key` derives one from a context
  id, hashed, so one conversation reaches one cache without its id leaving
  the host.
* **Gemini** caches implicitly by prefix (Gemini 2.5 and later models): no
  field is needed; a request whose start repeats an earlier one is served
  from the cache when it is long enough (the model's minimum, 1,024 or 2,048
  tokens). turnloom adds nothing to a Gemini body: what it does for the
  implicit cache is keep the prefix stable (the instructions lifted to
  ``systemInstruction`` in the same bytes every time, earlier turns unchanged,
  per-turn content after the history), which is what the cache keys on.
  Source: Gemini API, "Context caching", implicit caching.

Sources: Anthropic prompt caching guide ("Cache breakpoints", up to 4 per
request; "Mixing different TTLs", longer TTLs before shorter ones; the
lookback that checks about 20 blocks before each breakpoint for an earlier
cache entry; thinking blocks cannot carry ``cache_control``); OpenAI prompt
caching guide (``prompt_cache_key``).
"""

from __future__ import annotations

__all__ = (
    "ANTHROPIC_LOOKBACK_BLOCKS",
    "ANTHROPIC_MAX_BREAKPOINTS",
    "Breakpoint",
    "PromptCache",
    "anthropic_breakpoints",
    "breakpoint_violations",
    "content_blocks",
    "message_breakpoints",
    "place_breakpoints",
    "prompt_cache_key",
)

import hashlib
from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from turnloom.errors import InvalidArgumentError, Violation, what_type

ANTHROPIC_MAX_BREAKPOINTS = 4
"""The most ``cache_control`` breakpoints Anthropic accepts in one request."""

ANTHROPIC_LOOKBACK_BLOCKS = 20
"""How many blocks before a breakpoint Anthropic checks for an earlier cache entry."""

_MARK = "cache_control"
# Blocks the API refuses a cache_control on (thinking is cached with its turn).
_UNMARKABLE = ("thinking", "redacted_thinking")
_POLICY_MARK: dict[str, str] = {"type": "ephemeral"}
# The fields before messages whose entries may carry a mark, in reading order.
_LISTED: tuple[Literal["tools", "system"], ...] = ("tools", "system")


class Breakpoint(msgspec.Struct, frozen=True, kw_only=True):
    """One ``cache_control`` mark of an Anthropic request body.

    Attributes:
        field: where it is: ``"tools"``, ``"system"``, ``"messages"``, or
            ``"body"`` (a top-level ``cache_control``: automatic caching).
        item: index in that field's list (the tool, the system block, the
            message); -1 for ``"body"``.
        block: index of the content block in the message; -1 elsewhere.
        ttl: the mark's ``ttl`` (``"5m"`` when absent, the API's default).
    """

    field: Literal["tools", "system", "messages", "body"]
    item: int
    block: int
    ttl: str


class PromptCache(msgspec.Struct, frozen=True, kw_only=True):
    """What turnloom adds to a request for the provider's prompt cache (opt-in, per Foundation).

    Given as ``Foundation(prompt_cache=PromptCache())`` (or to a
    ContextManager); it acts on what the manager writes as a request:
    :meth:`~turnloom.runtime.ContextManager.request_body` and
    :meth:`~turnloom.runtime.ContextManager.request_bytes`. Nothing it adds
    enters what turnloom keeps (histories, prefixes, ``prefix.items``).

    Attributes:
        breakpoints: Anthropic: place ``cache_control`` breakpoints by
            :func:`place_breakpoints` (the rolling end, the last closed
            turn, the instructions, lookback bridges), counting the host's own
            marks within the budget of 4.
        cache_key: OpenAI Chat and Responses: set ``prompt_cache_key`` to
            :func:`prompt_cache_key` of the context id (also
            ``PreparedContext.prompt_cache_key``) unless the host's fields
            set one.
        key_salt: the key's salt (bytes, at most 64; empty by default).

    Gemini needs neither: its implicit cache keys on the prefix, which
    turnloom keeps stable (see this module's docstring).
    """

    breakpoints: bool = True
    cache_key: bool = True
    key_salt: bytes = b""


def _ttl(mark: Any) -> str:
    ttl = mark.get("ttl") if isinstance(mark, dict) else None
    return ttl if isinstance(ttl, str) else "5m"


def message_breakpoints(messages: Sequence[Any]) -> list[Breakpoint]:
    """The ``cache_control`` marks of the blocks of ``messages`` (Anthropic items), in order.

    One :class:`Breakpoint` per marked block (``field="messages"``, ``item``
    the message index, ``block`` the block index); a string content or an
    item of the wrong shape has none. Never raises.
    """
    out: list[Breakpoint] = []
    for index, item in enumerate(messages):
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list):
            continue
        for block_index, block in enumerate(content):
            if isinstance(block, dict) and _MARK in block:
                ttl = _ttl(block[_MARK])
                out.append(Breakpoint(field="messages", item=index, block=block_index, ttl=ttl))
    return out


def anthropic_breakpoints(body: dict[str, Any]) -> list[Breakpoint]:
    """Every ``cache_control`` mark of a Messages request body, in the API's reading order.

    The order is ``tools``, then ``system`` (a list of blocks; a string has
    no mark), then ``messages`` (each content block), then a top-level
    ``cache_control`` (automatic caching: its breakpoint lands on the last
    cacheable block, and it takes one of the slots). Items of the wrong
    shape are skipped, not reported: ``validate`` reports them.
    """
    out: list[Breakpoint] = []
    for field in _LISTED:
        entries = body.get(field)
        if isinstance(entries, list):
            for index, entry in enumerate(entries):
                if isinstance(entry, dict) and _MARK in entry:
                    ttl = _ttl(entry[_MARK])
                    out.append(Breakpoint(field=field, item=index, block=-1, ttl=ttl))
    messages = body.get("messages")
    if isinstance(messages, list):
        out.extend(message_breakpoints(messages))
    if _MARK in body:
        out.append(Breakpoint(field="body", item=-1, block=-1, ttl=_ttl(body[_MARK])))
    return out


def _where(mark: Breakpoint) -> str:
    if mark.field == "body":
        return "the top-level cache_control"
    if mark.field == "messages":
        return f"messages[{mark.item}].content[{mark.block}]"
    return f"{mark.field}[{mark.item}]"


def _index(mark: Breakpoint) -> int:
    """A violation's index for ``mark``: its message, or -1 outside ``messages``."""
    return mark.item if mark.field == "messages" else -1


def breakpoint_violations(marks: Sequence[Breakpoint]) -> list[Violation]:
    """The Anthropic cache rules ``marks`` (in reading order) break.

    * ``too_many_cache_breakpoints``: a mark after the fourth (one violation,
      at the fifth mark).
    * ``cache_ttl_order``: a ``"1h"`` mark after a shorter-lived one (each
      such mark). Longer TTLs must come first.

    A violation's ``index`` is the message index of the offending mark, or
    -1 for a mark in ``tools``, ``system`` or the top-level field.

    Source: Anthropic prompt caching guide, "Cache breakpoints" (up to 4)
    and "Mixing different TTLs".
    """
    out: list[Violation] = []
    if len(marks) > ANTHROPIC_MAX_BREAKPOINTS:
        fifth = marks[ANTHROPIC_MAX_BREAKPOINTS]
        out.append(
            Violation(
                index=_index(fifth),
                rule="too_many_cache_breakpoints",
                message=(
                    f"The request has {len(marks)} cache_control breakpoints (tools, system, "
                    f"message blocks and the top-level field together); Anthropic takes at "
                    f"most {ANTHROPIC_MAX_BREAKPOINTS}, and {_where(fifth)} is the fifth."
                ),
            )
        )
    shorter: Breakpoint | None = None
    for mark in marks:
        if mark.ttl != "1h":
            shorter = shorter or mark
        elif shorter is not None:
            out.append(
                Violation(
                    index=_index(mark),
                    rule="cache_ttl_order",
                    message=(
                        f"The 1h cache_control at {_where(mark)} comes after the "
                        f"{shorter.ttl} one at {_where(shorter)}; longer TTLs must come first."
                    ),
                )
            )
    return out


def _marked_text(text: str) -> dict[str, Any]:
    """A string content as one text block carrying the policy's mark."""
    return {"type": "text", "text": text, _MARK: dict(_POLICY_MARK)}


def _mark_message(item: dict[str, Any], block: int) -> None:
    content = item["content"]
    if isinstance(content, str):
        item["content"] = [_marked_text(content)]
        return
    content[block] = {**content[block], _MARK: dict(_POLICY_MARK)}


def place_breakpoints(body: dict[str, Any], closed_blocks: int) -> int:
    """The automatic Anthropic breakpoint policy: mark ``body`` in place; how many placed.

    ``body`` is a request body of turnloom's (``gateway.request_body`` of an
    input, plus the host's fields), new for this call: the policy sets
    ``cache_control`` on copies of the blocks it marks, so nothing else
    sharing the old blocks sees them. ``closed_blocks`` is how many of the
    content blocks of ``body["messages"]``, counted in order (a string
    content is one block), hold the closed history (earlier turns): block
    ``closed_blocks - 1`` ends the last closed turn (0: no closed turn). It
    is counted in blocks, not messages, because the body merges a closed
    turn's last user item with the next turn's input into one message.

    The host's own marks (in ``tools``, ``system``, message blocks, or the
    top-level field) count against the budget of
    :data:`ANTHROPIC_MAX_BREAKPOINTS` and are never moved or removed. The
    policy then spends what is left, in this order, each on a boundary
    that stays stable for as long as its content is held:

    1. the rolling mark: the last markable block of the last message (the
       current turn's growth; it moves with every input, and the next input
       finds the entry it wrote by the lookback);
    2. the end of the last closed turn: its last markable block (a closed
       turn's bytes never change, so the entry it wrote serves every input
       of the next turn);
    3. the end of the instructions: the last ``system`` block (after the
       ``tools``, which the API reads first), the one entry that survives
       when eviction changes the history after it;
    4. bridges, following Anthropic's 20-block lookback: while the rolling
       mark lies more than :data:`ANTHROPIC_LOOKBACK_BLOCKS` message blocks
       after the mark before it, one more mark at most that many blocks
       back from it, so a turn that grew by more than the lookback still
       reaches the entry its previous input wrote.

    A block that already carries a mark is not marked again (it costs
    nothing). Thinking blocks take no mark (the API refuses one): the mark
    goes on the last other block before. The policy's marks have no ``ttl``
    (5 minutes), so it places none before a host mark of ``"1h"`` (longer
    TTLs must come first): only after the last such mark.

    Returns:
        the number of marks the policy placed (0 when the host's marks use
        the whole budget).

    Raises:
        InvalidArgumentError: ``body`` has no ``messages`` list, or
            ``closed_blocks`` is not an int from 0 to its number of blocks.
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidArgumentError(
            "The request body has no messages list to place marks in.", field="messages"
        )
    flat = _flat_blocks(messages)
    if (
        not isinstance(closed_blocks, int)
        or isinstance(closed_blocks, bool)
        or not 0 <= closed_blocks <= len(flat)
    ):
        raise InvalidArgumentError(
            f"closed_blocks must be an int from 0 to {len(flat)}, not "
            f"{what_type(closed_blocks)} {str(closed_blocks)[:40]}.",
            field="closed_blocks",
        )
    marks = anthropic_breakpoints(body)
    budget = ANTHROPIC_MAX_BREAKPOINTS - len(marks)
    # Positions in reading order: (0, tool), (1, system block), (2, message, block).
    floor: tuple[int, ...] = (-1,)
    for host_mark in marks:
        if host_mark.ttl == "1h":
            if host_mark.field == "body":
                return 0  # automatic caching's mark ends the request: nothing 5m may precede it
            floor = max(floor, _place(host_mark))
    if budget <= 0 or not messages:
        return 0
    host = {_place(m) for m in marks}
    marked = {at for at, (m, b, _) in enumerate(flat) if (2, m, b) in host}
    placed = 0

    def put(at: int) -> bool:
        nonlocal placed
        message, block, markable = flat[at]
        if not markable or (2, message, block) <= floor:
            return False
        if at not in marked:
            if placed >= budget:
                return False
            _mark_message(messages[message], block)
            marked.add(at)
            placed += 1
        return True

    def mark_last(stop: int) -> int:
        """Mark the last markable block before flat index ``stop``; its index, or -1."""
        for at in range(stop - 1, -1, -1):
            if flat[at][2]:
                return at if put(at) else -1
        return -1

    rolling = mark_last(len(flat))
    if closed_blocks:
        mark_last(closed_blocks)
    system = body.get("system")
    if system and placed < budget:
        last = (1, len(system) - 1 if isinstance(system, list) else 0)
        if isinstance(system, str) and last > floor:
            body["system"] = [_marked_text(system)]
            placed += 1
        elif (
            isinstance(system, list)
            and isinstance(system[-1], dict)
            and _MARK not in system[-1]
            and last > floor
        ):
            system[-1] = {**system[-1], _MARK: dict(_POLICY_MARK)}
            placed += 1
    # Bridges: back from the rolling mark while the gap to the mark before exceeds the lookback.
    position = rolling
    while position >= 0 and placed < budget:
        before = max((at for at in marked if at < position), default=-1)
        if position - before <= ANTHROPIC_LOOKBACK_BLOCKS:
            break
        chosen = next(
            (at for at in range(position - ANTHROPIC_LOOKBACK_BLOCKS, position) if put(at)), -1
        )
        if chosen < 0:
            break
        position = chosen
    return placed


def _flat_blocks(messages: list[Any]) -> list[tuple[int, int, bool]]:
    """Every message block in order: (message, block, may carry a mark)."""
    flat: list[tuple[int, int, bool]] = []
    for index, item in enumerate(messages):
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            flat.append((index, 0, bool(content)))
        elif isinstance(content, list):
            for block_index, block in enumerate(content):
                markable = isinstance(block, dict) and block.get("type") not in _UNMARKABLE
                flat.append((index, block_index, markable))
    return flat


def content_blocks(item: Any) -> int:
    """How many content blocks one Anthropic item holds (a string content is one)."""
    content = item.get("content") if isinstance(item, dict) else None
    if isinstance(content, list):
        return len(content)
    return 1 if isinstance(content, str) else 0


def _place(mark: Breakpoint) -> tuple[int, ...]:
    """A mark's position in reading order (tools, system, messages, the top-level field)."""
    if mark.field == "tools":
        return (0, mark.item)
    if mark.field == "system":
        return (1, mark.item)
    if mark.field == "messages":
        return (2, mark.item, mark.block)
    return (3,)


def prompt_cache_key(context_id: str, salt: bytes = b"") -> str:
    """An OpenAI ``prompt_cache_key`` for one context: a salted hash, never the id itself.

    ``"tl-"`` and the 32 hex digits of BLAKE2b (16-byte digest) of the
    context id's UTF-8 bytes, keyed with ``salt`` (up to 64 bytes; a
    deployment that does not want its keys comparable with another's sets
    its own). Equal ids give equal keys, so every input of one conversation
    routes to one cache; the key does not reveal the id.

    Source: OpenAI prompt caching guide, ``prompt_cache_key`` (requests with
    the same key and prefix are routed together).

    Raises:
        InvalidArgumentError: ``context_id`` is not a str, or ``salt`` is
            not bytes of at most 64.
    """
    if not isinstance(context_id, str):
        raise InvalidArgumentError(
            f"context_id must be a str, not {what_type(context_id)}.", field="context_id"
        )
    if not isinstance(salt, bytes) or len(salt) > 64:
        raise InvalidArgumentError(
            "The prompt cache key salt must be bytes, at most 64 of them.", field="salt"
        )
    digest = hashlib.blake2b(
        context_id.encode("utf-8", "surrogatepass"), digest_size=16, key=salt
    ).hexdigest()
    return f"tl-{digest}"
