"""What a command that takes a while is doing, on stderr, without touching its result on stdout.

On a terminal: one line, rewritten in place as steps start (`running`), wiped before anything else
is printed (`clear`). Anywhere else (a pipe, a CI log): no rewriting, and each finished step as a
plain line (`done`), so a log shows what was measured even when the end never comes.
"""

from __future__ import annotations

from typing import TextIO

__all__ = ["Progress"]

_WIPE = "\r\033[K"  # back to the line's start, erase to its end


class Progress:
    """Progress on `stream` (stderr); `tty` says whether it is a terminal (default: ask it)."""

    def __init__(self, stream: TextIO, tty: bool | None = None) -> None:
        self._stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self._shown = False  # a running line is on the terminal

    def running(self, text: str) -> None:
        """A step started (shown on a terminal only)."""
        if self.tty:
            self._stream.write(f"{_WIPE}  {text} ...")
            self._stream.flush()
            self._shown = True

    def done(self, line: str) -> None:
        """A step finished: a plain line when not on a terminal (there the next `running` says it)."""
        if not self.tty:
            self._stream.write(line + "\n")
            self._stream.flush()

    def clear(self) -> None:
        """Wipe the running line, before the command prints on the same terminal."""
        if self._shown:
            self._stream.write(_WIPE)
            self._stream.flush()
            self._shown = False
