"""A small TCP fault proxy between a store client and a real server (loopback only).

It listens on 127.0.0.1 (a free port), forwards every connection to the
server, and on demand:

* :meth:`FaultProxy.drop_reply` -- forwards the next request that contains
  every marker (a command name, a script's SHA) to the server, throws away the
  server's reply and cuts the connection: the server ran the command, the
  client never hears it did (what a connection dropped at the wrong moment
  does);
* :meth:`FaultProxy.cut` -- cuts every open connection now;
* ``delay`` -- seconds each chunk waits before it is forwarded.

It runs in the test's own event loop (anyio), next to the client.
"""

from __future__ import annotations

import anyio
import anyio.abc


class _Link:
    __slots__ = ("client", "drop_next", "server")

    def __init__(self, client: anyio.abc.SocketStream, server: anyio.abc.SocketStream) -> None:
        self.client = client
        self.server = server
        self.drop_next = False


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target``, with faults on demand."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.delay = 0.0
        self.dropped = 0  # replies thrown away
        self.cuts = 0  # connections cut
        self._markers: list[tuple[bytes, ...]] = []
        self._links: set[_Link] = set()
        self._scope: anyio.CancelScope | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def drop_reply(self, *markers: bytes) -> None:
        """Throw away the reply to the next request containing every marker, then cut."""
        self._markers.append(markers)

    async def cut(self) -> None:
        """Cut every open connection (clients see a reset or EOF)."""
        for link in tuple(self._links):
            await self._close(link)

    async def _close(self, link: _Link) -> None:
        if link in self._links:
            self._links.discard(link)
            self.cuts += 1
        with anyio.CancelScope(shield=True):
            await link.client.aclose()
            await link.server.aclose()

    async def _up(self, link: _Link) -> None:
        """Client to server."""
        try:
            async for chunk in link.client:
                if self.delay:
                    await anyio.sleep(self.delay)
                for markers in self._markers:
                    if all(marker in chunk for marker in markers):
                        self._markers.remove(markers)
                        link.drop_next = True
                        break
                await link.server.send(chunk)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        await self._close(link)

    async def _down(self, link: _Link) -> None:
        """Server to client."""
        try:
            async for chunk in link.server:
                if link.drop_next:
                    self.dropped += 1
                    break  # the server answered; the client never hears it
                if self.delay:
                    await anyio.sleep(self.delay)
                await link.client.send(chunk)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        await self._close(link)

    async def _serve(self, client: anyio.abc.SocketStream) -> None:
        try:
            server = await anyio.connect_tcp("127.0.0.1", self.target)
        except OSError:
            await client.aclose()
            return
        link = _Link(client, server)
        self._links.add(link)
        async with anyio.create_task_group() as group:
            group.start_soon(self._up, link)
            group.start_soon(self._down, link)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Listen until :meth:`stop`; ``task_status.started()`` once the port is known."""
        with anyio.CancelScope() as scope:
            self._scope = scope
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
            async with listener:
                self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
                task_status.started()
                await listener.serve(self._serve)

    async def stop(self) -> None:
        await self.cut()
        if self._scope is not None:
            self._scope.cancel()
