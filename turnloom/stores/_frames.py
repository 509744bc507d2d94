"""The frame each store puts around a record: its position in the log and a checksum.

A framed record is ``MAGIC (4 bytes) | position (8 bytes, big-endian) |
crc32 (4 bytes, big-endian) | data``, the checksum taken over the position
and the data. Reading a log checks every frame: a checksum that does not
match (a flipped byte), or a position that is not the record's index (a
record missing, duplicated or moved before it), is a
:class:`~turnloom.errors.StoreRecordError` naming the context and the index,
never a silently different history.

Logs written before frames (record schema version 2 without a frame) still
read: the magic starts with byte ``0xc1``, which MessagePack never uses, so
an unframed record is told apart from a framed one. Unframed records are
accepted only before the first framed one of a log (an older turnloom wrote
them, this one appended after them); their positions and bytes cannot be
checked. A compaction rewrites the whole log framed. An older turnloom
reading a framed log refuses it (its records do not decode:
``StoreRecordError``), it never misreads it.
"""

from __future__ import annotations

__all__ = ("frame", "frames", "unframe_log")

import struct
import zlib
from collections.abc import Iterable, Sequence

from turnloom.errors import StoreRecordError, excerpt

MAGIC = b"\xc1TL1"
_HEAD = struct.Struct(">QI")
_SIZE = len(MAGIC) + _HEAD.size


def _crc(position: int, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(position.to_bytes(8, "big")))


def frame(position: int, data: bytes) -> bytes:
    """The stored bytes of ``data`` at log ``position``."""
    return MAGIC + _HEAD.pack(position, _crc(position, data)) + data


def frames(start: int, records: Iterable[bytes]) -> list[bytes]:
    """The frames of ``records`` written from log position ``start`` on."""
    return [frame(start + i, data) for i, data in enumerate(records)]


def unframe_log(context_id: str, stored: Sequence[bytes]) -> tuple[bytes, ...]:
    """The records of a stored log, every frame checked; O(bytes).

    Raises:
        StoreRecordError: a frame's checksum does not match, its position is
            not its index, it is cut short, or an unframed record follows a
            framed one; ``index`` names the first such record.
    """
    out: list[bytes] = []
    framed = False
    for index, blob in enumerate(stored):
        blob = bytes(blob)
        if not blob.startswith(MAGIC):
            if framed:
                raise StoreRecordError(
                    f"Record {index} of context {excerpt(context_id)} has no frame, but an "
                    "earlier record has one; the log is damaged.",
                    context_id=context_id,
                    index=index,
                )
            out.append(blob)  # written before frames: nothing to check
            continue
        framed = True
        if len(blob) < _SIZE:
            raise StoreRecordError(
                f"Record {index} of context {excerpt(context_id)} is cut short "
                f"({len(blob)} bytes); the log is damaged.",
                context_id=context_id,
                index=index,
            )
        position, crc = _HEAD.unpack_from(blob, len(MAGIC))
        data = blob[_SIZE:]
        if _crc(position, data) != crc:
            raise StoreRecordError(
                f"Record {index} of context {excerpt(context_id)} does not match its "
                "checksum; the log is damaged.",
                context_id=context_id,
                index=index,
            )
        if position != index:
            raise StoreRecordError(
                f"Record {index} of context {excerpt(context_id)} was written at position "
                f"{position}; records are missing or out of place before it.",
                context_id=context_id,
                index=index,
            )
        out.append(data)
    return tuple(out)
