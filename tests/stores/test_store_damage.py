"""Damaged stored logs are typed errors naming the context and the record, on both stores.

Invariants: each stored record carries its position and a checksum, so a
flipped byte, a deleted or a moved record is a :class:`StoreRecordError`
naming the context and the index (never a silently different history); a
log written before frames (schema version 2, unframed) still restores; and
one context whose log is not what its owner wrote fails alone: the other
contexts' flushes go on (SQLite's length column that does not match its
rows used to fail every flush of every context).
"""

from __future__ import annotations

import sqlite3
import typing

import pytest
import redis

from tests.runtime.helpers import assistant, user
from tests.stores.conftest import REDIS_URL
from tests.stores.helpers import hosting
from turnloom.context.history import HistoryLimits
from turnloom.errors import StoreError, StoreRecordError
from turnloom.runtime import ContextManager, TurnSnapshot
from turnloom.runtime._records import OutputsRecorded, TurnCommitted, encode_record
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio

LIMITS = HistoryLimits(max_turns=100)


def converse(manager: ContextManager, context_id: str, turns: range) -> None:
    """Two records per turn: the commit, then the answer."""
    for i in turns:
        manager.accept_turn(
            TurnSnapshot(context_id=context_id, turn_id=f"t{i}", input=(user(f"question {i}"),))
        )
        manager.record(context_id, f"t{i}", [assistant(f"answer {i}")])


class Raw:
    """The stored log of one context, read and changed behind the store's back."""

    def __init__(self, store_url: str, context_id: str) -> None:
        self.url = store_url
        self.context_id = context_id

    def _redis(self) -> tuple[redis.Redis, str]:
        prefix = self.url.split("prefix=")[1]
        return redis.Redis.from_url(REDIS_URL), f"{prefix}ctx:{self.context_id}:log"

    def _sqlite(self) -> sqlite3.Connection:
        return sqlite3.connect(self.url.removeprefix("sqlite:"))

    def read(self) -> list[bytes]:
        if self.url.startswith("sqlite:"):
            with self._sqlite() as db:
                rows = db.execute(
                    "SELECT data FROM turnloom_records WHERE context_id = ? ORDER BY position",
                    (self.context_id,),
                ).fetchall()
                return [bytes(r[0]) for r in rows]
        client, key = self._redis()
        with client:
            return [bytes(r) for r in typing.cast(list[bytes], client.lrange(key, 0, -1))]

    def set(self, index: int, data: bytes) -> None:
        if self.url.startswith("sqlite:"):
            with self._sqlite() as db:
                db.execute(
                    "UPDATE turnloom_records SET data = ? WHERE context_id = ? AND position = ?",
                    (data, self.context_id, index),
                )
            return
        client, key = self._redis()
        with client:
            client.lset(key, index, data)  # type: ignore[arg-type]

    def delete(self, index: int) -> None:
        if self.url.startswith("sqlite:"):
            with self._sqlite() as db:
                db.execute(
                    "DELETE FROM turnloom_records WHERE context_id = ? AND position = ?",
                    (self.context_id, index),
                )
            return
        client, key = self._redis()
        with client:
            client.lset(key, index, "--deleted--")
            client.lrem(key, 1, "--deleted--")


async def write_log(store_url: str) -> None:
    async with hosting(store_url, history_limits=LIMITS, owner="writer") as foundation:
        await foundation.manager.leases.claim("c")
        converse(foundation.manager, "c", range(3))  # 6 records
        await foundation.manager.leases.flush()


async def claim_fails_at(store_url: str, index: int, match: str) -> None:
    async with hosting(store_url, history_limits=LIMITS, owner="reader") as foundation:
        with pytest.raises(StoreRecordError, match=match) as caught:
            await foundation.manager.leases.claim("c")
        assert (caught.value.context_id, caught.value.index) == ("c", index)
        assert foundation.manager.context_ids() == ()


async def test_a_flipped_byte_in_a_record_is_a_typed_error_naming_its_index(
    store_url: str,
) -> None:
    await write_log(store_url)
    raw = Raw(store_url, "c")
    stored = raw.read()
    assert len(stored) == 6
    damaged = bytearray(stored[3])
    damaged[-3] ^= 0x01  # inside "answer 1": still valid MessagePack, another text
    raw.set(3, bytes(damaged))
    await claim_fails_at(store_url, 3, r"Record 3 of context 'c' does not match its checksum")


