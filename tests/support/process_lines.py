"""A child process's stdout read line by line, as it comes (the CLI tests that watch a process)."""

from __future__ import annotations

import trio


class Lines:
    """A process's stdout as lines; each :meth:`next` is bounded by the caller's deadline."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream, self._buffer = stream, b""

    async def next(self) -> str:
        """The next line, without its newline. Raises EOFError when the process ended first."""
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            if not chunk:
                raise EOFError(f"the process ended; unread: {self._buffer!r}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()
