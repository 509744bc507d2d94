"""Immutable views of a history and what their renders hand out."""

from __future__ import annotations

import bisect
import gc
import itertools
from collections.abc import Sequence
from typing import cast

from turnloom.context._fresh import fresh_messages
from turnloom.context._untrack import untrack_atoms
from turnloom.context.body import BodyRun, EncodedBody
from turnloom.context.callids import (
    CallIdRenamer,
    record_renames,
    rename_call_ids,
    restore_call_ids,
)
from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.history._cells import (
    _CacheKey,
    _call_log,
    _CallLog,
    _Entry,
    _Rendered,
    _Turn,
)
from turnloom.context.history._plan import _join, _Plan, _plan, _renamed, _render_entries
from turnloom.context.history._run import _NO_SPAN, _body_run, _Run, _Shared, _untrack_run
from turnloom.context.history._sent import sent_ids
from turnloom.context.history._turns import _Turns
from turnloom.context.items import (
    NativeItems,
    decode_joined,
    encode_item,
)
from turnloom.context.message import (
    Message,
)
from turnloom.context.pairing import (
    OpenCallPolicy,
)
from turnloom.context.scope import ContextScope, scope_indices
from turnloom.errors import (
    UnknownTurnError,
    excerpt,
)


class RenderedHistory:
    """The native items of a history up to and including one turn's input.

    Attributes:
        items: tuple of NativeContent, oldest first: pinned instructions, the
            turns before the turn, then the turn's input. Decoded from
            ``native_items`` on first read (the closed turns are kept
            encoded) and kept; each read returns a new copy of them
            (:meth:`~turnloom.context.items.NativeItems.materialize`: new
            dicts and lists, shared with nothing), which the caller may change
            without changing any later render or input.
        native_items: the same items as :class:`~turnloom.context.items.NativeItems`,
            the closed turns still encoded (nothing decoded until read).
        item_count: ``len(items)``.
        bytes: serialized size of ``items`` (the sum of each item's JSON
            encoding), in bytes.
        tokens: tokens of the messages ``items`` render, by the history's
            token counter (each message counted once, when it entered).
        turn_start: index in ``items`` of the turn's first input item.
        call_ids: the call-id renaming state after ``items`` (see
            :mod:`turnloom.context.callids`): continue it over items appended
            to this input so their call ids stay unique. Owned by the caller.
        body: the gateway's request body of ``items``, with the body items
            of the pinned instructions and the closed turns kept encoded by
            the render cache (:class:`~turnloom.context.body.EncodedBody`):
            ``body.encode()`` equals
            ``msgspec.json.encode(gateway.request_body(items))`` and costs
            O(items after the cached run) plus one copy of the body's bytes.
            None for a private render (an older view,
            :meth:`HistoryView.render_scoped`) or a gateway without a body
            writer.
    """

    __slots__ = (
        "_pinned",
        "_run",
        "_tail",
        "body",
        "bytes",
        "call_ids",
        "item_count",
        "native_items",
        "tokens",
        "turn_start",
    )

    def __init__(
        self,
        pinned: _Rendered,
        tail: _Rendered,
        call_ids: CallIdRenamer,
        tokens: int,
        run: _Run | None = None,
        body: EncodedBody | None = None,
    ) -> None:
        self._pinned = pinned
        self._tail = tail  # everything after the run: unsettled turns, then the turn's input
        if run is None:
            self._run = _NO_SPAN
            native = NativeItems(pinned.items, (), tail.items)
        else:
            # The run's containers as they stand, without a copy: the run
            # only appends to them (or replaces them) while this lives.
            self._run = run.span()
            native = NativeItems(pinned.items, self._run, tail.items, run.epoch, run.origin)
        self.native_items = native
        self.item_count = len(pinned.items) + len(self._run) + len(tail.items)
        self.body = body
        self.call_ids = call_ids
        self.turn_start = 0
        self.bytes: int = pinned.bytes + self._run.size + tail.bytes
        self.tokens = tokens
        if type(self) is RenderedHistory and not any(map(gc.is_tracked, (native, body, call_ids))):
            # Its slots only ever hold two _Rendered (gc=False: see below),
            # a ChunkedSpan (bytes and ints), ints, and objects out of the
            # collector by their own proofs: its NativeItems (of those
            # renders' items), its body (a history body cache's snapshot) or
            # None, and a CallIdRenamer. Nothing it refers to can lead back to
            # it, so it can be in no cycle (a delivered prefix keeps one).
            untrack_atoms(self)

    @property
    def items(self) -> tuple[NativeContent, ...]:
        """A new copy of the items (see the class docstring), decoded on first read."""
        return self.native_items.materialize()

    def bytes_before(self, count: int) -> int:
        """Serialized size of ``items[:count]``, in bytes.

        Costs O(1) within the pinned instructions' and closed turns' items,
        else O(items after them), never a pass over the whole history.
        """
        count = max(0, min(count, self.item_count))
        pinned = self._pinned
        if count <= len(pinned.items):
            return sum(map(len, pinned.encoded[:count]))
        count -= len(pinned.items)
        run = self._run
        if count > len(run):
            inside = sum(map(len, self._tail.encoded[: count - len(run)]))
            return pinned.bytes + run.size + inside
        return pinned.bytes + run.size_before(count)


