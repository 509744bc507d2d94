"""Unique call ids within one request: the renaming rule every gateway uses.

A history may reuse a call id in a later model turn: recorded OpenAI Chat
traffic does (37 of the 150 tau-bench airline trajectories), and turnloom
pairs calls and results by position, so each result still answers its own
call. Providers that match results to calls by id do not: OpenAI Responses
rejects a request in which two ``function_call`` items share a ``call_id``
("Duplicate function_call_output for call_id ..."), Anthropic rejects a
reused ``tool_use`` id. A request must therefore carry each call id once.

The rule (:class:`CallIdRenamer`), applied to a request's items oldest first:

* the first occurrence of a call id keeps it;
* a later call reusing an id present earlier in the request gets
  ``<id>_r<n>``, with ``n`` the next number of a counter kept per id
  (starting at 2) and advanced past any candidate already present;
* the results that answer a renamed call (those after it, in its call group)
  get the same new id;
* a new id never equals an id present before it; an id present after it that
  equals it is a reuse there, and is renamed in its turn;
* where a provider restricts the characters of an id (Anthropic:
  ``^[a-zA-Z0-9_-]+$``), its rewriter passes a ``fix`` function that maps an
  id to an allowed one; a call whose id it changes is renamed to the fixed id
  (then ``<fixed>_r<n>`` when that is present already), and its results with it.

A renamed id depends only on the items before it, never on those after, so
renaming an input and then appending to it leaves the renamed prefix byte for
byte as it was: the prefix a provider caches stays stable while only appends
happen. An input whose call ids are unique is returned unchanged.

Each gateway supplies how its native items carry calls and results (a
*rewriter*, registered with :func:`register_rewriter`); the rule itself lives
only here. :func:`rename_call_ids` applies it to a whole item list.

A :class:`~turnloom.context.TurnHistory` applies the same rule once, to its
neutral messages, when they are committed, and keeps the ids it decided
through evictions (see the ``turnloom.context.history`` package docstring,
"Call ids"): there
an id freed by an evicted call may be taken again (the smallest free
``_r<n>``), which within one request, where nothing leaves, is the counter
above. Its renders carry unique ids already, so the renaming a gateway
applies to them changes only what the provider's ``fix`` maps together (or
ids inside opaque native items); only that rare rename can depend on an
evicted item and make the history's cached run rename its kept items anew.
"""

from __future__ import annotations

__all__ = (
    "CallEvents",
    "CallIdRenamer",
    "Rewriter",
    "record_renames",
    "register_rewriter",
    "rename_call_ids",
    "reported_call_ids",
    "restore_call_ids",
)

import sys
from collections.abc import Callable, Sequence

import msgspec

from turnloom.context._untrack import untrack_atoms
from turnloom.context.gateway import GatewayType, NativeContent

_MISSING: object = object()

CallEvents = tuple[str, ...]
"""What a rewriter reported to a renamer, in order, packed in one flat tuple of
strings: ``events[0]`` holds one letter per event, and the strings each event
needs follow in order. ``c``: a call whose id needs no fix (its ``call_id``);
``C``: a call whose id the provider's ``fix`` changes (``call_id``, then the
fixed ``base``); ``r``: a result (its ``call_id``); ``e``: the end of a call
group (no string). No events: ``()``. The events of an item list depend only
on the items, never on the renamer's state, so replaying them
(:meth:`CallIdRenamer.replay`) from any state gives the ids a renaming of the
items from that state gives. Packed so a history that keeps them per turn
holds one tuple and one short string per turn, not a tuple per call."""


