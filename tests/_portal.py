"""A Foundation on a new SQLite store, run in a blocking portal, for a hypothesis state machine.

A ``RuleBasedStateMachine``'s rules are synchronous: they reach the Foundation
through ``portal.call``. The machine opens a :class:`PortalFoundation` in its
``initialize`` rule and closes it in ``teardown``; a machine whose
``initialize`` never ran has none to close.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

from anyio.from_thread import BlockingPortal, start_blocking_portal

from turnloom.runtime import ContextManager, Foundation
from turnloom.runtime.store import ContextStore
from turnloom.stores import open_context_store


class PortalFoundation:
    """A blocking portal on ``backend``, a new SQLite store in ``directory``, a Foundation on it.

    Entered in that order when constructed; if one fails to open, those already
    open are closed and the error propagates. ``wrap``, when given, turns the
    opened store into the one the Foundation writes through (a test's recording
    store); ``options`` go to :class:`Foundation` as keywords.

    Attributes:
        portal: the portal; ``portal.call`` runs a coroutine function on its loop.
        store: the SQLite store as opened (read it to see what was written).
        wrapped: the store the Foundation writes through (``store`` unless wrapped).
        manager: the Foundation's ContextManager.
    """

    def __init__(
        self,
        backend: str,
        directory: Path,
        *,
        wrap: Callable[[ContextStore], Any] | None = None,
        **options: Any,
    ) -> None:
        self._stack = ExitStack()
        try:
            self.portal: BlockingPortal = self._stack.enter_context(start_blocking_portal(backend))
            url = f"sqlite:{directory / f'{uuid.uuid4().hex}.db'}"
            opened = self.portal.wrap_async_context_manager(open_context_store(url))
            # The two store classes join to object here; each is a ContextStore.
            self.store = cast(ContextStore, self._stack.enter_context(opened))
            self.wrapped: Any = self.store if wrap is None else wrap(self.store)
            foundation = self.portal.wrap_async_context_manager(
                Foundation(store=self.wrapped, **options)
            )
            self.manager: ContextManager = self._stack.enter_context(foundation).manager
        except BaseException:
            self._stack.close()
            raise

    def close(self) -> None:
        """Close the Foundation (it writes what is queued), the store, then the portal.

        Each is closed even if closing the one before raised; a second call does nothing.
        """
        self._stack.close()
