"""Switching a SQLite file to WAL mode when other processes open it too."""

from __future__ import annotations

import sqlite3
from time import monotonic, sleep


def enter_wal(connection: sqlite3.Connection, timeout: float) -> None:
    """Switch ``connection``'s file to WAL mode, waiting up to ``timeout`` seconds.

    SQLite answers a journal-mode change that meets another connection's
    lock with SQLITE_BUSY at once, without calling its busy handler (seen
    when several processes open a new file together), so the change is
    tried again every 5 ms until ``timeout`` seconds have passed.

    Raises:
        sqlite3.OperationalError: the file stayed busy past ``timeout``, or
            any other failure of the change (not retried).
    """
    deadline = monotonic() + timeout
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or monotonic() >= deadline:
                raise
        sleep(0.005)
