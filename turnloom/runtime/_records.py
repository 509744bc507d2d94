"""The records a durable store keeps per context, their schema version, and replay.

Synchronous and loop-free. A context's log is the ordered list of changes its
history went through on the owning host: a turn committed, outputs recorded,
a turn's runtime-state pair kept (``ContextManager(earlier_state="keep")``,
so a restarted host sends the same bytes again), turns evicted, the newest
turn retracted, the oldest turns replaced by a summary turn (summary
compaction: :mod:`turnloom.context.summaries`), old tool output pruned.
Replaying the log into an empty :class:`TurnHistory` with the same limits
rebuilds the history exactly,
evictions included, because each change is applied through the same
``TurnHistory`` methods in the same order (an eviction is logged when it
happened, so a restored history evicts at the same points as the host that
wrote it, including evictions an in-flight model call held back).

A *checkpoint* record stands for a whole log prefix: the history as it is
(pinned instructions, the turns held with their outputs, the remembered
evicted turn ids, the last sequence, each turn's kept state and the call ids
it is sent with when one was renamed; a summary turn is held like any turn,
first). A store replaces a long log by one
checkpoint (log compaction, not summary compaction); replaying the
checkpoint and the records after it rebuilds the same history as replaying
the whole log, except for counters of what left the history before the
checkpoint. A history holding turns aside
for a retraction of its newest turn (``TurnHistory.restorable_ids``) is
checkpointed as the evictions found it, followed by the record of those
evictions and of the newest turn's kept state now when it changed since (see
:func:`compacted`), so the replayed history holds the same turns aside.

Encoding: one msgspec MessagePack map per record, tagged by ``kind``, carrying
the schema version ``v``. A field added by a later version has a default, so
a record written by an older version decodes; a record of a newer version, or
bytes that do not decode, raise :class:`~turnloom.errors.StoreRecordError`
naming the context and the record's position, never a silent skip.
"""

from __future__ import annotations

__all__ = (
    "SCHEMA_VERSION",
    "Checkpoint",
    "CheckpointTurn",
    "OutputsRecorded",
    "Record",
    "StateKept",
    "TurnCommitted",
    "TurnRetracted",
    "TurnsEvicted",
    "TurnsPruned",
    "TurnsSummarized",
    "checkpoint",
    "decode_record",
    "encode_record",
    "replay",
)

from collections.abc import Sequence
from typing import TypeAlias

import msgspec

from turnloom.context.history import (
    HistoryLimits,
    HistoryView,
    TurnHistory,
    apply_summary,
    prune_turns,
    restore_sent_ids,
)
from turnloom.context.message import Message
from turnloom.context.tokens import TokenCounter
from turnloom.errors import (
    HostCallbackError,
    StateError,
    StoreRecordError,
    TurnloomError,
    excerpt,
)

# Version 2 added StateKept and CheckpointTurn.state: kept state counts
# against the limits, so a version-1 reader could not replay the evictions.
# Version 3 added TurnsSummarized and TurnsPruned. CheckpointTurn.call_ids
# came later with a default, in version 3: a reader without it restores the
# ids the checkpoint's turns alone decide (each still sent once), not an error.
SCHEMA_VERSION = 3
"""The version written into every new record."""