class _Layers(msgspec.Struct, gc=False):
    """A str-keyed map that copies in O(log n): frozen layers shared by copies, an owned top.

    Changes go to the top, a plain dict. :meth:`copy` first freezes the top
    as a layer, merged with the newest layers while they are no more than
    twice its size, then shares the frozen layers, which are never changed
    again (across threads too): each entry is copied O(log n) times over the
    copies made, a map never copied is one dict, and there are O(log n)
    layers. A lookup reads the top, then the layers newest first. ``None``
    values are tombstones: they hide older values and are dropped once
    merged into the oldest layer.

    Out of the cyclic collector (``gc=False``): it holds only a tuple of
    dicts and a dict, each of str to str, int, True or None, which can reach
    no object but those atoms, so nothing it refers to leads back to it (a
    held history and every prefix keep some). CPython leaves such dicts
    untracked, and untracks the tuple of them at its first collection.
    """

    frozen: tuple[dict[str, object], ...] = ()  # replaced, never changed (copies share it)
    top: dict[str, object] = msgspec.field(default_factory=dict)

    def get(self, key: str) -> object:
        """The value of ``key``, or None."""
        value = self.top.get(key, _MISSING)
        if value is _MISSING:
            for layer in reversed(self.frozen):
                value = layer.get(key, _MISSING)
                if value is not _MISSING:
                    break
            else:
                return None
        return value

    def set(self, key: str, value: object) -> None:
        """Set ``key`` (None hides it)."""
        self.top[key] = value

    def copy(self) -> _Layers:
        """An independent map with the same entries, sharing the frozen layers."""
        top = self.top
        if top:
            layers = list(self.frozen)
            merged = top
            while layers and len(layers[-1]) <= 2 * len(merged):
                older = dict(layers.pop())
                older.update(merged)
                merged = older
            if not layers:
                merged = {k: v for k, v in merged.items() if v is not None}
            layers.append(merged)
            self.frozen = tuple(layers)
            self.top = {}
        return _Layers(self.frozen, {})

    def present(self) -> list[str]:
        """Every key with a value, in no particular order (O(n): for small maps)."""
        frozen = self.frozen
        if not frozen:
            return [k for k, v in self.top.items() if v is not None]
        merged: dict[str, object] = {}
        for layer in frozen:
            merged.update(layer)
        merged.update(self.top)
        return [k for k, v in merged.items() if v is not None]


class CallIdRenamer:
    """The state of the renaming rule after some items of one request.

    A rewriter reports, item by item in request order, the calls
    (:meth:`call`) and results (:meth:`result`) it finds and the points where
    a call group ends (:meth:`end_group`), and writes back the ids returned.
    A call after a result, or after :meth:`end_group`, opens a new call group.

    Not thread-safe: one renamer is used by one thread at a time. Use
    :meth:`copy` to continue from a state while keeping it; a copy costs
    O(log n) in the ids seen (the states share their frozen layers).

    Attributes:
        renamed: how many calls this state renamed so far.
    """

    __slots__ = ("_counters", "_group", "_in_results", "_seen", "renamed")

    def __init__(self) -> None:
        # The ids present (True) or forgotten (None), and the last suffix number per base id.
        self._seen = _Layers()
        self._counters = _Layers()
        # The current call group: original id -> new ids, in call order (an id
        # twice in one group gets two, consumed in order by its results).
        self._group: dict[str, list[str]] = {}
        self._in_results = False
        self.renamed = 0
        if type(self) is CallIdRenamer:
            # Its slots only ever hold two untracked _Layers, a dict of str to
            # lists of str, a bool and an int: nothing it refers to can lead
            # back to it, so it can be in no cycle (a held history and every
            # prefix keep one). Subclasses keep other state and stay tracked.
            untrack_atoms(self)

    def copy(self) -> CallIdRenamer:
        """An independent renamer in the same state (O(log n), see the class docstring)."""
        # Made without __init__ (whose fresh maps would be replaced at once);
        # out of the collector for the reason __init__ gives.
        other = object.__new__(CallIdRenamer)
        untrack_atoms(other)
        other._seen = self._seen.copy()
        other._counters = self._counters.copy()
        group = self._group
        other._group = {k: list(v) for k, v in group.items()} if group else {}
        other._in_results = self._in_results
        other.renamed = self.renamed
        return other

    def __contains__(self, call_id: object) -> bool:
        """True when ``call_id`` is present in the items seen so far (after renaming)."""
        return isinstance(call_id, str) and self._seen.get(call_id) is not None

    def call(self, call_id: str, fix: Callable[[str], str] | None = None) -> str:
        """Register a call with ``call_id``; return the id it is sent with.

        Args:
            call_id: the call's id as recorded.
            fix: the provider's id rule, when it has one: maps an id to one
                it accepts (the same string when it already does).
        """
        return self._call(call_id, call_id if fix is None else fix(call_id))

    def _call(self, call_id: str, base: str) -> str:
        if self._in_results:
            self._group = {}
            self._in_results = False
        new_id = base
        seen = self._seen
        if seen.get(base) is not None:
            counters = self._counters
            n: int = counters.get(base) or 1  # type: ignore[assignment]
            while True:
                n += 1
                new_id = f"{base}_r{n}"
                if seen.get(new_id) is None:
                    break
            counters.set(base, n)
            self.renamed += 1
        elif base != call_id:
            self.renamed += 1
        seen.set(new_id, True)
        self._group.setdefault(call_id, []).append(new_id)
        return new_id

    def result(self, call_id: str) -> str:
        """Register a result answering ``call_id``; return the id it is sent with.

        A result answers the call of the current group with that id (the
        first one not yet answered when the group has two); a result that
        answers no call of the group keeps its id.
        """
        self._in_results = True
        new_ids = self._group.get(call_id)
        if not new_ids:
            if self._seen.get(call_id) is None:
                self._seen.set(call_id, True)
            return call_id
        return new_ids.pop(0) if len(new_ids) > 1 else new_ids[0]

    def end_group(self) -> None:
        """The current call group ends (an input message, text after the results)."""
        self._group = {}
        self._in_results = False

    def replay(self, events: CallEvents) -> tuple[str, ...]:
        """Apply recorded events (see :func:`record_renames`); the ids they are sent with.

        Advances this state exactly as renaming the recorded items from it
        would, and returns the id of each call and result, in order (what
        :func:`restore_call_ids` writes into the items), without visiting
        the items. Costs O(events).
        """
        if not events:
            return ()
        ids: list[str] = []
        append, end_group, result, call = ids.append, self.end_group, self.result, self._call
        at = 1
        for kind in events[0]:
            if kind == "r":
                append(result(events[at]))
                at += 1
            elif kind == "c":
                call_id = events[at]
                append(call(call_id, call_id))
                at += 1
            elif kind == "C":
                append(call(events[at], events[at + 1]))
                at += 2
            else:
                end_group()
        return tuple(ids)

    def forget(self, dropped: CallIdRenamer) -> bool:
        """Remove the ids that ``dropped`` saw: items left out at the request's front.

        Exact only when no rename of the remaining items depended on the
        dropped ones: no dropped id is an id this state renamed a reuse of,
        nor one of the form ``<such id>_r<n>``. Then the state equals one built
        from the remaining items alone, and True is returned. Otherwise nothing
        changes and False is returned: rename the remaining items anew.

        Args:
            dropped: a fresh renamer advanced over the dropped items only.
        """
        if not self.can_forget(dropped):
            return False
        seen = self._seen
        for call_id in dropped._seen.present():
            if seen.get(call_id) is not None:
                seen.set(call_id, None)
        return True

    def can_forget(self, dropped: CallIdRenamer) -> bool:
        """True when :meth:`forget` of ``dropped`` is exact (then it returns True); no change."""
        counters = self._counters
        for call_id in dropped._seen.present():
            base, sep, number = call_id.rpartition("_r")
            if counters.get(call_id) is not None or (
                sep and number.isdigit() and counters.get(base) is not None
            ):
                return False
        return True


