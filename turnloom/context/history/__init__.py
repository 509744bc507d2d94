"""``TurnHistory``: the bounded history of one context, kept in whole turns.

A history holds the pinned instructions
(``system`` and ``developer`` messages) and a sequence of committed turns,
oldest first. A turn is its input (the committed user messages), then its
*kept state* if any (messages the host kept in place, the runtime-state pair
its model was sent: :meth:`TurnHistory.keep_state`), then its outputs (model
messages and tool results recorded while answering it). A turn renders its
kept state only once it is an earlier turn: the render of a turn's own input
never holds it.

Limits count turns, items (neutral messages), bytes (the JSON encoding of
each message, see :func:`~turnloom.context.check_message`) and, optionally,
tokens (each message counted once, when it enters, by the history's
:class:`~turnloom.context.TokenCounter`). Eviction drops
whole turns, oldest first, and never the newest turn; a turn whose input
answers tool calls of the turn before it leaves only together with that turn
(see :class:`TurnHistory`). Pinned instructions are neither evicted nor
counted. A per-item byte cap rejects one oversized message before anything
changes.

Rendering is incremental. A view (:meth:`TurnHistory.view`) is an immutable
snapshot taken in O(1), so the event loop does no work proportional to the
history. :meth:`HistoryView.render` runs in a worker thread: each message is
rendered once per gateway (its native items and their JSON encoding, which
sizes them) and cached, each turn's items are cached, and the items of the
pinned instructions and all closed turns are kept as one run that is changed
in place (evicted turns dropped at the front by moving its start, newly
closed turns appended; once a sixteenth of it is dropped it is compacted into
new containers). A render does work only for new and evicted items, and
hands the run's encoded items out without a copy (the run only appends to
the containers it handed out), so :meth:`HistoryView.render_bounded` can
promise a small, bounded step that the event loop may take.

Closed turns are kept encoded. When a turn joins the run, the run keeps its
items only as JSON bytes (one ``bytes`` object per item, shared with the
encoded request body, :class:`~turnloom.context.body.BodyRun`) and the turn's
native renders are dropped from the per-message and per-turn caches (a
message's encoding stays cached when the run holds that very object). A
render hands its items out as :class:`~turnloom.context.items.NativeItems`,
decoded on first read (:attr:`RenderedHistory.items`), so the history holds
each closed turn once, encoded, besides its messages. A rebuilt run (below)
decodes the cached encodings, or renders again the messages whose encoding
was dropped (those the run renamed).

Call ids: a history may reuse a call id in a later turn; a rendered input
carries each call id once. The history decides the id each call is sent
with once, when its message is committed (a turn's input, recorded outputs,
kept state, a summary turn), by the rule of :mod:`turnloom.context.callids`
applied to its neutral messages against the ids its kept calls are sent
with (``_sent``): a reuse of such an id is sent as ``<id>_r<n>``, the
smallest free ``n`` from 2, and the results answering it (by the pairing
rule, across turns) with it. The decision is history state, kept with each
message as the ids it is sent with, not a copy of it (``None`` while no id
of it changes, so no cost when no id repeats), never a render cache:
renders send each message with its sent ids
(:meth:`HistoryView.sent_messages`), so a cold render equals the
incremental one, and eviction only frees the evicted calls' ids
(O(evicted calls)): a retained turn's ids never change, the run is never
renamed anew, and the kept prefix stays byte-stable. A checkpoint stores
the ids (``CheckpointTurn.call_ids``, restored by :func:`restore_sent_ids`)
and a log replays to them. What a host reads (turns, messages, snapshots,
exports) holds the ids it gave. Until an id is freed the rule is the one a
gateway applies to a whole request, so a history without evictions sends
what it sent before ids were decided at commit. A reused id in a call that
pairing then leaves out (open, excluded) still counts: the next reuse is
renamed where a gateway renaming the request alone would not have.

The gateway still applies the rule to the rendered items (the run renames
each closed turn once, when it joins; the turns rendered per prepare and
the turn's input continue from the run's state,
:attr:`RenderedHistory.call_ids`). With the history's ids unique it
renames only what a provider's id ``fix`` maps together (Anthropic's
``^[a-zA-Z0-9_-]+$``: ``c.1`` and ``c_1`` both become ``c_1``) or ids inside
opaque native items. That rare rename may depend on an evicted item; then
the kept items are renamed anew after the pinned instructions: a turn
replays the call-id events recorded for it the first time (O(its calls)),
only items whose ids change are encoded again, and the encoded body is
rebuilt in one pass over the kept items, so the run always equals a render
of the kept history.

Thread safety: mutate a :class:`TurnHistory` from one thread (the event loop).
Views are immutable and may be rendered from any number of worker threads at
once: per-message and per-turn caches are filled and dropped by single
assignments (a racing render at worst recomputes a value), and the shared
run is changed only under a lock. A view older than the run renders
privately, without filling the caches.

Garbage-collector cost: neither the per-message and per-turn bookkeeping
nor (on CPython) the cached native items of open turns are tracked by
Python's cyclic collector (see the comment above ``HistoryView`` and
:func:`~turnloom.context._untrack.untrack_json`), and the run holds bytes
in untracked lists, so a held history adds a few tracked objects per
history, and no reference per message, to what a full collection visits.

The package, one job per file (imports point down the list; none up, none in
a circle):

- ``limits``: :class:`HistoryLimits`, :class:`HistoryStatistics`,
  :data:`HistoryCounts` and the batch-length check.
- ``_cells``: entries, turns and their cached renders (the cells every other
  file reads), and why they form no reference cycles.
- ``_turns``: the held turns as an immutable sequence of blocks, so a
  change copies a block, not every turn, and a view keeps the turns it was
  taken with.
- ``_plan``: the render plan of a list of turns: entries rendered as one span,
  renamed call ids, joins.
- ``_run``: the cached run of closed turns shared by a history's views, and
  its encoded body.
- ``view``: :class:`HistoryView` and :class:`RenderedHistory`.
- ``_ties``: which result answers which call across turns; the ties eviction
  keeps.
- ``_sent``: the call ids the kept messages are sent with, decided at commit.
- ``_batches``: the door's check of a batch and its memo.
- ``_evictions``: what an eviction drops, holds aside and restores.
- ``turn_history``: :class:`TurnHistory`, which owns the turns and their
  totals.
- ``_summaries``: summary compaction and pruning of old tool output
  (:func:`apply_summary`, :func:`summary_range`, :func:`prune_turns`; the
  policies are in :mod:`turnloom.context.summaries`).

The input checks of one message (:func:`check_id`,
:func:`reject_instructions`) live in :mod:`turnloom.context.message`; they
are re-exported here.
"""

from __future__ import annotations

__all__ = (
    "HistoryCounts",
    "HistoryLimits",
    "HistoryStatistics",
    "HistoryView",
    "RenderedHistory",
    "SummaryApplied",
    "TurnHistory",
    "apply_summary",
    "changeable",
    "check_batch_length",
    "check_id",
    "next_summary_id",
    "prune_turns",
    "range_snapshot",
    "reject_instructions",
    "restore_sent_ids",
    "summary_range",
)

from turnloom.context.history._sent import restore_sent_ids
from turnloom.context.history._summaries import (
    SummaryApplied,
    apply_summary,
    changeable,
    next_summary_id,
    prune_turns,
    range_snapshot,
    summary_range,
)
from turnloom.context.history.limits import (
    HistoryCounts,
    HistoryLimits,
    HistoryStatistics,
    check_batch_length,
)
from turnloom.context.history.turn_history import TurnHistory
from turnloom.context.history.view import HistoryView, RenderedHistory
from turnloom.context.message import check_id, reject_instructions