# Garbage-collector cost. A held history keeps one _Turn per turn, and per
# live turn (not yet in a run) one _Entry per message and a few _Rendered; a
# closed turn keeps one _Closed tuple instead (its messages, tokens and sent
# ids). They are msgspec Structs with ``gc=False`` (and an untracked tuple):
# the cyclic collector never tracks them, so a full collection does not visit
# them, and the tuples and dicts holding only them (a live turn's entries,
# per-slot caches) are untracked by the collector too. This is safe because
# no reference cycle can pass through them:
#
# * they refer only to messages (JSON data, untracked themselves), str, bytes
#   and int values, tuples and int-keyed dicts of each other (a turn to its
#   entries and renders, never back), and native items;
# * native items were JSON-encoded when rendered (``_render_message``) or
#   decoded from JSON, so each is a finite tree of JSON values, which cannot
#   hold a cycle or refer to anything outside itself;
# * gateways (which may refer to anything, a manager for example) are never
#   stored in them: caches are indexed by a small int slot, and the
#   slot -> gateway map lives in the (tracked) ``_Shared``;
# * none of them is reachable from outside this module except through
#   ``RenderedHistory``, which is tracked and only refers to them.
#
# Slot 0 is the first gateway (and render key) the history is rendered with,
# in practice the manager's only gateway: an entry's render goes in fields,
# with no container at all when a message renders to one item. Other slots
# use a small dict per entry; a live turn's renders are in one small dict.