Rewriter = Callable[[NativeContent, CallIdRenamer], NativeContent]
"""A gateway's rewriter: report one native item's calls and results to the
renamer and return the item with the ids it returned (the same object when
nothing changed; never modify the item in place)."""

_REWRITERS: dict[GatewayType, Rewriter] = {}


def register_rewriter(kind: GatewayType, rewriter: Rewriter) -> None:
    """Register how ``kind``'s native items carry call ids (used by gateway modules)."""
    _REWRITERS[kind] = rewriter


def rename_call_ids(
    kind: GatewayType, items: Sequence[NativeContent], renamer: CallIdRenamer | None = None
) -> list[NativeContent]:
    """Apply the renaming rule to ``items`` of gateway ``kind``, oldest first.

    Args:
        kind: the gateway whose native items these are.
        items: the items, oldest first; never modified.
        renamer: the state after the items before ``items`` (it is advanced
            past them), or None to start a request.

    Returns:
        a new list: the items, each the same object unless an id changed.

    A gateway kind without a registered rewriter (every built-in has one)
    gets its items back unchanged.
    """
    rewrite = _REWRITERS.get(kind)
    if rewrite is None:
        return list(items)
    state = renamer if renamer is not None else CallIdRenamer()
    return [rewrite(item, state) for item in items]


class _Recorder(CallIdRenamer):
    """Records every id a rewriter reports, in order; renames nothing."""

    __slots__ = ("ids",)

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []

    def call(self, call_id: str, fix: Callable[[str], str] | None = None) -> str:
        self.ids.append(call_id)
        return call_id

    def result(self, call_id: str) -> str:
        self.ids.append(call_id)
        return call_id

    def end_group(self) -> None:
        pass


