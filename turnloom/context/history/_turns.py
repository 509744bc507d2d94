"""The held turns of a history: an immutable sequence that changes in O(sqrt turns) pointers.

A history's turns change at every commit (a turn appended), every record (the
newest turn replaced), every eviction (turns dropped at the front) and, more
rarely, at an earlier position (a late record, kept state, sent ids) or at the
front (a summary replacing the oldest turns). A view taken of the history
keeps the turns it was taken with, so the turns are never changed in place:
each change makes a new :class:`_Turns`. Kept as one tuple, every such change
copied every turn (about 3 ns a turn, several times per committed turn, on
the event loop). A :class:`_Turns` holds them in blocks of at most
:data:`BLOCK` turns, each an immutable tuple, every block but the first and
the last full: a change copies the blocks it touches and the tuple of
blocks, ``O(BLOCK + turns / BLOCK)`` pointers, and shares every other block
with the sequence it was made from (and with every view holding that one).
Reading a turn by position is O(1), iterating (either way) runs in C, a
slice is a new tuple of the turns it holds.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import TYPE_CHECKING, overload

import msgspec

from turnloom.context.history._cells import _Turn

_SHIFT = 6
BLOCK = 1 << _SHIFT
"""Most turns in one block: 64, so 2,500 turns are 40 blocks (a change copies ~100 pointers)."""
_MASK = BLOCK - 1

_chain = chain.from_iterable


if TYPE_CHECKING:

    class _Base(Sequence[_Turn]):
        """What a type checker reads: a sequence of turns made of its three fields."""

        def __init_subclass__(cls, **options: object) -> None: ...

        def __init__(
            self, blocks: tuple[tuple[_Turn, ...], ...], first: int, size: int
        ) -> None: ...

else:
    _Base = msgspec.Struct


class _Turns(_Base, gc=False, eq=False, frozen=True):
    """An immutable sequence of turns, oldest first, changed by making new ones.

    ``blocks``: the turns in blocks (tuples), oldest first; none empty, every
    one but the first and the last holding :data:`BLOCK` turns. ``first``:
    how many the first block holds (0 when there is none). ``size``: how
    many turns in all. Indexing takes an int (negative from the end; raises
    ``IndexError`` out of range, as a tuple does) or a slice (returns a
    tuple). Equality is identity: a change makes a new ``_Turns``, so
    ``is`` tells whether the turns changed.

    A struct out of the cyclic collector (``gc=False``): it holds ints and
    tuples of turns, which are out of it themselves and never refer to a
    ``_Turns`` (they are made before any sequence holding them), so it can
    be in no cycle, and a full collection visits no block of it. (A
    ``Sequence`` to a type checker, registered as one at run time.)
    """

    blocks: tuple[tuple[_Turn, ...], ...]
    first: int
    size: int

    @classmethod
    def of(cls, turns: Iterable[_Turn]) -> _Turns:
        """``turns`` held in full blocks (O(turns))."""
        held = tuple(turns)
        if not held:
            return EMPTY
        if len(held) <= BLOCK:
            return cls((held,), len(held), len(held))
        blocks = tuple(held[at : at + BLOCK] for at in range(0, len(held), BLOCK))
        return cls(blocks, BLOCK, len(held))

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def __iter__(self) -> Iterator[_Turn]:
        return _chain(self.blocks)

    def __reversed__(self) -> Iterator[_Turn]:
        return _chain(map(reversed, reversed(self.blocks)))

    def __repr__(self) -> str:
        return f"_Turns({tuple(self)!r})"

    def __contains__(self, value: object) -> bool:
        return any(value in block for block in self.blocks)

    def index(self, value: object, start: int = 0, stop: int = sys.maxsize) -> int:
        """The position of the first turn equal to ``value`` (``ValueError`` when none)."""
        return tuple(self).index(value, start, stop)

    def count(self, value: object) -> int:
        """How many turns equal ``value``."""
        return sum(block.count(value) for block in self.blocks)

    def _locate(self, index: int) -> tuple[int, int]:
        """The block of turn ``index`` (0 <= index < size) and its place in the block."""
        if index < self.first:
            return 0, index
        index -= self.first
        return 1 + (index >> _SHIFT), index & _MASK

    @overload
    def __getitem__(self, index: int) -> _Turn: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[_Turn, ...]: ...

    def __getitem__(self, index: int | slice) -> _Turn | tuple[_Turn, ...]:
        if type(index) is int:
            at = index + self.size if index < 0 else index
            if at < self.first:
                if at < 0:
                    raise IndexError("tuple index out of range")
                return self.blocks[0][at]
            if at >= self.size:
                raise IndexError("tuple index out of range")
            at -= self.first
            return self.blocks[1 + (at >> _SHIFT)][at & _MASK]
        if type(index) is slice:
            start, stop, step = index.indices(self.size)
            return self._between(start, stop) if step == 1 else tuple(self)[index]
        return self[operator.index(index)]

    def _between(self, start: int, stop: int) -> tuple[_Turn, ...]:
        """Turns ``start`` to ``stop - 1`` as a tuple (O(them + the blocks they span))."""
        if start >= stop:
            return ()
        blocks = self.blocks
        if stop <= self.first:
            return blocks[0][start:stop]
        block, at = self._locate(start)
        last, end = self._locate(stop - 1)
        if block == last:
            return blocks[block][at : end + 1]
        return (*blocks[block][at:], *_chain(blocks[block + 1 : last]), *blocks[last][: end + 1])

    def appended(self, turn: _Turn) -> _Turns:
        """These turns, then ``turn`` (O(BLOCK + blocks))."""
        blocks = self.blocks
        if not blocks:
            return _Turns(((turn,),), 1, 1)
        last = blocks[-1]
        if len(last) == BLOCK:
            return _Turns((*blocks, (turn,)), self.first, self.size + 1)
        if len(blocks) == 1:
            return _Turns(((*last, turn),), self.first + 1, self.size + 1)
        return _Turns((*blocks[:-1], (*last, turn)), self.first, self.size + 1)

    def replaced(self, position: int, turn: _Turn) -> _Turns:
        """These turns, ``turn`` in place of turn ``position`` (0 <= position < size)."""
        if not 0 <= position < self.size:
            raise IndexError("tuple index out of range")
        blocks = self.blocks
        block, at = self._locate(position)
        held = blocks[block]
        changed = (*held[:at], turn, *held[at + 1 :])
        return _Turns((*blocks[:block], changed, *blocks[block + 1 :]), self.first, self.size)

    def dropped(self, count: int) -> _Turns:
        """These turns but the oldest ``count`` (0 <= count; O(BLOCK + blocks))."""
        if count <= 0:
            return self
        if count >= self.size:
            return EMPTY
        blocks = self.blocks
        block, at = self._locate(count)
        head = blocks[block][at:]
        return _Turns((head, *blocks[block + 1 :]), len(head), self.size - count)

    def popped(self) -> _Turns:
        """These turns but the newest (a non-empty sequence; O(BLOCK + blocks))."""
        if self.size <= 1:
            return EMPTY
        blocks = self.blocks
        last = blocks[-1]
        if len(last) == 1:
            return _Turns(blocks[:-1], self.first, self.size - 1)
        if len(blocks) == 1:
            return _Turns((last[:-1],), self.first - 1, self.size - 1)
        return _Turns((*blocks[:-1], last[:-1]), self.first, self.size - 1)

    def prepended(self, turn: _Turn) -> _Turns:
        """``turn``, then these turns (O(BLOCK + blocks))."""
        blocks = self.blocks
        if not blocks:
            return _Turns(((turn,),), 1, 1)
        if self.first == BLOCK:
            return _Turns(((turn,), *blocks), 1, self.size + 1)
        return _Turns(((turn, *blocks[0]), *blocks[1:]), self.first + 1, self.size + 1)


Sequence.register(_Turns)

EMPTY = _Turns((), 0, 0)
"""No turns (a new history's)."""
