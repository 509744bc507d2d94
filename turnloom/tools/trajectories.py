"""Recorded agent transcripts (trajectories): reading them, and the built-in workload.

Synchronous. The tau-bench list format and JSONL are read
(:func:`load_trajectories`); a part that cannot be read becomes a
:class:`ReplayError` naming the file, the trajectory and, when it can be
found, the message, while the other trajectories are kept.
"""

from __future__ import annotations

__all__ = ("ReplayError", "Trajectory", "builtin_trajectories", "load_trajectories")

import json
import re
from pathlib import Path
from typing import Any

import msgspec

from turnloom.tools.workload import generate_trajectories

_decoder = msgspec.json.Decoder()


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
