"""TurnHistory: the bounded history of one context, kept in whole turns."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from turnloom.context._fresh import fresh_messages
from turnloom.context._untrack import untrack_container
from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.history._batches import (
    _UNCHECKED,
    _check_batch,
    _Checked,
    _memo,
    _output_renders,
    _rendered_items,
)
from turnloom.context.history._cells import _Entry
from turnloom.context.history._changes import _blank, _commit, _keep_state, _record
from turnloom.context.history._evictions import (
    _Aside,
    _before_evictions,
    _evict,
    _remember_evicted,
    _retract,
    _settle,
)
from turnloom.context.history._run import _Shared
from turnloom.context.history._sent import _SentIds
from turnloom.context.history._steps import _StepState
from turnloom.context.history._ties import (
    _calls_after,
)
from turnloom.context.history._turns import EMPTY, _Turns
from turnloom.context.history.limits import (
    HistoryCounts,
    HistoryLimits,
    HistoryStatistics,
    _statistics,
)
from turnloom.context.history.view import HistoryView
from turnloom.context.message import (
    Message,
    ToolCallPart,
)
from turnloom.context.tokens import ApproxTokenCounter, TokenCounter
from turnloom.errors import (
    InputError,
    InvalidArgumentError,
    UnknownTurnError,
    excerpt,
)

_DEFAULT_COUNTER = ApproxTokenCounter()


_FIRST = (0,)  # the first position alone (a one-message batch)


class TurnHistory:
    """The bounded history of one context, in whole turns.

    Pairing across turns. Tool calls and results pair over the whole retained
    history, by the rule of :class:`~turnloom.context.CallTracker`, not turn
    by turn: a result recorded late to its turn, or given as the next turn's
    input (an approval flow: the model asks, a person approves, the result
    arrives with the next turn), answers the call it follows. A turn whose
    call group is still open at its end renders once the turns after it show
    whether they answer it; until then it is rendered with each prepare
    rather than cached in the shared run.

    Eviction and calls. Eviction never separates a turn's input from the
    calls it answers: a turn whose input holds results of calls made before it
    (an approval) is *tied* to the turn before it, and eviction drops the
    oldest turn together with the turns tied to it, oldest first. The limits
    stay hard: eviction may drop more turns than a limit alone asks for,
    never keep more. The newest turn is never evicted, so the newest turn and
    the turns it is tied to must fit every limit together: a commit whose
    input would tie turns over ``max_turns``, ``max_items``, ``max_bytes`` or
    ``max_tokens``, or a record that would make them hold more than
    ``max_items`` or ``max_bytes``, is refused with
    :class:`~turnloom.errors.PairedTurnsTooLargeError` before anything
    changes (``max_tokens`` is not checked on records, as for a single turn:
    tied turns over it are kept until a turn that is not tied to them
    arrives). A record to tied turns that are no longer the newest (a model
    call's output landing after a barge-in) is held to the same limits, so a
    checkpoint, which records each turn's outputs while it is its newest turn,
    restores what the history holds. A chain of approvals (each turn answering the calls of the one
    before) is tied end to end and ends at a turn whose input answers
    nothing, such as plain user text. So no render holds a result without its
    call, and no turn's input loses results to eviction: without this rule a
    newest turn made only of results would render no input at all, which
    Anthropic and Gemini refuse. Source: seed 004 (whole-turn history
    ownership; incomplete tool-call/output pairs are excluded from the next
    model input); every provider's rule that a result follows its call.
    A change to an earlier turn never takes an answer away from a later one:
    a late record that would leave a result a later turn holds answering no
    call (an output ending the calls' group, or answering the call first) is
    refused with :class:`~turnloom.errors.StrandedResultsError`, and kept state that
    would is not kept (see :meth:`record`, :meth:`keep_state`); pairing would
    drop those results, and a later input made of them would leave its own
    turn's model input. Ties follow what the kept turns say now: a late
    record, kept state on an earlier turn or a retraction that changes what a
    later input answers ties those turns again, or unties them, so the tie
    set is always what a cold rebuild of the kept turns computes (never a tie
    without its reason).

    Calls still open when their turn is evicted are evicted with it; results
    given as turn input can answer only calls of the newest turn (or of turns
    tied to it), which are never evicted. A result recorded to a turn after
    that turn was evicted is dropped and counted in ``dropped_late_outputs``.

    Args:
        limits: the bounds; see :class:`HistoryLimits`.
        remember_evicted: how many evicted turn ids are remembered, so that late
            outputs for them are dropped (and counted) rather than rejected as
            unknown, and their ids are not reused.
        token_counter: counts each message once, when it is committed or
            recorded; ``max_tokens``, the statistics and every rendered
            ``tokens`` use that count (:class:`ApproxTokenCounter` by default).
            It must count a list as the sum of its messages, as the built-in
            counters do. Each answer is checked where it is taken
            (:func:`~turnloom.context.tokens.count_tokens`): a counter that
            raises or returns anything but an int in ``[0, MAX_TOKEN_COUNT]``
            fails the commit, record or render with
            :class:`~turnloom.errors.HostCallbackError`, nothing changed.

    Raises:
        InputError: ``remember_evicted`` is negative.
        InvalidArgumentError: ``token_counter`` has no ``count`` method.
    """

    __slots__ = (
        "_aside",
        "_blank_dropped",
        "_bytes",
        "_checked",
        "_duplicates",
        "_evicted",
        "_evicted_bytes",
        "_evicted_ids",
        "_evicted_items",
        "_evicted_tokens",
        "_forgotten",
        "_front",
        "_generation",
        "_ids",
        "_items",
        "_kept_at",
        "_late_dropped",
        "_limits",
        "_linked",
        "_message_ids",
        "_pinned",
        "_pinned_bytes",
        "_pinned_tokens",
        "_remember",
        "_retracted",
        "_sent",
        "_sequence",
        "_serial",
        "_shared",
        "_steps",
        "_tokens",
        "_turns",
        "_view",
    )

    def __init__(
        self,
        limits: HistoryLimits | None = None,
        *,
        remember_evicted: int = 1024,
        token_counter: TokenCounter | None = None,
    ) -> None:
        if remember_evicted < 0:
            raise InputError("remember_evicted must not be negative.")
        counter = _DEFAULT_COUNTER if token_counter is None else token_counter
        if not callable(getattr(counter, "count", None)):
            raise InvalidArgumentError(
                "token_counter must have a count(messages) method.", field="token_counter"
            )
        self._limits = limits if limits is not None else HistoryLimits()
        # The last two batches check_batch passed (a turn's input and its
        # instructions), newest first: their messages' sizes and, when they
        # were rendered at the door, their renders and the gateway, and the
        # state their limits were checked on. Messages are frozen, so the
        # same objects checked again (the door, then the commit or record they
        # pass) reuse their sizes and seed the render cache: each message is
        # checked, sized and rendered once, and the limits of an unchanged
        # state are not checked twice (see ``_reuse``).
        self._checked: tuple[_Checked, _Checked] = (_UNCHECKED, _UNCHECKED)
        self._remember = remember_evicted
        self._pinned: tuple[_Entry, ...] = ()
        self._pinned_bytes = 0
        self._turns: _Turns = EMPTY
        # The kept turns' ids, as keys (to None): a str-keyed dict holds about
        # half the bytes a set of as many str does (an entry is a key and a
        # value, the hash read from the str; a set's table is kept sparser).
        self._ids: dict[str, None] = {}
        self._generation = 0  # changes of a turn other than the newest
        self._items = 0
        self._bytes = 0
        self._tokens = 0
        self._pinned_tokens = 0
        self._evicted = 0  # turns evicted for good (not those held aside)
        self._front = 0  # turns dropped at the front, restored ones included: what views count
        # The turns the evictions since the newest commit dropped, while nothing
        # else changed: retracting that turn puts them back (see ``retract``).
        # None once they cannot be restored, or when no commit came since.
        self._aside: _Aside | None = None
        self._evicted_items = 0
        self._evicted_bytes = 0
        self._evicted_tokens = 0
        self._evicted_ids: OrderedDict[str, None] = OrderedDict()
        untrack_container(self._evicted_ids)  # turn ids to None only: no cycle through it
        # Serials of the kept turns tied to the turn before them: their input
        # (or a later turn's, past results-only turns) answers calls made
        # before them, so eviction never separates them (see ``evict``).
        self._linked: set[int] = set()
        untrack_container(self._linked)  # ints only: no cycle through it
        self._late_dropped = 0
        self._blank_dropped = 0
        self._duplicates = 0
        # The indexes in its batch of what the last record kept (None: all of it).
        self._kept_at: Sequence[int] | None = None
        self._retracted = 0
        self._forgotten = 0  # ids of gone turns no longer remembered
        self._serial = 0
        # message id -> (serial of its turn, message), for every held message with an id
        self._message_ids: dict[str, tuple[int, Message]] = {}
        self._sequence: int | None = None
        self._shared = _Shared(counter)
        self._sent = _SentIds()  # the kept calls' sent ids (see _sent)
        self._steps: _StepState | None = None  # the pairing state after a turn's last step
        self._view: HistoryView | None = None

    # -- reading ---------------------------------------------------------

    @property
    def limits(self) -> HistoryLimits:
        """The bounds of this history."""
        return self._limits

    @property
    def held_items(self) -> int:
        """Messages held: the kept turns' and the pinned instructions (O(1))."""
        return self._items + len(self._pinned)

    @property
    def token_counter(self) -> TokenCounter:
        """The counter every token number of this history comes from."""
        return self._shared.counter

    @property
    def turn_ids(self) -> tuple[str, ...]:
        """Ids of the kept turns, oldest first."""
        return tuple(t.turn_id for t in self._turns)

    @property
    def latest_turn_id(self) -> str | None:
        """The id of the newest turn, or None before the first commit."""
        return self._turns[-1].turn_id if self._turns else None

    def open_calls(self) -> tuple[ToolCallPart, ...]:
        """The tool calls the kept turns leave open: those a next turn's input can answer.

        Pairing follows :class:`~turnloom.context.CallTracker` over the kept turns (inputs,
        kept state and outputs), as the render pairs them: a call already answered, closed
        by a later message, or made in an evicted turn is not open. O(the newest turn and
        the results-only turns before it), in practice.

        Returns:
            the open calls, in call order; empty for an empty history (a call
            holding ``extras`` is a copy with new dicts, as a view returns). An
            open OpenAI Responses call kept opaque (a ``computer_call``, an
            ``mcp_approval_request``, ...) is the stand-in pairing tracks: its
            ``call_id`` the pairing key (``"computer_call_output call_1"``),
            its ``name`` the item type (see :mod:`turnloom.context.pairing`).
        """
        return fresh_messages(_calls_after(self._turns)[0].values())

    def has_turn(self, turn_id: str) -> bool:
        """True when ``turn_id`` is kept (committed and not evicted); O(1)."""
        return turn_id in self._ids

    def was_evicted(self, turn_id: str) -> bool:
        """True when ``turn_id`` was committed and has since been evicted (and is remembered)."""
        return turn_id in self._evicted_ids

    @property
    def sequence(self) -> int | None:
        """The sequence of the newest turn committed with one, or None."""
        return self._sequence

    @property
    def evicted_ids(self) -> tuple[str, ...]:
        """The remembered evicted turn ids, oldest first."""
        return tuple(self._evicted_ids)

    def remember_evicted(self, turn_ids: Sequence[str]) -> None:
        """Remember turn ids as evicted without ever holding them (restoring a checkpoint).

        Afterwards they behave as turns this history evicted itself: late
        outputs for them are dropped and counted, and their ids cannot be
        committed again. Only the newest ``remember_evicted`` ids are kept.

        Raises:
            InvalidMessageError: a malformed id.
            DuplicateIdError: an id is a turn this history holds; nothing changed.
        """
        _remember_evicted(self, turn_ids)

    def view(self) -> HistoryView:
        """An immutable view of the history as it is now, in O(1)."""
        view = self._view
        if view is None:
            view = self._view = HistoryView(
                self._pinned,
                self._turns,
                self._front,
                self._generation,
                self._shared,
                self.held_items,
            )
        return view

    def counts(self) -> HistoryCounts:
        """The counters a runtime sums over its histories: a plain :data:`HistoryCounts` tuple.

        The same values as :meth:`statistics`' fields, without building a
        snapshot (taken before and after every change).
        """
        # The body, not a helper's call: taken twice per change on the event loop.
        return (
            self._turns.size,  # (not len(): a Python __len__, on every change)
            self._items,
            self._bytes,
            self._tokens,
            self._evicted,
            self._evicted_items,
            self._late_dropped,
            self._blank_dropped,
            self._duplicates,
            self._retracted,
        )

    def statistics(self) -> HistoryStatistics:
        """A frozen snapshot of the counters."""
        aside = self._aside
        return _statistics(self, len(aside.turns) if aside is not None else 0)

    def over_limits(self) -> bool:
        """True when the kept turns exceed a limit and more than one turn is kept.

        :meth:`evict` may still evict nothing: the newest turn and the turns
        tied to it are never evicted.
        """
        # The body, not a helper's call: read at every record and end of a model call.
        limits = self._limits
        held = self._turns.size
        return held > 1 and (
            held > limits.max_turns
            or self._items > limits.max_items
            or self._bytes > limits.max_bytes
            or (limits.max_tokens is not None and self._tokens > limits.max_tokens)
        )

    # -- changing --------------------------------------------------------

    def check_batch(
        self,
        messages: Sequence[object],
        where: str,
        *,
        turn_id: str | None = None,
        pinned: bool = False,
        gateway: Gateway | None = None,
    ) -> tuple[int, ...]:
        """Check a batch of messages at the door; return each one's size in bytes.

        The batch's length is checked first, in O(1): a turn (its input, or
        its messages so far plus ``messages``) holds at most ``max_items``
        messages. Then each message passes
        :func:`~turnloom.context.admit_message` (the checks of
        :func:`~turnloom.context.check_message`, leaving the caller's objects
        as they are: :meth:`admitted` gives the messages the history holds
        for them) and the per-item cap, and the
        running total is checked against ``max_bytes`` (with the turn's bytes
        so far), so a batch far over a limit costs at most about ``max_bytes``
        of work before it is refused. Nothing changes but a memo: the same
        message objects checked again (the batch the door checked, then
        committed) reuse their sizes instead of being encoded again, and the
        same call on a history that did not change since returns at once.

        Pinned instructions are not counted against the history's limits, so
        for them (``pinned``) only the count is bounded (at ``max_items``)
        besides the per-item cap.

        With ``gateway``, each message of a batch that passed is then rendered
        for it (and its native items sized), so a provider rule fails here;
        the renders seed the render cache of the entries the same messages
        become when committed or recorded next (:meth:`rendered_items`
        counts them). A batch that is not ``pinned`` first gets the call ids
        it would be sent with (a reused call id renamed, as a commit, or a
        record to ``turn_id``, would decide it now), so each message renders
        once, as sent; the commit or record of the same batch in the same
        state keeps those ids and renders, and one in another state decides
        its own and keeps the renders of the messages it sends as given.

        A record to a turn tied to other turns (see :class:`TurnHistory`)
        counts the tied turns together, as eviction keeps them, whether or
        not they reach the newest turn.

        Args:
            messages: the batch, oldest first.
            where: how error messages name it (``"turn 't1' input"``).
            turn_id: the held turn the batch is added to (a record), if any.
            pinned: the batch is a turn's new pinned instructions.
            gateway: the gateway to render the batch for, if any.

        Raises:
            TurnTooLargeError: the turn would hold more than ``max_items``
                messages or ``max_bytes`` bytes
                (:class:`~turnloom.errors.PairedTurnsTooLargeError`: the turns
                tied with it would).
            ItemTooLargeError: one message is over the per-item byte cap.
            InvalidMessageError, InvalidTextError, DuplicateIdError: a
                malformed message.
            ProviderRuleError: ``gateway`` cannot render ``messages[i]``
                (the message names it).
        """
        return _check_batch(self, messages, where, turn_id=turn_id, pinned=pinned, gateway=gateway)

    def rendered_items(self) -> int:
        """How many native items the last batch :meth:`check_batch` rendered comes to."""
        return _rendered_items(self)

    def admitted(self) -> tuple[Message, ...]:
        """The messages the history holds for the last batch :meth:`check_batch` passed.

        One per message of the batch, in order: the very object given, or a
        new message holding the private copies the check made of it (see
        :func:`~turnloom.context.admit_message`). A commit or record of
        that batch holds these; checks after the door read them rather than
        the caller's objects. Empty once the batch was committed or recorded,
        or when no batch passed.
        """
        return self._checked[0][8]

    def left_out(self, messages: Sequence[Message]) -> int:
        """How many of ``messages`` say something yet render to no native item.

        ``messages`` is a batch :meth:`check_batch` rendered for a gateway
        (the very message objects); for another batch, or one checked without
        a gateway, the answer is 0. Such a message is committed or recorded
        (another gateway may carry it) and left out of every input rendered
        for this one: an ``openai_chat`` opaque part, such as an audio
        reference without a transcript, on Anthropic, Gemini or Responses.
        A blank message (not recorded) is not counted.
        """
        return len(self.left_out_at(messages))

    def left_out_at(self, messages: Sequence[Message]) -> tuple[int, ...]:
        """The positions in ``messages`` of those :meth:`left_out` counts, in order."""
        # The body, not a helper's call: read at every record and commit on the event loop.
        if not messages:
            return ()
        renders = _memo(self, messages)[2]
        if renders is None:
            return ()
        if len(renders) == 1:  # a record's usual batch: no generator
            native = renders[0][0]
            unrendered = type(native) is tuple and not native and not _blank(messages[0])
            return _FIRST if unrendered else ()
        return tuple(
            at
            for at, (message, (native, _)) in enumerate(zip(messages, renders, strict=True))
            if type(native) is tuple and not native and not _blank(message)
        )

    @property
    def kept_at(self) -> Sequence[int] | None:
        """The positions in its batch of the messages the last :meth:`record` kept (the
        others were duplicates or blank), or None when it kept them all."""
        return self._kept_at

    def commit(
        self,
        turn_id: str,
        input: Sequence[Message],
        *,
        instructions: Sequence[Message] | None = None,
        sequence: int | None = None,
        keep_unpaired: bool = False,
    ) -> None:
        """Commit a new turn with its input; optionally replace the pinned instructions.

        Everything is validated before anything changes. Commit does not evict;
        call :meth:`evict` at a safe point. The turns evicted from then on
        until the history changes otherwise are held aside: retracting this
        turn restores them (see :meth:`retract`). Committing lets go of the
        turns held aside for the previous one; they count as evicted.

        Args:
            turn_id: the new turn's id, unique in this history.
            input: the turn's input messages, oldest first (``user`` messages,
                or ``tool`` results the host supplies); not ``system`` or
                ``developer``.
            instructions: the new pinned ``system``/``developer`` messages, or
                None to keep the current ones.
            sequence: when given, must be greater than the previous committed
                turn's sequence; lets a host detect turns arriving out of order.
            keep_unpaired: store tool results that answer no open call
                instead of refusing them (pairing leaves them out of every
                render); for rebuilding a history from records written before
                turnloom refused them (a store's log).

        Raises:
            InvalidMessageError: a malformed message or id, an input message with
                a pinned role, or an instruction with another role.
            InvalidTextError: text that is not valid UTF-8.
            ItemTooLargeError: one message is over the per-item byte cap.
            TurnTooLargeError: the input is over ``max_items`` or ``max_bytes``,
                or the instructions over ``max_items`` (checked first).
            PairedTurnsTooLargeError: the input answers tool calls of the
                newest turn (or of turns tied to it), and those turns with
                this one would be over ``max_turns``, ``max_items``,
                ``max_bytes`` or ``max_tokens`` (a subclass of
                ``TurnTooLargeError``; ``unit`` names the limit).
            DuplicateIdError: ``turn_id`` is kept or was evicted (or retracted)
                recently, or an input message has the id of a held message.
            OutOfOrderTurnError: ``sequence`` is not greater than the previous one.
            AmbiguousStepError: the input splits a model step in a shape that
                cannot be paired without guessing, or its first message would
                continue the step the newest turn ends with.
            UnpairedResultError: an input tool result answers no call the
                kept turns (then the input before it) leave open (never made,
                answered already, closed by a later message, or made in an
                evicted turn; see :meth:`open_calls`), after input text or a
                model step, or in the first kept turn. A result leading the
                input of a later turn is kept: a call recorded late to an
                earlier turn may answer it (pairing leaves it out until then);
                not a second result with the call id of one before it there.
            HostCallbackError: the token counter raised or returned a count
                that is not an int in ``[0, MAX_TOKEN_COUNT]``; nothing changed.
        """
        _commit(
            self,
            turn_id,
            input,
            instructions=instructions,
            sequence=sequence,
            keep_unpaired=keep_unpaired,
        )

    def output_renders(
        self,
        turn_id: str,
        gateway: Gateway,
        newest: int | None = None,
        renamed: dict[int, list[tuple[str, str]]] | None = None,
    ) -> dict[int, Sequence[NativeContent]]:
        """The held outputs of ``turn_id`` rendered for ``gateway``, by ``id()`` of their message.

        Each output message object the history holds (so one that passed
        :meth:`check_batch`), and the caller's object it was admitted for when
        that is another (see :meth:`admitted`), maps to its cached render, rendered and cached
        now if it was not yet (a history restored from a store). Empty when
        no turn ``turn_id`` is held. O(the turn's outputs), or O(``newest``)
        when given: only the turn's last ``newest`` outputs are mapped. The
        ids are valid while the caller holds the messages (the history holds
        them too).

        A render is of the message as sent: when its call ids are sent
        renamed, ``renamed`` (when given) maps the message's ``id()`` the same
        way to its calls' (own id, sent id) pairs, for those renamed.

        Raises:
            ProviderRuleError: ``gateway`` cannot render a held output (it
                rendered at the door unless the history was built without one).
        """
        return _output_renders(self, turn_id, gateway, newest, renamed)

    def turn_serial(self, turn_id: str) -> int:
        """The serial of the held turn ``turn_id``: unique in this history, never reused.

        Pass it to :meth:`record` so that outputs arriving after the turn is
        gone are dropped even when its id was forgotten and reused.

        Raises:
            UnknownTurnError: ``turn_id`` is not held.
        """
        for turn in reversed(self._turns):
            if turn.turn_id == turn_id:
                return turn.serial
        raise UnknownTurnError(f"Turn {excerpt(turn_id)} is not held by this context.")

    def record(
        self,
        turn_id: str,
        outputs: Sequence[Message],
        *,
        serial: int | None = None,
        keep_unpaired: bool = False,
    ) -> int:
        """Append a turn's outputs (model messages, tool results), in order.

        Empty and whitespace-only messages (an interrupted model output) are
        not recorded, and counted. A message whose id the turn already holds
        with equal content (an output committed twice) is not stored again,
        and counted. Outputs for a turn no longer held are *late*: dropped and
        counted; they never bring the turn back. A turn is known to be gone
        when its id is remembered as evicted or retracted, when ``serial``
        names another turn than the one now holding ``turn_id`` (the id was
        reused), or when ids of gone turns were forgotten (an id never
        committed then cannot be told from one of them). Record does not
        evict; call :meth:`evict` at a safe point.

        Args:
            turn_id: the turn the outputs belong to.
            outputs: the messages, oldest first.
            serial: the turn's :meth:`turn_serial`, when the caller kept it.
            keep_unpaired: as :meth:`commit`'s.

        Returns:
            how many messages were recorded.

        Raises:
            UnknownTurnError: ``turn_id`` was certainly never committed (no id
                of a gone turn was forgotten yet).
            InvalidMessageError, InvalidTextError: a malformed message;
                nothing was recorded.
            DuplicateIdError: a message has the id of a held message with
                other content, or of a message of another turn; nothing was
                recorded.
            AmbiguousStepError: the kept outputs continue the turn's model
                step in a shape that cannot be paired without guessing (see
                :func:`~turnloom.context.check_steps`), or a late record would
                let the next turn's first message continue its step; nothing
                was recorded.
            UnpairedResultError: a kept tool result answers no call open at
                its place (the turn's outputs so far, or the calls an earlier
                turn left open when the turn has no model step of its own):
                never made, answered already, closed by a later message, or
                made in an evicted turn; unless the turn holds only results
                and is not the first kept turn (a call recorded late to an
                earlier turn may answer it: it is kept, and left out until
                then); nothing was recorded.
            ItemTooLargeError: one message is over the per-item byte cap;
                nothing was recorded.
            TurnTooLargeError: the turn would hold more than ``max_items``
                messages or ``max_bytes`` bytes; nothing was recorded.
                :class:`~turnloom.errors.PairedTurnsTooLargeError` when the
                turn is tied to other turns (see the class docstring), newest
                or not, and the tied turns together would.
            StrandedResultsError: ``turn_id`` is not the newest turn and the
                outputs would leave a result a later turn holds answering no
                call (they end its call group, or answer its call first):
                pairing would drop it from every later model input; nothing
                was recorded. A :class:`~turnloom.errors.StateError`; its
                fields name ``turn_id``, the later turn and the results'
                call ids.
            HostCallbackError: the token counter raised or returned a count
                that is not an int in ``[0, MAX_TOKEN_COUNT]``; nothing was
                recorded.
        """
        return _record(self, turn_id, outputs, serial=serial, keep_unpaired=keep_unpaired)

    def keep_state(
        self, turn_id: str, messages: Sequence[Message], *, serial: int | None = None
    ) -> bool:
        """Keep ``messages`` as the turn's state, in place of any it kept before.

        Kept state sits between the turn's input and its outputs once the turn
        is an earlier turn of a render (a render of the turn's own input never
        holds it), so a host that sent its model per-turn state there (the
        runtime-state pair) sends the same bytes again in later inputs. It
        counts like recorded messages (items, bytes, tokens, against the
        limits) and leaves with its turn (eviction, retraction). An empty
        ``messages`` keeps none. Keeping does not evict; call :meth:`evict`
        at a safe point.

        Args:
            turn_id: the held turn.
            messages: the state messages, oldest first; messages without an id.
            serial: the turn's :meth:`turn_serial`, when the caller kept it.

        Returns:
            True when the turn is held and now keeps ``messages``; False when
            it is no longer held (evicted, retracted, or ``serial`` names
            another turn), or when a later turn holds results answering calls
            of the turn that the kept messages would end (they sit before
            those results; pairing would then drop them): nothing changed.

        Raises:
            InvalidMessageError: a malformed message, one with a pinned role or
                one with an id; nothing changed.
            InvalidTextError: text that is not valid UTF-8; nothing changed.
            ItemTooLargeError: one message is over the per-item byte cap;
                nothing changed.
            HostCallbackError: the token counter raised or returned a count
                that is not an int in ``[0, MAX_TOKEN_COUNT]``; nothing changed.
        """
        return _keep_state(self, turn_id, messages, serial=serial)

    def evict(self) -> tuple[str, ...]:
        """Once a limit is crossed, drop whole turns, oldest first, down to the low-water marks.

        Nothing happens while every limit holds; then turns go until every
        :meth:`HistoryLimits.low_water_marks` holds (the limits at 1.0).

        A turn leaves together with the later turns tied to it (their input
        answers its calls; see the class docstring), so eviction may drop more
        than a mark alone asks for. The newest turn, and the turns it is tied
        to, are never evicted: they are kept alone when over a limit (through
        records or kept state; commits and records refuse the rest).
        Pinned instructions are never evicted, and never counted against a
        limit. A summary turn (:mod:`turnloom.context.summaries`) goes last,
        only when it and the newest turn alone are over a limit. O(evicted
        turns), plus the turns tied to the newest when they stop it.

        The turns evicted while the newest turn and its kept state are all that changed
        since its commit are held aside, neither kept nor counted in ``evicted_turns``
        (:attr:`restorable_ids`), until :meth:`retract` of that turn restores them or
        another change (a commit, a record that stores a message, kept state of an
        earlier turn, :meth:`remember_evicted`, :meth:`settle_evictions`) lets them go:
        at most the turns held when that turn was committed.

        Returns:
            the ids of the evicted turns, oldest first.
        """
        return _evict(self)

    def settle_evictions(self) -> None:
        """Let go of the turns held aside (:attr:`restorable_ids`): they count as evicted now.

        For a history about to be dropped (its context removed); O(turns held aside).
        """
        _settle(self)

    @property
    def restorable_ids(self) -> tuple[str, ...]:
        """Ids of the turns a retraction of the newest turn would restore, oldest first.

        The turns the evictions since the newest commit dropped, held aside
        until the history changes otherwise (see :meth:`retract`); empty when
        there are none.
        """
        aside = self._aside
        return tuple(t.turn_id for t in aside.turns) if aside is not None else ()

    def before_evictions(self) -> tuple[HistoryView, tuple[str, ...]]:
        """The history as the evictions since the newest commit found it, for a checkpoint.

        Returns a view holding the turns held aside (:attr:`restorable_ids`)
        before the kept ones, the newest with the kept state the latest
        eviction found it with, and the evicted turn ids remembered then,
        oldest first; replaying that view, then :meth:`evict` (which evicts
        the turns held aside again: they were over the limits with that
        state), then keeping the newest turn's state now, rebuilds this
        history. Without turns held aside, :meth:`view` and
        :attr:`evicted_ids`. The view is meant to be read; it renders
        privately (as an older view). O(turns held and remembered ids).
        """
        return _before_evictions(self)

    def retract(self, turn_id: str) -> None:
        """Take back the newest turn, which produced no output (a false start).

        The turn's input leaves the history as if it had never been
        committed: the next turn's input does not hold it, and the turns the
        evictions since its commit dropped (:attr:`restorable_ids`) are held
        again, oldest first, with their outputs, kept state, ties and
        message ids, no longer remembered as evicted (the ids their
        remembering pushed out are remembered again) and not counted in
        ``evicted_turns``. The history is then what it was before the commit
        but for the turn's own id, which is remembered like an evicted
        turn's: it cannot be committed again, and outputs recorded for it
        later are dropped and counted. The sequence it carried stays used,
        and pinned instructions the commit set stay set. Turns are
        restored only while nothing but evictions and the turn's own kept
        state changed since the commit (see :meth:`evict`). O(the turns
        restored and the remembered ids) when turns are restored; the next
        render of a view rebuilds its cached run (O(history), in a worker
        thread).

        Raises:
            InvalidMessageError: a malformed id.
            UnknownTurnError: ``turn_id`` is not held.
            StateError: ``turn_id`` is not the newest turn, or outputs were
                recorded for it (it answered: record a correction instead).
        """
        _retract(self, turn_id)
