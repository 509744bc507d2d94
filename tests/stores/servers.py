"""Redis servers the tests start on their own free ports, and stop by PID.

Each :class:`RedisServer` is a real ``redis-server`` process (the machine's,
found on PATH) with persistence off unless asked for (``--save ""
--appendonly no``): pausing it (SIGSTOP), restarting it with or without its
data, demoting it to a replica, and filling it to ``maxmemory`` are what
the fault tests do to it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 and a port of its own.

    Args:
        workdir: its working directory (AOF files land there).
        args: extra server arguments (``["--maxmemory", "1mb"]``).
        appendonly: keep an append-only file (``appendfsync always``), so a
            restart keeps the data.
    """

    def __init__(self, workdir: Path, *args: str, appendonly: bool = False) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.args = list(args)
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A blocking client for the test's own commands (fill, corrupt, inspect)."""
        return redis.Redis(port=self.port, socket_timeout=10)

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not on PATH"
        self.workdir.mkdir(parents=True, exist_ok=True)
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.appendonly
            else ["--appendonly", "no"]
        )
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
                str(self.workdir),
                *persistence,
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with self.client() as probe:
                    if probe.ping():
                        return self
            except redis.exceptions.RedisError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        """Kill the process (SIGKILL by PID: nothing is saved) and wait for it."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)

    def restart(self) -> None:
        """Kill and start again on the same port: without AOF, every key is gone."""
        self.stop()
        self.start()

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)