class _Recording(CallIdRenamer):
    """Renames from a given state (shared, then settled back), recording events and ids."""

    __slots__ = ("ids", "kinds", "strings")

    def __init__(self, state: CallIdRenamer) -> None:
        super().__init__()
        self._seen = state._seen
        self._counters = state._counters
        self._group = state._group
        self._in_results = state._in_results
        self.renamed = state.renamed
        self.kinds: list[str] = []  # one letter per event (see CallEvents)
        self.strings: list[str] = [""]  # the events' strings, after a slot for the letters
        self.ids: list[str] = []

    def call(self, call_id: str, fix: Callable[[str], str] | None = None) -> str:
        base = call_id if fix is None else fix(call_id)
        if base == call_id:
            self.kinds.append("c")
            self.strings.append(call_id)
        else:
            self.kinds.append("C")
            self.strings += (call_id, base)
        new_id = self._call(call_id, base)
        self.ids.append(new_id)
        return new_id

    def result(self, call_id: str) -> str:
        self.kinds.append("r")
        self.strings.append(call_id)
        new_id = super().result(call_id)
        self.ids.append(new_id)
        return new_id

    def end_group(self) -> None:
        self.kinds.append("e")
        super().end_group()

    def events(self) -> CallEvents:
        """The recorded events, packed (see :data:`CallEvents`)."""
        if not self.kinds:
            return ()
        strings = self.strings
        # Interned: turns of one shape (a call, its result) share their letters.
        strings[0] = sys.intern("".join(self.kinds))
        return tuple(strings)

    def settle(self, state: CallIdRenamer) -> None:
        """Write the state back into ``state`` (its layers are shared, changed in place)."""
        state._group = self._group
        state._in_results = self._in_results
        state.renamed = self.renamed


class _Replayer(CallIdRenamer):
    """Answers each id a rewriter reports with the next of ``ids``, in order."""

    __slots__ = ("_next",)

    def __init__(self, ids: Sequence[str]) -> None:
        super().__init__()
        self._next = iter(ids).__next__

    def call(self, call_id: str, fix: Callable[[str], str] | None = None) -> str:
        return self._next()

    def result(self, call_id: str) -> str:
        return self._next()

    def end_group(self) -> None:
        pass


def reported_call_ids(kind: GatewayType, items: Sequence[NativeContent]) -> tuple[str, ...]:
    """Every call and result id ``kind``'s rewriter finds in ``items``, in order.

    What :func:`restore_call_ids` writes back into the same items renamed.
    Renames nothing; ``()`` for a kind without a rewriter.
    """
    rewrite = _REWRITERS.get(kind)
    if rewrite is None:
        return ()
    recorder = _Recorder()
    for item in items:
        rewrite(item, recorder)
    return tuple(recorder.ids)


def record_renames(
    kind: GatewayType,
    items: Sequence[NativeContent],
    renamer: CallIdRenamer,
    carriers: list[int] | None = None,
) -> tuple[list[NativeContent], CallEvents, tuple[str, ...]]:
    """:func:`rename_call_ids` from ``renamer`` (advanced), recording what it did.

    Args:
        carriers: when given, receives the index of each item in which the
            rewriter found a call or result id, in order: the only items
            :func:`restore_call_ids` changes, so restoring ids into just
            those items (in order) gives the same items.

    Returns:
        the renamed items (as :func:`rename_call_ids`), the events the
        gateway's rewriter reported (replay them with
        :meth:`CallIdRenamer.replay` to rename the same items from another
        state without visiting them), and the id each call and result got.
    """
    recording = _Recording(renamer)
    rewrite = _REWRITERS.get(kind)
    if carriers is None or rewrite is None:
        out = rename_call_ids(kind, items, recording)
    else:
        out = []
        found = recording.ids
        for index, item in enumerate(items):
            before = len(found)
            out.append(rewrite(item, recording))
            if len(found) != before:
                carriers.append(index)
    recording.settle(renamer)
    return out, recording.events(), tuple(recording.ids)


def restore_call_ids(
    kind: GatewayType, items: Sequence[NativeContent], ids: Sequence[str]
) -> list[NativeContent]:
    """``items`` with ``ids`` written where the rewriter finds a call or result id, in order.

    ``ids`` is either ``reported_call_ids(kind, originals)`` for the items
    these were renamed from (same items, ids aside), so the result equals
    the originals, or what :meth:`CallIdRenamer.replay` returned for the
    items' recorded events, so the result equals renaming the originals
    from the state replayed. Items are never modified; an item whose ids
    are already those is returned as it is.
    """
    rewrite = _REWRITERS.get(kind)
    if rewrite is None:
        return list(items)
    replayer = _Replayer(ids)
    return [rewrite(item, replayer) for item in items]
