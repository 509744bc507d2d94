"""Replay recorded agent transcripts through one Foundation (``turnloom replay``).

Each trajectory (a list of OpenAI Chat messages) is one session, one context:

* ``system``/``developer`` messages become the pinned instructions of the next
  committed turn;
* every ``user`` message commits a turn and ``prepare`` builds the input of
  its first model call;
* every ``assistant`` message is one model call: its input is the prefix
  (first call of the turn) or ``build(prefix, continuation)`` (later calls);
  the recorded reply is then recorded as the turn's output inside an
  invocation, and so are the ``tool`` results.

For OpenAI Chat the prepared input of every model call is checked against the
trajectory itself: it must equal, message for message, the messages before
that assistant reply. Two documented normalizations are allowed, and counted
as ``normalized``: what the gateway round trip changes (for example an empty
text part is never emitted) and calls left without a result, which are
excluded (seed 004). For the other gateways the item list of every request
body (``request_body``) must pass the gateway's ``validate()``.

A trajectory that is malformed (not JSON, an unknown role, a tool message
that answers no preceding call) is reported with its file, trajectory index
and message index; the other sessions still run.
"""

from __future__ import annotations

__all__ = (
    "ReplayError",
    "ReplaySummary",
    "Trajectory",
    "builtin_trajectories",
    "load_trajectories",
    "replay",
)

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import msgspec

from turnloom.context.gateway import Gateway, GatewayType, NativeContent, get_gateway
from turnloom.context.history import HistoryLimits
from turnloom.context.message import Message, Role
from turnloom.context.pairing import complete_pairs
from turnloom.errors import InputError, TurnloomError, excerpt
from turnloom.runtime.foundation import Foundation
from turnloom.runtime.schemas import ContextPrepareRequest, PreparedContext, TurnSnapshot
from turnloom.runtime.workload import generate_trajectories

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_CHAT = GatewayType.openai_chat
# The field of each gateway's request body that holds the item list.
_BODY_ITEMS = {
    GatewayType.openai_chat: "messages",
    GatewayType.openai_responses: "input",
    GatewayType.anthropic: "messages",
    GatewayType.gemini: "contents",
}


