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
only here. :func:`rename_call_ids` applies it to a whole item list;
:class:`~turnloom.context.TurnHistory` applies it incrementally, turn by turn.
"""

from __future__ import annotations

__all__ = (
    "CallEvent",
    "CallIdRenamer",
    "Rewriter",
    "record_renames",
    "register_rewriter",
    "rename_call_ids",
    "rewrite_call_ids",
)

from collections.abc import Callable, Sequence

from turnloom.context._untrack import untrack_container
from turnloom.context.gateway import GatewayType, NativeContent

CallEvent = tuple[str, str] | str | None
"""What a rewriter reported to a renamer, in order: ``(call_id, base)`` for a
call (``base`` the id after the provider's ``fix``), a result's ``call_id``, or
None where a call group ended. The events of an item list depend only on the
items, never on the renamer's state, so replaying them
(:meth:`CallIdRenamer.replay`) from any state gives the ids a renaming of the
items from that state gives."""


class CallIdRenamer:
    """The state of the renaming rule after some items of one request.

    A rewriter reports, item by item in request order, the calls
    (:meth:`call`) and results (:meth:`result`) it finds and the points where
    a call group ends (:meth:`end_group`), and writes back the ids returned.
    A call after a result, or after :meth:`end_group`, opens a new call group.

    Not thread-safe: one renamer is used by one thread at a time. Use
    :meth:`copy` to continue from a state while keeping it.

    Attributes:
        renamed: how many calls this state renamed so far.
    """

    __slots__ = ("_counters", "_group", "_in_results", "_seen", "renamed")

    def __init__(self) -> None:
        self._seen: set[str] = set()
        untrack_container(self._seen)  # strings only: no cycle can pass through it
        self._counters: dict[str, int] = {}
        # The current call group: original id -> new ids, in call order (an id
        # twice in one group gets two, consumed in order by its results).
        self._group: dict[str, list[str]] = {}
        self._in_results = False
        self.renamed = 0

    def copy(self) -> CallIdRenamer:
        """An independent renamer in the same state (copies of its sets and maps)."""
        other = CallIdRenamer()
        other._seen = set(self._seen)
        untrack_container(other._seen)
        other._counters = dict(self._counters)
        other._group = {k: list(v) for k, v in self._group.items()}
        other._in_results = self._in_results
        other.renamed = self.renamed
        return other

    def __contains__(self, call_id: object) -> bool:
        """True when ``call_id`` is present in the items seen so far (after renaming)."""
        return call_id in self._seen

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
        if base in seen:
            n = self._counters.get(base, 1)
            while True:
                n += 1
                new_id = f"{base}_r{n}"
                if new_id not in seen:
                    break
            self._counters[base] = n
            self.renamed += 1
        elif base != call_id:
            self.renamed += 1
        seen.add(new_id)
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
            self._seen.add(call_id)
            return call_id
        return new_ids.pop(0) if len(new_ids) > 1 else new_ids[0]

    def end_group(self) -> None:
        """The current call group ends (an input message, text after the results)."""
        self._group = {}
        self._in_results = False

    def replay(self, events: Sequence[CallEvent]) -> tuple[str, ...]:
        """Apply recorded events (see :func:`record_renames`); the ids they are sent with.

        Advances this state exactly as renaming the recorded items from it
        would, and returns the id of each call and result, in order (what
        :func:`rewrite_call_ids` writes back), without visiting the items.
        """
        ids: list[str] = []
        for event in events:
            if event is None:
                self.end_group()
            elif type(event) is str:
                ids.append(self.result(event))
            else:
                ids.append(self._call(*event))
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
        counters = self._counters
        if counters:
            for call_id in dropped._seen:
                base, sep, number = call_id.rpartition("_r")
                if call_id in counters or (sep and number.isdigit() and base in counters):
                    return False
        self._seen.difference_update(dropped._seen)
        return True


class _Recording(CallIdRenamer):
    """A renamer that also records the events it is given, and the ids it returns."""

    __slots__ = ("events", "ids")

    def __init__(self, state: CallIdRenamer) -> None:
        super().__init__()
        self._seen = state._seen
        self._counters = state._counters
        self._group = state._group
        self._in_results = state._in_results
        self.renamed = state.renamed
        self.events: list[CallEvent] = []
        self.ids: list[str] = []

    def call(self, call_id: str, fix: Callable[[str], str] | None = None) -> str:
        base = call_id if fix is None else fix(call_id)
        self.events.append((call_id, base))
        new_id = self._call(call_id, base)
        self.ids.append(new_id)
        return new_id

    def result(self, call_id: str) -> str:
        self.events.append(call_id)
        new_id = super().result(call_id)
        self.ids.append(new_id)
        return new_id

    def end_group(self) -> None:
        self.events.append(None)
        super().end_group()

    def settle(self, state: CallIdRenamer) -> None:
        """Write the scalar state back into ``state`` (its set and maps are shared)."""
        state._group = self._group
        state._in_results = self._in_results
        state.renamed = self.renamed


class _Scripted(CallIdRenamer):
    """Hands out given ids, in order, to a rewriter (the state of no rule)."""

    __slots__ = ("_ids",)

    def __init__(self, ids: Sequence[str]) -> None:
        super().__init__()
        self._ids = iter(ids)

    def call(self, call_id: str, fix: Callable[[str], str] | None = None) -> str:
        return next(self._ids)

    def result(self, call_id: str) -> str:
        return next(self._ids)

    def end_group(self) -> None:
        pass


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


def record_renames(
    kind: GatewayType, items: Sequence[NativeContent], renamer: CallIdRenamer
) -> tuple[list[NativeContent], tuple[CallEvent, ...], tuple[str, ...]]:
    """:func:`rename_call_ids` from ``renamer`` (advanced), recording what it did.

    Returns:
        the renamed items (as :func:`rename_call_ids`), the events the
        gateway's rewriter reported (replay them with
        :meth:`CallIdRenamer.replay` to rename the same items from another
        state without visiting them), and the id each call and result got.
    """
    recording = _Recording(renamer)
    out = rename_call_ids(kind, items, recording)
    recording.settle(renamer)
    return out, tuple(recording.events), tuple(recording.ids)


def rewrite_call_ids(
    kind: GatewayType, items: Sequence[NativeContent], ids: Sequence[str]
) -> list[NativeContent]:
    """``items`` with the calls and results of their events sent with ``ids``, in order.

    ``ids`` are what :meth:`CallIdRenamer.replay` returned for the items'
    recorded events: the result equals renaming the items from the state
    replayed. Each item is the same object unless an id changed.
    """
    return rename_call_ids(kind, items, _Scripted(ids))