class HistoryView:
    """An immutable view of a history at one moment; safe to render in a thread.

    Obtained from :meth:`TurnHistory.view` in O(1). The view keeps the turns
    it saw alive, so a later eviction does not change what it renders.

    What it returns is never shared with what the history keeps: a message
    holding a dict (``extras``, ``layout``, an opaque part's ``item``) is
    returned as a copy with new dicts (the others are frozen all through and
    returned as they are), and a render's ``items`` are new containers each
    read (see :class:`RenderedHistory`); a caller's edit of them reaches no
    later render or prepared input.
    """

    __slots__ = ("_evicted", "_generation", "_held", "_pinned", "_shared", "_turns")

    def __init__(
        self,
        pinned: tuple[_Entry, ...],
        turns: _Turns,
        evicted: int,
        generation: int,
        shared: _Shared,
        held: int = 0,
    ) -> None:
        self._pinned = pinned
        self._turns = turns
        self._held = held  # messages in the view, pinned included
        # Turns dropped at the front so far (restored ones included: a restore
        # changes turns before the newest, so it bumps the generation).
        self._evicted = evicted
        self._generation = generation  # bumped when a turn before the newest changes
        self._shared = shared

    @property
    def pinned(self) -> tuple[Message, ...]:
        """The pinned instruction messages, in order (see the class docstring: copies)."""
        return fresh_messages(e.message for e in self._pinned)

    @property
    def turn_ids(self) -> tuple[str, ...]:
        """Ids of the turns in the view, oldest first."""
        return tuple(t.turn_id for t in self._turns)

    def turn_messages(self, turn_id: str) -> tuple[Message, ...]:
        """The input then output messages of ``turn_id``, in order.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        for turn in self._turns:
            if turn.turn_id == turn_id:
                return fresh_messages(turn.recorded())
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")

    def turn_input(self, turn_id: str) -> tuple[Message, ...]:
        """The input messages of ``turn_id``, in order.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        for turn in reversed(self._turns):
            if turn.turn_id == turn_id:
                return fresh_messages(turn.messages(False))
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")

    def turn_state(self, turn_id: str) -> tuple[Message, ...]:
        """The kept state messages of ``turn_id`` (see :meth:`TurnHistory.keep_state`), or ().

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        for turn in reversed(self._turns):
            if turn.turn_id == turn_id:
                state = turn.state
                return fresh_messages(e.message for e in state) if state else ()
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")

    def render(
        self, gateway: Gateway, turn_id: str, *, open_calls: OpenCallPolicy = "exclude"
    ) -> RenderedHistory:
        """Render the pinned instructions, the turns before ``turn_id`` and its input.

        The outputs of ``turn_id`` itself are not included: they are the
        continuation of the turn's model calls (see ``ContextManager.build``);
        neither is its kept state. Each turn before it is its input, its kept
        state, then its outputs.
        The retained turns and the turn's input are paired as one input
        (see the class docstring of :class:`TurnHistory`): the items equal
        ``complete_pairs(input_messages(turn_id), open_calls=open_calls)``
        rendered message by message. When a render raises (a gateway error,
        a MemoryError), the shared render cache is dropped, so the next
        render equals a cold one.

        Args:
            gateway: the provider to render for.
            turn_id: the turn whose model input is being prepared.
            open_calls: what to do with calls left without a result.

        Returns:
            the rendered items, their byte size and where the turn's input begins.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
            ProviderRuleError: the gateway rejects a message's content.
            HostCallbackError: the token counter failed on a message the
                pairing made (a cancelled result).
        """
        return cast(RenderedHistory, self._render(gateway, turn_id, open_calls, None))

    def render_bounded(
        self,
        gateway: Gateway,
        turn_id: str,
        budget: int,
        *,
        open_calls: OpenCallPolicy = "exclude",
    ) -> RenderedHistory | None:
        """:meth:`render`, when it costs at most about ``budget`` items' worth of work; else None.

        Work is counted in items: those rendered (turns not yet in the
        cached run, and the turn's input), those decoded (turns evicted
        since the last render, to forget their call ids) and, when the
        cached run must be built, rebuilt, renamed anew or compacted, every
        item held. Nothing else a render does grows with the history (the
        run's encoded items are handed out without a copy), so a bounded
        render is a small, bounded step: one the event loop may take. A
        render of an earlier turn or an older view (a private render,
        O(history)) returns None when the view holds more than ``budget``
        items.

        Returns None before anything is rendered, or once the evicted turns
        are dropped from the cached run when only the new turns are over
        the budget (the cache stays exact: the next render continues it).

        Raises:
            as :meth:`render`.
        """
        return self._render(gateway, turn_id, open_calls, budget)

    def _render(
        self,
        gateway: Gateway,
        turn_id: str,
        open_calls: OpenCallPolicy,
        budget: int | None,
    ) -> RenderedHistory | None:
        """:meth:`render` (``budget`` None) or :meth:`render_bounded`."""
        turns = self._turns
        position = len(turns) - 1
        if position < 0 or turns[position].turn_id != turn_id:
            for position, turn in enumerate(turns):  # noqa: B007
                if turn.turn_id == turn_id:
                    break
            else:
                raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")
        key: _CacheKey = (gateway, open_calls)
        shared = self._shared
        slots = shared.slots(key)
        head = turns[position]
        # Bounded: no O(history) step (not even a tuple copy) unless the view is small.
        small = budget is None or self._held <= budget
        with shared.lock:
            run = shared.runs.get(key)
            newest = position == len(turns) - 1 and (
                run is None or (self._evicted >= run.evicted and self._generation >= run.generation)
            )
            if not newest and not small:
                return None
            if newest:
                # ``turns`` up to ``position`` are the closed turns (not copied).
                try:
                    if run is not None:
                        run = self._advance(run, turns, position, gateway, slots, budget)
                    if run is None:
                        if not small:
                            return None  # nothing changed
                        run = self._build(gateway, slots, open_calls)
                    shared.runs[key] = run
                    fresh = turns[run.turns : position]
                    if not small and sum(t.items for t in fresh) + head.items > cast(int, budget):
                        return None  # the run is exact as it stands
                    # Everything that can fail (a gateway, an area of memory)
                    # runs before the run changes.
                    plan = _plan(
                        fresh,
                        head,
                        run.carry,
                        gateway,
                        slots,
                        open_calls,
                        shared.counter,
                    )
                    logs: list[_CallLog | None] = []
                    settled, tail, call_ids = plan.rename(gateway, run.call_ids, logs)
                    self._append(run, turns, plan, settled, logs, slots)
                    # The run's containers are handed out as they stand (no copy).
                    rendered = RenderedHistory(
                        run.pinned,
                        tail,
                        call_ids,
                        run.tokens + tail.tokens,
                        run,
                        run.body.snapshot(tail.items) if run.body is not None else None,
                    )
                except BaseException:
                    # The run may be half changed: drop it; the next render rebuilds it.
                    shared.runs.pop(key, None)
                    raise
        if not newest:
            # An older view (or an earlier turn): rendered privately, the caches
            # read but neither filled nor changed.
            closed = turns[:position]
            call_ids = CallIdRenamer()
            pinned = _renamed(
                _render_entries(self._pinned, gateway, slots[0], open_calls, shared.counter),
                gateway,
                call_ids,
            )
            plan = _plan(closed, head, (), gateway, slots, open_calls, shared.counter, False)
            settled, tail, call_ids = plan.rename(gateway, call_ids)
            tail = _join([*settled, tail])
            tokens = pinned.tokens + tail.tokens
            rendered = RenderedHistory(pinned, tail, call_ids, tokens)
        rendered.turn_start = rendered.item_count - len(plan.head.items) + plan.head.lead
        return rendered

    def render_scoped(
        self,
        gateway: Gateway,
        turn_id: str,
        scope: ContextScope,
        *,
        open_calls: OpenCallPolicy = "exclude",
    ) -> RenderedHistory:
        """Render the sliced view of what :meth:`render` renders for ``turn_id``.

        ``scope`` selects among the turns' messages: those of the turns before
        ``turn_id`` then its input, indexed from 0 in that order (the list
        :meth:`scope_messages` returns). The pinned instructions and the
        turn's own input are always kept. The kept messages are then paired
        as one input, as :meth:`render` pairs (across turns), so a call whose
        result the scope left out is excluded or cancelled (by
        ``open_calls``) and a result whose call it left out is dropped.

        Renders privately: the shared run and the per-turn renders that
        :meth:`render` reuses are neither read nor changed (only per-message
        renders, which do not depend on the scope, are shared). Call ids are
        made unique over the sliced view by the same renaming rule. Kept state
        (:meth:`TurnHistory.keep_state`) is not part of the sliced view: a
        scope indexes and renders recorded messages only. A scope that keeps
        every message of a history without kept state renders what
        :meth:`render` renders.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
            PositionalScopeError: a scope without ``indices`` asked a
                positional scope's ``matches``.
            ProviderRuleError: the gateway rejects a message's content.
            HostCallbackError: the token counter failed on a message the
                pairing made (a cancelled result).
        """
        position = self._position(turn_id)
        turns = self._turns[:position]
        entries = [e for t in turns for e in (*t.input, *t.outputs)]
        ends = list(itertools.accumulate(t.items for t in turns))  # where each turn ends
        head = self._turns[position].input
        keep = scope_indices(scope, [e.message for e in (*entries, *head)])
        # Group the kept entries by turn, each turn's in order; cost follows the kept.
        kept_spans: list[list[_Entry]] = []
        span_at = -1
        for i in sorted(i for i in keep if 0 <= i < len(entries)):
            span = bisect.bisect_right(ends, i)
            if span != span_at:
                kept_spans.append([])
                span_at = span
            kept_spans[-1].append(entries[i])
        kept_spans.append(list(head))  # the turn's input, whole
        shared = self._shared
        slots = shared.slots((gateway, open_calls))
        counter = shared.counter
        call_ids = CallIdRenamer()
        pinned = _renamed(
            _render_entries(self._pinned, gateway, slots[0], open_calls, counter),
            gateway,
            call_ids,
        )
        # Each turn's kept messages as a throwaway turn, so the render caches
        # of the history's own turns are not touched; paired as one input.
        spans = [
            _Turn.of("", tuple(e), (), 0, sum(x.tokens for x in e), 0) for e in kept_spans[:-1]
        ]
        own = self._turns[position]
        head_turn = _Turn.of(own.turn_id, own.input, (), 0, 0, 0)
        plan = _plan(spans, head_turn, (), gateway, slots, open_calls, counter)
        settled, tail, call_ids = plan.rename(gateway, call_ids)
        body = _join([*settled, tail]) if settled else tail
        tokens = pinned.tokens + body.tokens
        rendered = RenderedHistory(pinned, body, call_ids, tokens)
        rendered.turn_start = rendered.item_count - len(plan.head.items) + plan.head.lead
        return rendered

    def messages(self) -> tuple[Message, ...]:
        """Every kept turn's input then outputs, oldest first (pinned excluded)."""
        return fresh_messages(m for t in self._turns for m in t.recorded())

    def scope_messages(self, turn_id: str) -> tuple[Message, ...]:
        """The messages a scope of :meth:`render_scoped` indexes, in order.

        The turns before ``turn_id`` (input then outputs), then its input.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        position = self._position(turn_id)
        out = [m for t in self._turns[:position] for m in t.recorded()]
        out.extend(self._turns[position].messages(False))
        return fresh_messages(out)

    def _position(self, turn_id: str) -> int:
        for position in range(len(self._turns) - 1, -1, -1):
            if self._turns[position].turn_id == turn_id:
                return position
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")

    def input_messages(self, turn_id: str) -> tuple[Message, ...]:
        """The messages a render of ``turn_id`` is made of, before pairing, as the host gave them.

        The pinned instructions, every message of the turns before
        ``turn_id`` (its input, kept state, then outputs), then its input,
        oldest first. Call ids are those the host gave; :meth:`sent_messages`
        gives the same messages with the ids they are sent with.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        return self._input_messages(turn_id, False)

    def sent_messages(self, turn_id: str) -> tuple[Message, ...]:
        """:meth:`input_messages` as the history sends them: renamed call ids in place.

        A call whose id a kept call was already sent with when it was
        committed is sent renamed, and the results answering it with it
        (see the ``turnloom.context.history`` package docstring, "Call ids"). Rendering
        ``complete_pairs(sent_messages(t))`` message by message, with call
        ids renamed by ``rename_call_ids`` over the whole list (which then
        renames only what a gateway's ``fix`` maps together), gives exactly
        :meth:`render`'s items: a cold render, without any cache. Equal to
        :meth:`input_messages` while no kept id repeats.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        return self._input_messages(turn_id, True)

    def _input_messages(self, turn_id: str, sent: bool) -> tuple[Message, ...]:
        out = [e.wire if sent else e.message for e in self._pinned]
        for turn in self._turns:
            if turn.turn_id == turn_id:
                out.extend(turn.wire_messages(False) if sent else turn.messages(False))
                return fresh_messages(out)
            out.extend(turn.wire_messages(True) if sent else turn.messages(True))
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")

    def sent_call_ids(self, turn_id: str) -> tuple[str, ...]:
        """The id each call and result of ``turn_id`` is sent with, or () when all are their own.

        In the order of the turn's input, outputs, then kept state (a
        checkpoint's order; ``turnloom.context.history.restore_sent_ids``
        gives them back to a rebuilt history). O(the turn's messages).

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        return sent_ids(self._turns[self._position(turn_id)])

    def _build(self, gateway: Gateway, slots: tuple[int, int], policy: OpenCallPolicy) -> _Run:
        call_ids = CallIdRenamer()
        pinned = _renamed(
            _render_entries(self._pinned, gateway, slots[0], policy, self._shared.counter),
            gateway,
            call_ids,
        )
        run = _Run(self._pinned, pinned, self._evicted, self._generation, call_ids)
        run.body = _body_run(gateway, run)
        _untrack_run(run)
        return run

    def _advance(
        self,
        run: _Run,
        closed: _Turns,
        position: int,
        gateway: Gateway,
        slots: tuple[int, int],
        budget: int | None = None,
    ) -> _Run | None:
        """Drop the turns evicted since the run was built: the run to use, or None.

        ``closed[:position]`` are the view's closed turns. None when the kept
        turns render differently without the evicted ones (the caller builds
        a new run); a new run when only their call ids do
        (:meth:`_renamed_anew`); else ``run``, changed in place. With a
        ``budget`` (see :meth:`render_bounded`) under the items held, a step
        over it (those two, rebuilding the body, compacting, decoding more
        evicted items) is not taken: None is returned, ``run`` unchanged.
        """
        small = budget is None or self._held <= budget
        dropped = self._evicted - run.evicted
        kept = run.turns - dropped
        if not small and run.compaction_due():
            return None
        if (
            run.pinned_entries is not self._pinned
            or run.generation != self._generation
            or not 0 <= kept <= position
            # Turns only change at the end (the generation counts other
            # changes), so the last kept turn being the same object means the
            # whole kept run is this view's prefix.
            or (kept and closed[kept - 1] is not run.last)
            # The first kept turn answered calls of an evicted turn: without
            # them its results are orphans, so its render changes.
            or (dropped and kept and run.turn_carried[run.dead + dropped])
        ):
            return None
        if dropped:
            count = run.ends(dropped - 1)[0] - run.origin
            if budget is not None and not small and count > budget:
                return None
            evicted_ids = CallIdRenamer()
            rename_call_ids(gateway.type, run.natives(0, dropped), evicted_ids)
            if not run.call_ids.can_forget(evicted_ids):
                # A rename of a kept item depended on an evicted one: a render
                # of the kept turns alone renames differently, so their call
                # ids are renamed anew (see _renamed_anew).
                return self._renamed_anew(run, dropped, closed, gateway, slots) if small else None
            first_kept = run.first_tag + dropped
            drop = run.body.plan_drop(first_kept, evicted_ids) if run.body is not None else None
            # Without a plan the kept body differs from the cached one (a
            # turn merged across the cut, say): rebuilt from the kept items, once.
            rebuild = run.body is not None and drop is None
            if rebuild and not small:
                return None
            run.call_ids.forget(evicted_ids)
            if drop is not None:
                cast(BodyRun, run.body).apply_drop(drop)
            elif rebuild:
                run.body = None
            run.first_tag = first_kept
            run.drop_turns(dropped)
            if small and run.compaction_due():
                run.compact()
            run.evicted = self._evicted
            if not kept:
                run.carry = ()  # the calls it carried were evicted with their turn
                run.last = None
            if rebuild:
                run.body = _body_run(gateway, run)
        return run

    def _renamed_anew(
        self,
        run: _Run,
        dropped: int,
        closed: _Turns,
        gateway: Gateway,
        slots: tuple[int, int],
    ) -> _Run:
        """A run of ``run``'s turns after the first ``dropped``, their call ids renamed anew.

        Only valid when the kept turns render as they did (the caller checked
        that nothing but the evicted call ids changes them): each kept turn
        is renamed from scratch after the pinned instructions, as a cold
        render of the kept turns renames it. A turn without a log (its items
        carry their own ids) is decoded and renamed while its log is
        recorded. A turn with a :class:`_CallLog` replays its call-id events
        (O(its calls), no pass over its items); when the ids it replays are
        those it has, it is kept as it is: its chunk, item sizes and log
        copied with the other such turns (:meth:`_Run.add_kept`), never
        decoded or cut. One whose ids change
        has the items that carry ids (its log's ``carriers``) decoded, the
        new ids written into them and those that change encoded again; the
        others keep their bytes. The encoded body is built in one pass of
        the body writer, which decodes a turn's chunk only when it does not
        pass its items through
        (:meth:`~turnloom.context.body.BodyWriter.passes_through`). No
        message is rendered again.
        """
        kind = gateway.type
        call_ids = CallIdRenamer()
        rename_call_ids(kind, run.pinned.items, call_ids)  # renamed: unchanged
        new = _Run(self._pinned, run.pinned, self._evicted, self._generation, call_ids)
        kept = dropped  # turns kept as they are from here, not yet added (one copy of them all)
        for index in range(dropped, run.turns):
            calls = run.calls[run.dead + index]
            encoded: Sequence[bytes]
            carriers: Sequence[int]
            if calls is None:  # its items carry their own ids: renamed, recorded
                encoded = run.encodings(index)
                items = run.natives(index, index + 1)
                found: list[int] = []
                written, events, ids = record_renames(kind, items, call_ids, found)
                calls = _call_log(events, ids, found)
                carriers = range(len(items))
            else:
                ids = call_ids.replay(calls.packed)  # reads the events only
                if ids == calls.ids:  # the turn stays as it is, undecoded
                    continue
                # Only the items that carry ids are decoded and renamed.
                carriers = calls.carriers
                encoded = run.encodings(index)
                items = decode_joined(b",".join([encoded[i] for i in carriers]))
                written = restore_call_ids(kind, items, ids)
                calls = _call_log(calls.events, ids, carriers)
            new.add_kept(run, kept, index)
            kept = index + 1
            chunk = run.turn_chunk(index)
            changed = list(encoded)
            anew = False  # an item's encoding changed: the turn is joined anew
            for at, new_item, item in zip(carriers, written, items, strict=True):
                if new_item is not item and new_item != item:
                    changed[at] = encode_item(new_item)
                    anew = True
            if anew:
                encoded = changed
            joined = new.add(
                encoded,
                sum(map(len, encoded)),
                run.turn_tokens[run.dead + index],
                bool(run.turn_carried[run.dead + index]),
                calls,
                None if anew else chunk,
            )
            if anew:
                closed[index - dropped].release(slots, (joined,))
        new.add_kept(run, kept, run.turns)
        new.seal_blocks()  # before its body is built, which shares its blocks
        if run.body is not None:
            new.body = _body_run(gateway, new)
        if new.turns:
            new.last, new.carry = run.last, run.carry
        _untrack_run(new)
        return new  # else no turn is kept: none is last, no call is carried

    def _append(
        self,
        run: _Run,
        closed: _Turns,
        plan: _Plan,
        renders: list[_Rendered],
        logs: list[_CallLog | None],
        slots: tuple[int, int],
    ) -> None:
        """Append the plan's settled turns, renamed (``renders``, recorded in ``logs``), to the run.

        ``closed`` holds them after the run's turns. Each joins the run
        encoded, and its native renders leave the caches (:meth:`_Turn.release`).
        """
        if not plan.settled:
            return
        reuse = run.turns
        joined = closed[reuse : reuse + plan.settled]
        for turn, rendered, renamed, log in zip(joined, plan.renders, renders, logs, strict=False):
            chunk = run.join(renamed, bool(rendered.key[0]), log)
            turn.release(slots, (chunk,))
        run.last = joined[-1]
        run.carry = plan.carry
