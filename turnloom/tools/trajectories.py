"""Recorded agent transcripts (trajectories): reading and checking them, the built-in workload.

Synchronous. The tau-bench list format, a single trajectory and JSONL are read
(:func:`load_trajectories`) and each trajectory is checked whole
(:func:`check_trajectory`) by the one rule both ``replay`` and ``loadtest``
use. What cannot be read becomes a :class:`ReplayError`: a file-level one
(``trajectory`` is None) when the file as a whole cannot be read, or one naming
the trajectory and, when it can be found, the message, while the other
trajectories are kept.
"""

from __future__ import annotations

__all__ = (
    "SAMPLE",
    "ReplayError",
    "Trajectory",
    "builtin_trajectories",
    "check_trajectory",
    "load_trajectories",
)

import json
import re
import sys
from pathlib import Path
from typing import Any

import msgspec

from turnloom.context.gateway import GatewayType, get_gateway
from turnloom.context.message import Message, Role
from turnloom.context.pairing import CallTracker
from turnloom.errors import TurnloomError, excerpt, what_type
from turnloom.tools.workload import generate_trajectories

_decoder = msgspec.json.Decoder()

SAMPLE = Path(__file__).resolve().parent / "data" / "tau-bench-airline-5.json"
"""Five real tau-bench airline trajectories shipped with turnloom (MIT License,
Copyright (c) 2024 Sierra; ``SOURCE.md`` and ``LICENSE`` lie beside the file)."""


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

    @property
    def file_level(self) -> bool:
        """True when the file as a whole could not be read (no trajectory is named)."""
        return self.trajectory is None

    def __str__(self) -> str:
        where = [self.source]
        if self.trajectory is not None:
            # A trajectory-level error names its message, or "?" when unknown;
            # a file-level error (no trajectory) names only the file.
            where.append(f"trajectory {self.trajectory}")
            where.append(f"message {self.message}" if self.message is not None else "message ?")
        return f"{', '.join(where)}: {self.reason}"


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


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and "role" in value


def _file_error(source: str, reason: str) -> ReplayError:
    return ReplayError(source=source, trajectory=None, message=None, reason=reason)


def load_trajectories(path: str | Path) -> tuple[list[Trajectory], list[ReplayError]]:
    """Read trajectories from a tau-bench list file, a single trajectory, or JSONL.

    Formats, decided from the whole file:

    * tau-bench list: one JSON list whose entries hold the messages in
      ``traj`` (or ``messages``), or are message lists themselves;
    * a single trajectory: one JSON message list, or one object with ``traj``
      or ``messages``, laid out in any way (pretty-printed or on one line);
    * JSONL: one trajectory per line (a message list or an object as above);
      a file is JSONL when it does not decode as one JSON value and one of
      its first two non-blank lines decodes on its own.

    A file that does not decode and starts with ``[`` is a damaged list: the
    trajectories before the damage are kept and the damage is reported with
    its trajectory (and message, when it can be found).

    ``-`` is standard input, read to its end (its source is ``"-"``).

    Returns:
        the trajectories that could be read, and the errors. A file that
        cannot be read, is not UTF-8, is not JSON or JSONL, holds a JSON
        value that is no trajectory, or holds no trajectory at all is one
        file-level error (``trajectory`` None, see :attr:`ReplayError.file_level`)
        and no trajectories.
    """
    source = str(path)
    trajectories, errors = _load(source, path)
    if not trajectories and not errors:
        errors = [_file_error(source, "the file holds no trajectories.")]
    return trajectories, errors


