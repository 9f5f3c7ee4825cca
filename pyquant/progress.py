"""One-line progress for long work: the benchmark's cases, loading or repacking a
multi-GB checkpoint, quantizing a large weight with the reference quantizer.

On a terminal the line is redrawn in place (stderr). Elsewhere (a log, CI) the bench
prints a line at every tenth so that a slow run shows it is alive; library calls print
nothing unless asked (progress=True), since a library that writes to a program's stderr
uninvited is a nuisance.

`progress` arguments of the library (load_gguf, load_safetensors, quantize): None (the
default) shows the line when stderr is a terminal and the work is large (LARGE_BYTES or
more: small files and tests stay quiet), True always shows it, False never.
"""
from __future__ import annotations

import sys
import time

LARGE_BYTES = 256 << 20  # below this the work takes about a second at most: no line


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


class Progress:
    """Progress over `total` units of work (cases, or bytes when unit="bytes").

    step(label, amount) after each piece; close() ends the terminal line. log_when_piped:
    when stderr is not a terminal, print a line at every tenth (the bench) or nothing."""

    WIDTH = 30

    def __init__(self, total: int, title: str = "", stream=None, unit: str = "",
                 log_when_piped: bool = True):
        self.total = max(1, total)
        self.done = 0
        self.title = title
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.log_when_piped = log_when_piped
        self.t0 = time.monotonic()
        self._last_decile = -1
        self._open = False

    def _count(self) -> str:
        if self.unit == "bytes":
            return f"{_size(self.done)}/{_size(self.total)}"
        return f"{self.done}/{self.total}"

    def step(self, label: str = "", amount: int = 1) -> None:
        self.done = min(self.total, self.done + amount)
        frac = self.done / self.total
        elapsed = time.monotonic() - self.t0
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        head = f"{self.title}: " if self.title else ""
        if self.tty:
            bar = "#" * int(frac * self.WIDTH)
            self.stream.write(f"\r{head}[{bar:<{self.WIDTH}}] {self._count()} "
                              f"{elapsed:5.0f}s eta {eta:4.0f}s {label[:50]:<50}")
            self._open = True
            if self.done >= self.total:
                self.close()
            self.stream.flush()
        elif self.log_when_piped and (self.total >= 10 or self.unit == "bytes") \
                and int(frac * 10) != self._last_decile:
            self._last_decile = int(frac * 10)
            what = "cases" if not self.unit else ""
            self.stream.write(f"{head or 'bench: '}{self._count()} {what}{', ' if what else ''}"
                              f"{elapsed:.0f}s\n")
            self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


class _Silent:
    def step(self, label: str = "", amount: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def for_work(total_bytes: int, title: str, progress: bool | None, stream=None):
    """The Progress of a library call (module docstring), or one that prints nothing."""
    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()
    if progress is None:
        progress = tty and total_bytes >= LARGE_BYTES
    if not progress:
        return _Silent()
    return Progress(total_bytes, title, stream=stream, unit="bytes", log_when_piped=True)