class Trajectory(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded session.

    Attributes:
        source: where it came from (a file path, or ``"builtin"``).
        index: its position in the source, from 0.
        messages: the OpenAI Chat messages, oldest first, as decoded JSON.
    """

    source: str
    index: int
    messages: list[Any]

    @property
    def session_id(self) -> str:
        """``"<file name>#<index>"``, the context id of the session."""
        return f"{Path(self.source).name}#{self.index}"


class ReplayError(msgspec.Struct, frozen=True, kw_only=True):
    """A trajectory that could not be replayed.

    Attributes:
        source: the file (or ``"builtin"``).
        trajectory: the trajectory index in the file, or None when the file
            could not be split into trajectories.
        message: the message index in the trajectory, or None when unknown.
        reason: a full sentence.
    """

    source: str
    trajectory: int | None
    message: int | None
    reason: str

    def __str__(self) -> str:
        where = [self.source]
        if self.trajectory is not None:
            # A trajectory-level error names its message, or "?" when unknown;
            # a file-level error (no trajectory) names only the file.
            where.append(f"trajectory {self.trajectory}")
            where.append(f"message {self.message}" if self.message is not None else "message ?")
        return f"{', '.join(where)}: {self.reason}"


class ReplaySummary(msgspec.Struct, frozen=True, kw_only=True):
    """What a replay did.

    Attributes:
        sessions: sessions replayed to the end.
        turns: turns committed.
        model_calls: model inputs prepared (one per recorded assistant reply).
        items: native items over all prepared inputs.
        bytes: serialized bytes over all prepared inputs (sum of item sizes).
        normalized: inputs equal to the trajectory only after a documented
            normalization (OpenAI Chat only).
        errors: trajectories that failed, with where and why.
        prepare_p50_ms, prepare_p99_ms: ``prepare`` latency percentiles, in
            milliseconds (nearest rank).
        seconds: wall time of the replay, in seconds.
    """

    sessions: int
    turns: int
    model_calls: int
    items: int
    bytes: int
    normalized: int
    errors: tuple[ReplayError, ...]
    prepare_p50_ms: float
    prepare_p99_ms: float
    seconds: float


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0..100) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# -- loading ---------------------------------------------------------------------

_TRAJ_KEY = re.compile(r'"(?:traj|messages)"\s*:\s*\[')
_SPACE = re.compile(r"\s*")


def _scan_array(text: str, start: int) -> tuple[int, int | None]:
    """Decode the elements of the JSON array opening at ``text[start]``.

    Returns:
        (number of elements decoded, index of the first one that fails or None).
    """
    decoder = json.JSONDecoder()
    pos = _SPACE.match(text, start + 1).end()  # type: ignore[union-attr]
    count = 0
    if text.startswith("]", pos):
        return 0, None
    while True:
        try:
            _, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return count, count
        count += 1
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
        if text.startswith(",", pos):
            pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
        elif text.startswith("]", pos):
            return count, None
        else:
            return count, count


def _locate_message(text: str, start: int) -> int | None:
    """The index of the first malformed message of the trajectory at ``start``."""
    if text.startswith("[", start):
        return _scan_array(text, start)[1]
    found = _TRAJ_KEY.search(text, start)
    if found is None:
        return None
    return _scan_array(text, found.end() - 1)[1]


def _messages_of(value: Any) -> list[Any] | None:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        for key in ("traj", "messages"):
            if isinstance(value.get(key), list):
                return value[key]  # type: ignore[no-any-return]
    return None


def load_trajectories(path: str | Path) -> tuple[list[Trajectory], list[ReplayError]]:
    """Read trajectories from a tau-bench list file or a JSONL file.

    The tau-bench format is one JSON list whose entries hold the messages in
    ``traj`` (or ``messages``), or are message lists themselves. JSONL holds
    one trajectory per line: a message list, or an object with ``traj`` or
    ``messages``. A file that decodes as one list of trajectories is the list
    format; a file whose first line is a JSON value of its own, or that holds
    one message list, is JSONL; anything else starting with ``[`` is a damaged
    list file.

    Returns:
        the trajectories that could be read, and an error for each part that
        could not (naming the trajectory and, when it can be found, the
        message); a file that cannot be read, or holds no trajectory at all,
        is one error naming only the file.
    """
    trajectories, errors = _load(str(path), path)
    if not trajectories and not errors:
        errors = [
            ReplayError(
                source=str(path),
                trajectory=None,
                message=None,
                reason="the file holds no trajectories.",
            )
        ]
    return trajectories, errors


def _load(source: str, path: str | Path) -> tuple[list[Trajectory], list[ReplayError]]:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        return [], [
            ReplayError(
                source=source,
                trajectory=None,
                message=None,
                reason=f"cannot read the file: {exc.strerror}.",
            )
        ]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [
            ReplayError(
                source=source,
                trajectory=None,
                message=None,
                reason=f"the file is not valid UTF-8 (byte {exc.start}).",
            )
        ]
    try:
        data = _decoder.decode(raw)
    except msgspec.DecodeError:
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            json.loads(lines[0] if lines else "")
        except json.JSONDecodeError:
            if text.lstrip().startswith("[") and len(lines) > 0:
                return _load_list(source, text, None)
        return _load_lines(source, text)
    if isinstance(data, list) and not all(isinstance(x, dict) and "role" in x for x in data):
        return _load_list(source, text, data)
    return _load_lines(source, text)


def _trajectory_or_error(source: str, index: int, value: Any) -> Trajectory | ReplayError:
    messages = _messages_of(value)
    if messages is None:
        return ReplayError(
            source=source,
            trajectory=index,
            message=None,
            reason="the trajectory is neither a message list nor an object with 'traj' "
            "or 'messages'.",
        )
    return Trajectory(source=source, index=index, messages=messages)


def _load_list(
    source: str, text: str, data: list[Any] | None
) -> tuple[list[Trajectory], list[ReplayError]]:
    trajectories: list[Trajectory] = []
    errors: list[ReplayError] = []
    if data is not None:
        for index, value in enumerate(data):
            item = _trajectory_or_error(source, index, value)
            (trajectories if isinstance(item, Trajectory) else errors).append(item)  # type: ignore[arg-type]
        return trajectories, errors
    # Not valid JSON: keep every trajectory before the damage, then report it.
    decoder = json.JSONDecoder()
    pos = _SPACE.match(text, text.index("[") + 1).end()  # type: ignore[union-attr]
    index = 0
    while pos < len(text) and not text.startswith("]", pos):
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            line, column = exc.lineno, exc.colno
            errors.append(
                ReplayError(
                    source=source,
                    trajectory=index,
                    message=_locate_message(text, pos),
                    reason=f"invalid JSON at line {line}, column {column}: {exc.msg}.",
                )
            )
            return trajectories, errors
        item = _trajectory_or_error(source, index, value)
        (trajectories if isinstance(item, Trajectory) else errors).append(item)  # type: ignore[arg-type]
        index += 1
        pos = _SPACE.match(text, end).end()  # type: ignore[union-attr]
        if text.startswith(",", pos):
            pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
        elif not text.startswith("]", pos):
            errors.append(
                ReplayError(
                    source=source,
                    trajectory=index,
                    message=None,
                    reason="invalid JSON: expected ',' or ']' after a trajectory.",
                )
            )
            return trajectories, errors
    return trajectories, errors


def _load_lines(source: str, text: str) -> tuple[list[Trajectory], list[ReplayError]]:
    trajectories: list[Trajectory] = []
    errors: list[ReplayError] = []
    index = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(
                ReplayError(
                    source=source,
                    trajectory=index,
                    message=_locate_message(line, len(line) - len(line.lstrip())),
                    reason=f"invalid JSON on line {number}, column {exc.colno}: {exc.msg}.",
                )
            )
        else:
            item = _trajectory_or_error(source, index, value)
            (trajectories if isinstance(item, Trajectory) else errors).append(item)  # type: ignore[arg-type]
        index += 1
    return trajectories, errors


def builtin_trajectories(
    sessions: int = 24, *, seed: int = 0, turns: tuple[int, int] = (3, 9)
) -> list[Trajectory]:
    """The built-in generated workload (see :mod:`turnloom.runtime.workload`).

    Args:
        sessions: how many trajectories.
        seed: equal seeds give equal trajectories.
        turns: inclusive range of user turns per trajectory.
    """
    return [
        Trajectory(source="builtin", index=i, messages=messages)
        for i, messages in enumerate(generate_trajectories(sessions, seed=seed, turns=turns))
    ]


# -- checking at the door ----------------------------------------------------------


class _Parsed(msgspec.Struct, frozen=True):
    messages: list[Message]
    roles: list[Role]


def _parse(trajectory: Trajectory, chat: Gateway) -> _Parsed | ReplayError:
    """Parse and check a whole trajectory before any of it reaches the manager."""
    messages: list[Message] = []
    roles: list[Role] = []
    open_calls: set[str] = set()
    turn_started = False

    def fail(index: int, reason: str) -> ReplayError:
        return ReplayError(
            source=trajectory.source, trajectory=trajectory.index, message=index, reason=reason
        )

    for index, native in enumerate(trajectory.messages):
        try:
            message = chat.parse(native)
        except TurnloomError as exc:
            return fail(index, str(exc))
        role = message.role
        if role is Role.tool:
            call_id = message.tool_results[0].call_id
            if call_id not in open_calls:
                return fail(
                    index,
                    f"tool message answers call {excerpt(call_id)}, which the directly preceding "
                    "assistant message did not make.",
                )
            open_calls.discard(call_id)
        elif role is Role.assistant:
            if not turn_started:
                return fail(index, "assistant message before any user message (no turn to answer).")
            open_calls = {c.call_id for c in message.tool_calls}
        else:
            open_calls = set()
            if role is Role.user:
                turn_started = True
        messages.append(message)
        roles.append(role)
    return _Parsed(messages, roles)


# -- replaying ---------------------------------------------------------------------


class _Totals:
    __slots__ = ("calls", "items", "latencies", "normalized", "sessions", "total_bytes", "turns")

    def __init__(self) -> None:
        self.sessions = self.turns = self.calls = self.items = self.total_bytes = 0
        self.normalized = 0
        self.latencies: list[float] = []


def _expected(chat: Gateway, messages: Sequence[Message]) -> list[NativeContent]:
    out: list[NativeContent] = []
    for message in complete_pairs(messages):
        out.extend(chat.render(message))
    return out


async def _replay_one(
    foundation: Foundation,
    trajectory: Trajectory,
    chat: Gateway,
    totals: _Totals,
    emit: Callable[[bytes], None] | None,
) -> ReplayError | None:
    parsed = _parse(trajectory, chat)
    if isinstance(parsed, ReplayError):
        return parsed
    manager = foundation.manager
    gateway = manager.gateway
    verify_exact = gateway.type is _CHAT
    context_id = trajectory.session_id
    instructions: list[Message] = []
    prefix: PreparedContext | None = None
    continuation: list[Message] = []
    turn_id = ""
    turn_index = -1
    call_index = 0
    turns = calls = items_total = bytes_total = normalized = 0
    latencies: list[float] = []

    def fail(index: int, reason: str) -> ReplayError:
        return ReplayError(
            source=trajectory.source, trajectory=trajectory.index, message=index, reason=reason
        )

    try:
        for index, (message, role) in enumerate(zip(parsed.messages, parsed.roles, strict=True)):
            if role in (Role.system, Role.developer):
                instructions.append(message)
                continue
            if role is Role.user:
                turn_index += 1
                turn_id = f"turn-{turn_index}"
                manager.accept_turn(
                    TurnSnapshot(
                        context_id=context_id,
                        turn_id=turn_id,
                        input=(message,),
                        instructions=tuple(instructions) if instructions else None,
                    )
                )
                instructions = []
                turns += 1
                started = time.perf_counter()
                prefix = await manager.prepare(
                    ContextPrepareRequest(context_id=context_id, turn_id=turn_id)
                )
                latencies.append(time.perf_counter() - started)
                continuation = []
                call_index = 0
                continue
            assert prefix is not None
            if role is Role.assistant:
                items = manager.build(prefix, continuation) if continuation else prefix.items
                size = prefix.bytes + sum(
                    len(_encoder.encode(i)) for i in items[prefix.item_count :]
                )
                if verify_exact:
                    if list(items) != trajectory.messages[:index]:
                        if list(items) != _expected(chat, parsed.messages[:index]):
                            return fail(
                                index, _first_difference(items, trajectory.messages[:index])
                            )
                        normalized += 1
                else:
                    # The provider's rules apply to the request body, where
                    # the gateway lifts instructions and merges adjacent turns.
                    body = gateway.request_body(items)
                    violations = gateway.validate(body[_BODY_ITEMS[gateway.type]])
                    if violations:
                        return fail(
                            index,
                            f"the prepared input breaks a {gateway.type.value} rule: "
                            f"{violations[0].message}",
                        )
                calls += 1
                items_total += len(items)
                bytes_total += size
                if emit is not None:
                    emit(
                        _encoder.encode(
                            {
                                "session": context_id,
                                "turn": turn_index,
                                "call": call_index,
                                **(
                                    {"messages": items}
                                    if verify_exact
                                    else {"request": gateway.request_body(items)}
                                ),
                            }
                        )
                        + b"\n"
                    )
                call_index += 1
                async with manager.invocation(context_id, turn_id) as invocation:
                    invocation.record([message])
            else:
                manager.record(context_id, turn_id, [message])
            continuation.append(message)
    except TurnloomError as exc:
        return fail(index, str(exc))
    finally:
        try:
            manager.remove_context(context_id)
        except TurnloomError:
            pass
    totals.sessions += 1
    totals.turns += turns
    totals.calls += calls
    totals.items += items_total
    totals.total_bytes += bytes_total
    totals.normalized += normalized
    totals.latencies.extend(latencies)
    return None


def _first_difference(items: Sequence[NativeContent], expected: Sequence[Any]) -> str:
    for position, (got, want) in enumerate(zip(items, expected, strict=False)):
        if got != want:
            return (
                f"the prepared input differs from the trajectory at message {position}: "
                f"prepared {json.dumps(got)[:120]}, recorded {json.dumps(want)[:120]}."
            )
    return (
        f"the prepared input has {len(items)} messages; the trajectory has "
        f"{len(expected)} before this reply."
    )


async def replay(
    trajectories: Sequence[Trajectory],
    *,
    gateway: GatewayType | str = GatewayType.openai_chat,
    concurrency: int = 8,
    out: BinaryIO | None = None,
    history_limits: HistoryLimits | None = None,
    load_errors: Sequence[ReplayError] = (),
) -> ReplaySummary:
    """Replay ``trajectories`` through one Foundation, ``concurrency`` sessions at a time.

    Args:
        trajectories: the sessions to replay.
        gateway: the provider to prepare inputs for.
        concurrency: sessions replayed at once.
        out: where to write every prepared input as JSONL (``session``,
            ``turn``, ``call``, and ``messages`` for OpenAI Chat or the
            gateway's ``request`` body for the others), or None.
        history_limits: the history bounds; by default large enough that a
            recorded session is never evicted (eviction would change inputs).
        load_errors: errors from loading, carried into the summary.

    Returns:
        the summary; failed sessions are listed in ``errors``, never raised.

    Raises:
        InputError: ``gateway`` is unknown or not available, or
            ``concurrency`` is not positive.

    Cancellation:
        Cancelling the replay cancels the sessions and closes the Foundation;
        records already handed to ``out`` are written.
    """
    get_gateway(gateway)
    if concurrency < 1:
        raise InputError(f"concurrency must be a positive integer, not {concurrency}.")
    limits = history_limits or HistoryLimits(
        max_turns=100_000, max_items=1_000_000, max_bytes=1 << 40, max_item_bytes=64 << 20
    )
    chat = get_gateway(_CHAT)
    totals = _Totals()
    errors: list[ReplayError] = list(load_errors)
    started = time.perf_counter()
    results: list[ReplayError | None] = [None] * len(trajectories)
    next_index = 0
    lock = anyio.Lock()

    async with Foundation(
        gateway=gateway,
        history_limits=limits,
        max_pending_preparations=max(16, concurrency),
    ) as foundation:

        async def worker() -> None:
            nonlocal next_index
            while next_index < len(trajectories):
                position = next_index
                next_index += 1
                records: list[bytes] = []
                results[position] = await _replay_one(
                    foundation,
                    trajectories[position],
                    chat,
                    totals,
                    records.append if out is not None else None,
                )
                if out is not None and records:
                    # One session's records stay together; the file is written
                    # off the event loop.
                    async with lock:
                        await anyio.to_thread.run_sync(out.writelines, records)

        async with anyio.create_task_group() as workers:
            for _ in range(min(concurrency, max(1, len(trajectories)))):
                workers.start_soon(worker)
    errors.extend(e for e in results if e is not None)
    return ReplaySummary(
        sessions=totals.sessions,
        turns=totals.turns,
        model_calls=totals.calls,
        items=totals.items,
        bytes=totals.total_bytes,
        normalized=totals.normalized,
        errors=tuple(errors),
        prepare_p50_ms=percentile(totals.latencies, 50) * 1000,
        prepare_p99_ms=percentile(totals.latencies, 99) * 1000,
        seconds=time.perf_counter() - started,
    )