def _load(source: str, path: str | Path) -> tuple[list[Trajectory], list[ReplayError]]:
    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(path).read_bytes()
    except OSError as exc:
        return [], [_file_error(source, f"cannot read the file: {exc.strerror}.")]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [_file_error(source, f"the file is not valid UTF-8 (byte {exc.start}).")]
    try:
        try:
            data = _decoder.decode(raw)
        except msgspec.DecodeError:
            # JSON msgspec refuses may still be JSON (a lone surrogate's escape): its
            # messages are then refused one by one, as on a JSONL line.
            try:
                data = json.loads(text)
            except json.JSONDecodeError:
                return _load_damaged(source, text)
    except RecursionError:
        return [], [_file_error(source, "the file nests JSON too deeply to be read.")]
    if isinstance(data, list):
        if data and all(_is_message(x) for x in data):
            return [Trajectory(source=source, index=0, messages=data)], []
        return _load_list(source, text, data)
    if isinstance(data, dict):
        messages = _messages_of(data)
        if messages is None:
            return [], [
                _file_error(
                    source,
                    "the file holds one JSON object without a 'traj' or 'messages' list.",
                )
            ]
        return [Trajectory(source=source, index=0, messages=messages)], []
    return [], [
        _file_error(
            source, f"the file holds JSON that decodes to {what_type(data)}, not trajectories."
        )
    ]


def _decodes_alone(line: str) -> bool:
    try:
        return isinstance(json.loads(line), (list, dict))
    except json.JSONDecodeError:
        return False


def _load_damaged(source: str, text: str) -> tuple[list[Trajectory], list[ReplayError]]:
    """A file that is not one JSON value: JSONL, a damaged list, or not JSON at all."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return [], []
    if len(lines) > 1 and any(_decodes_alone(line) for line in lines[:2]):
        return _load_lines(source, text)
    stripped = text.lstrip()
    if stripped.startswith("["):
        first = _SPACE.match(stripped, 1).end()  # type: ignore[union-attr]
        if stripped.startswith("{", first) and _starts_with_message(stripped, first):
            # One damaged message list: a single trajectory.
            return [], [
                ReplayError(
                    source=source,
                    trajectory=0,
                    message=_scan_array(stripped, 0)[1],
                    reason=_json_problem(text),
                )
            ]
        return _load_list(source, text, None)
    return [], [_file_error(source, _json_problem(text))]


def _starts_with_message(text: str, pos: int) -> bool:
    try:
        value, _ = json.JSONDecoder().raw_decode(text, pos)
    except json.JSONDecodeError:
        return bool(re.match(r'\{\s*"role"\s*:', text[pos:]))
    return _is_message(value)


def _json_problem(text: str) -> str:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}."
    return "invalid JSON."


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


def check_trajectory(trajectory: Trajectory) -> list[Message] | ReplayError:
    """Parse and check a whole trajectory before any of it reaches a manager.

    Every message must parse as OpenAI Chat (the recorded format), the first
    ``user`` message must come before any ``assistant`` message, each ``tool``
    message must answer a call of the directly preceding assistant message,
    and the trajectory must hold at least one ``user`` message (a turn).

    Returns:
        the parsed messages, oldest first, or the error naming the first
        offending message.
    """
    chat = get_gateway(GatewayType.openai_chat)
    messages: list[Message] = []
    calls = CallTracker()
    turn_started = False

    def fail(index: int | None, reason: str) -> ReplayError:
        return ReplayError(
            source=trajectory.source, trajectory=trajectory.index, message=index, reason=reason
        )

    for index, native in enumerate(trajectory.messages):
        try:
            message = chat.parse(native)
        except TurnloomError as exc:
            return fail(index, str(exc))
        role = message.role
        if role is Role.assistant and not turn_started:
            return fail(index, "assistant message before any user message (no turn to answer).")
        orphans = calls.feed(message).orphans
        if orphans:
            return fail(
                index,
                f"tool message answers call {excerpt(orphans[0].call_id)}, which the directly "
                "preceding assistant message did not make.",
            )
        if role is Role.user:
            turn_started = True
        messages.append(message)
    if not turn_started:
        return fail(None, "the trajectory holds no user message, so no turn to replay.")
    return messages


def builtin_trajectories(
    sessions: int = 24, *, seed: int = 0, turns: tuple[int, int] = (3, 9)
) -> list[Trajectory]:
    """The built-in generated workload (see :mod:`turnloom.tools.workload`).

    Args:
        sessions: how many trajectories.
        seed: equal seeds give equal trajectories.
        turns: inclusive range of user turns per trajectory.
    """
    return [
        Trajectory(source="builtin", index=i, messages=messages)
        for i, messages in enumerate(generate_trajectories(sessions, seed=seed, turns=turns))
    ]