@pytest.mark.parametrize("index", [0, 2, 4])
async def test_a_record_deleted_from_the_middle_is_a_typed_error_naming_its_index(
    store_url: str, index: int
) -> None:
    """A deleted row used to restore a turn without its answer."""
    await write_log(store_url)
    Raw(store_url, "c").delete(index)
    await claim_fails_at(store_url, index, rf"Record {index} of context 'c' was written at")


async def test_a_log_written_before_frames_still_restores(store_url: str) -> None:
    """Schema version 2 without frames: read as it is; new records are appended framed."""
    store = open_context_store(store_url)
    async with store:
        token = await store.acquire("c", "old-turnloom", 30)
        await store.release({"c": token})
    legacy = [
        encode_record(TurnCommitted(turn_id="t0", input=(user("question 0"),))),
        encode_record(OutputsRecorded(turn_id="t0", outputs=(assistant("answer 0"),))),
    ]
    if store_url.startswith("sqlite:"):
        with sqlite3.connect(store_url.removeprefix("sqlite:")) as db:
            db.executemany(
                "INSERT INTO turnloom_records VALUES ('c', ?, ?)", list(enumerate(legacy))
            )
            db.execute("UPDATE turnloom_contexts SET length = 2 WHERE context_id = 'c'")
    else:
        client = redis.Redis.from_url(REDIS_URL)
        with client:
            client.rpush(f"{store_url.split('prefix=')[1]}ctx:c:log", *legacy)
    async with hosting(store_url, history_limits=LIMITS) as foundation:
        manager = foundation.manager
        await manager.leases.claim("c")
        assert manager.history("c").turn_ids == ("t0",)
        converse(manager, "c", range(1, 2))
        await manager.leases.flush()
    stored = Raw(store_url, "c").read()
    assert stored[:2] == legacy
    assert all(record.startswith(b"\xc1TL1") for record in stored[2:])
    async with hosting(store_url, history_limits=LIMITS) as again:
        await again.manager.leases.claim("c")
        assert again.manager.history("c").turn_ids == ("t0", "t1")
    # A record without a frame after a framed one is damage, not an old log.
    Raw(store_url, "c").set(3, legacy[1])
    await claim_fails_at(store_url, 3, r"Record 3 of context 'c' has no frame")


SQLITE_ONLY = pytest.mark.parametrize(
    "kind",
    [
        pytest.param(("sqlite", "asyncio"), id="sqlite-asyncio"),
        pytest.param(("sqlite", "trio"), id="sqlite-trio"),
    ],
)


@SQLITE_ONLY
@pytest.mark.parametrize("shift", [5, -1])
async def test_a_length_column_that_does_not_match_fails_its_context_alone(
    store_url: str, shift: int
) -> None:
    async with hosting(store_url, history_limits=LIMITS) as foundation:
        manager = foundation.manager
        reported: list[StoreError] = []
        manager.leases.on_error = reported.append
        for context_id in ("a", "b"):
            await manager.leases.claim(context_id)
            converse(manager, context_id, range(2))
        await manager.leases.flush()
        with sqlite3.connect(store_url.removeprefix("sqlite:")) as db:
            db.execute(
                "UPDATE turnloom_contexts SET length = length + ? WHERE context_id = 'a'", (shift,)
            )
        for round_ in range(2):  # the failure stays "a"'s, flush after flush
            converse(manager, "a", range(2 + round_, 3 + round_))
            converse(manager, "b", range(2 + round_, 3 + round_))
            await manager.leases.flush("b")
            with pytest.raises(StoreRecordError) as caught:
                await manager.leases.flush("a")
            assert caught.value.context_id == "a"
            assert caught.value.index == (4 if shift > 0 else 3)
        assert {type(e) for e in reported} == {StoreRecordError}
    async with hosting(store_url, history_limits=LIMITS) as again:
        await again.manager.leases.claim("b")
        assert again.manager.history("b").turn_ids == ("t0", "t1", "t2", "t3")