class _Record(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    v: int = SCHEMA_VERSION


class TurnCommitted(_Record, frozen=True, kw_only=True, tag="commit"):
    """A turn was committed (``TurnHistory.commit``)."""

    turn_id: str
    input: tuple[Message, ...]
    instructions: tuple[Message, ...] | None = None
    sequence: int | None = None


class OutputsRecorded(_Record, frozen=True, kw_only=True, tag="record"):
    """Outputs of a turn were recorded (``TurnHistory.record``), as given."""

    turn_id: str
    outputs: tuple[Message, ...]


class StateKept(_Record, frozen=True, kw_only=True, tag="state"):
    """A turn's kept state was set (``TurnHistory.keep_state``): its runtime-state pair, or ()."""

    turn_id: str
    state: tuple[Message, ...] = ()


class TurnsEvicted(_Record, frozen=True, kw_only=True, tag="evict"):
    """Turns were evicted (``TurnHistory.evict``), oldest first."""

    turn_ids: tuple[str, ...]


class TurnRetracted(_Record, frozen=True, kw_only=True, tag="retract"):
    """The newest turn was taken back (``TurnHistory.retract``)."""

    turn_id: str


class TurnsSummarized(_Record, frozen=True, kw_only=True, tag="summarize"):
    """The oldest turns were replaced by a summary turn (summary compaction).

    ``turn_ids`` are the turns the summarizer was given, oldest first
    (some may have been evicted meanwhile); ``replaced`` the ones the summary
    turn ``summary_id`` replaced (``_summary_ops.apply_summary``).
    """

    turn_ids: tuple[str, ...]
    summary_id: str
    summary: tuple[Message, ...]
    replaced: tuple[str, ...] = ()


class TurnsPruned(_Record, frozen=True, kw_only=True, tag="prune"):
    """Tool output of the turns before the newest ``keep`` was pruned (``prune_turns``)."""

    turn_ids: tuple[str, ...]
    keep: int
    note: str


class CheckpointTurn(msgspec.Struct, frozen=True, kw_only=True):
    """One turn held at a checkpoint: its input, its kept state and its recorded outputs.

    ``call_ids``: the id each tool call and result of the turn was sent with
    (in the order of ``input``, ``outputs``, then ``state``), when one was
    renamed (a reuse of a kept call's id, decided when it was committed:
    see the ``turnloom.context.history`` docstring, "Call ids"); () when every one is
    sent as given, and in checkpoints written before the field existed
    (those restore the ids a history of the checkpoint's turns alone
    decides).
    """

    turn_id: str
    input: tuple[Message, ...]
    outputs: tuple[Message, ...] = ()
    state: tuple[Message, ...] = ()
    call_ids: tuple[str, ...] = ()


class Checkpoint(_Record, frozen=True, kw_only=True, tag="checkpoint"):
    """The whole history at one moment; only ever the first record of a log.

    ``call_ids``: True when each turn's ``call_ids`` was written (then ()
    means every id of the turn is sent as given); False in checkpoints
    written before, whose turns are sent with the ids the restored history
    decides.
    """

    pinned: tuple[Message, ...] = ()
    turns: tuple[CheckpointTurn, ...]
    evicted: tuple[str, ...] = ()
    sequence: int | None = None
    call_ids: bool = False


Record: TypeAlias = (
    TurnCommitted
    | OutputsRecorded
    | StateKept
    | TurnsEvicted
    | TurnRetracted
    | TurnsSummarized
    | TurnsPruned
    | Checkpoint
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Record)


def checkpoint(view: HistoryView, evicted: tuple[str, ...], sequence: int | None) -> bytes:
    """The encoded checkpoint of a history (its view, evicted ids and last sequence).

    Runs in a worker thread: O(history). The history must hold a turn (its
    first turn carries the pinned instructions and the sequence).

    Raises:
        StateError: the history holds no turn.
    """
    if not view.turn_ids:
        raise StateError("A history without turns has no checkpoint.")
    turns = []
    for turn_id in view.turn_ids:
        given = view.turn_input(turn_id)
        turns.append(
            CheckpointTurn(
                turn_id=turn_id,
                input=given,
                outputs=view.turn_messages(turn_id)[len(given) :],
                state=view.turn_state(turn_id),
                call_ids=view.sent_call_ids(turn_id),
            )
        )
    return encode_record(
        Checkpoint(
            pinned=view.pinned,
            turns=tuple(turns),
            evicted=evicted,
            sequence=sequence,
            call_ids=True,
        )
    )


def compacted(history: TurnHistory) -> tuple[HistoryView, tuple[str, ...], tuple[Record, ...]]:
    """What a checkpoint of ``history`` holds, and the records to log after it.

    Returns the view and evicted ids to pass to :func:`checkpoint`, and the
    records that follow it: replaying the checkpoint, then those, rebuilds
    ``history`` (but for the counters of what left it). While the history
    holds turns aside for a retraction of its newest turn
    (``TurnHistory.restorable_ids``), the checkpoint holds them, with the
    newest turn as the latest eviction found it; their eviction follows,
    then the newest turn's kept state now when it changed since. O(turns
    held and remembered ids).
    """
    view, evicted = history.before_evictions()
    aside = history.restorable_ids
    if not aside:
        return view, evicted, ()
    newest = view.turn_ids[-1]
    state = history.view().turn_state(newest)
    if view.turn_state(newest) == state:
        return view, evicted, (TurnsEvicted(turn_ids=aside),)
    return view, evicted, (TurnsEvicted(turn_ids=aside), StateKept(turn_id=newest, state=state))


class _Version(msgspec.Struct):
    v: int = 0


_version = msgspec.msgpack.Decoder(_Version)


def encode_record(record: Record) -> bytes:
    """The stored bytes of one record."""
    return _encoder.encode(record)


def decode_record(data: bytes, context_id: str, index: int) -> Record:
    """Decode the record at ``index`` of ``context_id``'s log.

    Raises:
        StoreRecordError: the bytes do not decode to a record, or the record was
            written by a newer schema version than :data:`SCHEMA_VERSION`.
    """
    try:
        record = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        try:
            version = _version.decode(data).v
        except msgspec.DecodeError:
            version = None
        if version is not None and version > SCHEMA_VERSION:
            raise StoreRecordError(
                f"Record {index} of context {excerpt(context_id)} was written with schema version "
                f"{version}, newer than this turnloom's {SCHEMA_VERSION}; upgrade to read it.",
                context_id=context_id,
                index=index,
            ) from exc
        raise StoreRecordError(
            f"Record {index} of context {excerpt(context_id)} cannot be decoded: {exc}.",
            context_id=context_id,
            index=index,
        ) from exc
    if record.v > SCHEMA_VERSION:
        raise StoreRecordError(
            f"Record {index} of context {excerpt(context_id)} was written with schema version "
            f"{record.v}, newer than this turnloom's {SCHEMA_VERSION}; upgrade to read it.",
            context_id=context_id,
            index=index,
        )
    return record


def _restore(history: TurnHistory, record: Checkpoint) -> None:
    history.remember_evicted(record.evicted)
    for i, turn in enumerate(record.turns):
        history.commit(
            turn.turn_id,
            turn.input,
            instructions=record.pinned if i == 0 else None,
            sequence=record.sequence if i == 0 else None,
            keep_unpaired=True,
        )
        # Outputs first: they were accepted with or without the pair (keeping
        # checks no limit), and a record checks the turn's size with its pair.
        if turn.outputs:
            history.record(turn.turn_id, turn.outputs, keep_unpaired=True)
        if turn.state:
            history.keep_state(turn.turn_id, turn.state)
        # The ids its calls were sent with, whatever the order above decided.
        if record.call_ids:
            restore_sent_ids(history, turn.turn_id, turn.call_ids, given=True)


def _check_same(
    context_id: str, index: int, verb: str, logged: tuple[str, ...], done: tuple[str, ...]
) -> None:
    if logged != done:
        raise StoreRecordError(
            f"Record {index} of context {excerpt(context_id)} {verb} turns "
            f"{excerpt(list(logged))}, but on the history rebuilt from the records before it "
            f"that {verb} {excerpt(list(done))}; the log is corrupt.",
            context_id=context_id,
            index=index,
        )


def replay(
    context_id: str,
    log: Sequence[bytes],
    limits: HistoryLimits,
    token_counter: TokenCounter | None = None,
) -> TurnHistory:
    """Rebuild a context's history from its log, oldest record first.

    Runs in a worker thread: the history is new and owned by the caller. The
    limits and the token counter must be the ones the log was written with
    (evictions depend on them).

    Raises:
        StoreRecordError: a record does not decode, or does not apply to the
            history rebuilt so far (a duplicate turn, an eviction that evicts
            other turns than it logged); ``index`` names it.
        HostCallbackError: ``token_counter`` failed (see
            :func:`~turnloom.context.tokens.count_tokens`).
    """
    history = TurnHistory(limits, token_counter=token_counter)
    for index, data in enumerate(log):
        record = decode_record(data, context_id, index)
        try:
            if isinstance(record, TurnCommitted):
                history.commit(
                    record.turn_id,
                    record.input,
                    instructions=record.instructions,
                    sequence=record.sequence,
                    keep_unpaired=True,  # as an earlier turnloom accepted them
                )
            elif isinstance(record, OutputsRecorded):
                history.record(record.turn_id, record.outputs, keep_unpaired=True)
            elif isinstance(record, StateKept):
                if not history.keep_state(record.turn_id, record.state):
                    raise StoreRecordError(
                        f"Record {index} of context {excerpt(context_id)} keeps the state of "
                        f"turn {excerpt(record.turn_id)}, which the history rebuilt from the "
                        "records before it does not hold; the log is corrupt.",
                        context_id=context_id,
                        index=index,
                    )
            elif isinstance(record, TurnRetracted):
                history.retract(record.turn_id)
            elif isinstance(record, TurnsSummarized):
                applied = apply_summary(
                    history,
                    record.turn_ids,
                    record.summary_id,
                    record.summary,
                    max(1, len(record.summary)),
                )
                _check_same(context_id, index, "replaces", record.replaced, applied.replaced)
            elif isinstance(record, TurnsPruned):
                # The turns it lists: the live pass skipped turns it had pruned before
                # (under an earlier note, say), which a pass without its memo would not.
                pruned = prune_turns(history, record.keep, record.note, only=record.turn_ids)
                _check_same(context_id, index, "prunes", record.turn_ids, pruned)
            elif isinstance(record, Checkpoint):
                if index:
                    raise StoreRecordError(
                        f"Record {index} of context {excerpt(context_id)} is a checkpoint; a "
                        "checkpoint only ever opens a log.",
                        context_id=context_id,
                        index=index,
                    )
                _restore(history, record)
            else:
                evicted = history.evict()
                if evicted != record.turn_ids:
                    raise StoreRecordError(
                        f"Record {index} of context {excerpt(context_id)} logs the eviction of "
                        f"{excerpt(list(record.turn_ids))}, but the history rebuilt from the "
                        f"records before it evicts {excerpt(list(evicted))}; the log is corrupt "
                        "or was written with other history limits.",
                        context_id=context_id,
                        index=index,
                    )
        except (StoreRecordError, HostCallbackError):
            raise  # the counter's failure, not the record's
        except TurnloomError as exc:
            raise StoreRecordError(
                f"Record {index} of context {excerpt(context_id)} does not apply to the history "
                f"rebuilt from the records before it: {exc}",
                context_id=context_id,
                index=index,
            ) from exc
    return history
