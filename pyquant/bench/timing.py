"""Timers: device events (GPU tiers), host perf_counter (CPU tier), and a fake for tests.

A timer runs `fn(i)` (i = call number, used by the caller to rotate weight copies) and
returns one duration per timed call in seconds; `measure` turns that into a median over
enough calls. The fake timer replaces the whole measurement (`measure(case) -> seconds`)
so that the golden protocol and the CLI can be driven without a library or a device.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

# Timed calls per measurement: at least MIN_REPS, at most MAX_REPS, else as many as fit in
# the time budget. The median of >= 10 calls ignores the odd preempted call.
MIN_REPS = 10
MAX_REPS = 200
WARMUP = 3


class HostTimer:
    """perf_counter around each call; the CPU tier runs synchronously, so that is the time."""

    kind = "host perf_counter"

    def time_calls(self, fn: Callable[[int], object], reps: int, first: int = 0) -> list[float]:
        out = []
        for i in range(first, first + reps):
            t0 = time.perf_counter()
            fn(i)
            out.append(time.perf_counter() - t0)
        return out

    def synchronize(self) -> None:
        pass


class EventTimer:
    """Device events recorded on the stream around each call (pyquant Context events).

    Python spends tens of microseconds building each launch, which is as long as a decode
    kernel runs. If the stream were idle, the start event would fire at once and the stop
    event only after the host finished enqueuing, timing the host. So before each group
    of calls the timer enqueues `backlog(stream)` (a large device copy): the host enqueues
    the whole group while the device is still busy, and each start event fires right when
    the previous call ends.

    The timer checks that this held: an event before the backlog gives how long the device
    was busy with it; when the host took longer than that to enqueue the group, the
    group's times are thrown away and the backlog is doubled (up to MAX_BACKLOG copies).
    `starved` counts groups kept although the host was still slower (then at the cap).
    """

    kind = "device events"
    GROUP = 8          # calls enqueued behind one backlog
    MAX_BACKLOG = 16   # backlog copies at most, per group

    def __init__(self, ctx, stream=None, backlog: Callable[[object], None] | None = None):
        self.ctx = ctx
        self.stream = stream
        self.backlog = backlog
        self.backlog_copies = 1
        self.starved = 0
        self.host_s_per_call = 0.0  # host time to enqueue one call, last group

    def _group(self, fn, first: int, g: int):
        """(times of calls first..first+g-1, host enqueue seconds, backlog device seconds)."""
        events = [(self.ctx.event(), self.ctx.event()) for _ in range(g)]
        mark = self.ctx.event()
        mark.record(self.stream)
        if self.backlog is not None:
            for _ in range(self.backlog_copies):
                self.backlog(self.stream)
        t0 = time.perf_counter()
        for j, (start, stop) in enumerate(events):
            start.record(self.stream)
            fn(first + j)
            stop.record(self.stream)
        host_s = time.perf_counter() - t0
        events[-1][1].synchronize()
        busy_s = mark.elapsed_ms(events[0][0]) * 1e-3
        return [start.elapsed_ms(stop) * 1e-3 for start, stop in events], host_s, busy_s

    def time_calls(self, fn: Callable[[int], object], reps: int, first: int = 0) -> list[float]:
        out = []
        i = first
        while i < first + reps:
            g = min(self.GROUP, first + reps - i)
            times, host_s, busy_s = self._group(fn, i, g)
            self.host_s_per_call = host_s / g
            if self.backlog is not None and host_s > busy_s:
                if self.backlog_copies < self.MAX_BACKLOG:
                    self.backlog_copies *= 2
                    continue  # the device waited for the host: redo the group
                self.starved += 1
            out += times
            i += g
        return out

    def synchronize(self) -> None:
        self.ctx.synchronize(self.stream)


def measure(timer, fn: Callable[[int], object], budget_s: float = 0.5,
            min_reps: int = MIN_REPS, max_reps: int = MAX_REPS, warmup: int = WARMUP) -> float:
    """Median seconds per call of fn after a warm-up, over as many calls as fit in budget_s."""
    warm = timer.time_calls(fn, warmup)
    timer.synchronize()
    per_call = max(statistics.median(warm), 1e-7)
    reps = int(min(max_reps, max(min_reps, budget_s / per_call)))
    return statistics.median(timer.time_calls(fn, reps, first=warmup))


class FakeTimer:
    """A deterministic stand-in for a measurement: `measure(case) -> seconds`.

    model(case, call) gives the time of the call-th measurement of that case (0, 1, ...),
    so a test can script noise (a spike on one call) and real changes (every call slower)
    per case. `calls` counts how often each case was measured.
    """

    def __init__(self, model: Callable[[object, int], float]):
        self.model = model
        self.calls: dict[tuple, int] = {}

    def measure(self, case) -> float:
        n = self.calls.get(case.key, 0)
        self.calls[case.key] = n + 1
        return float(self.model(case, n))


class FakeRunner:
    """A runner (see runner.py) built on a FakeTimer: no library, no device, no peers.

    It lets tests drive `pyquant.bench.main(argv, runner=...)` end to end, including the
    exit status of --compare.
    """

    backend = "fake"

    def __init__(self, timer: FakeTimer, device: str = "fake device",
                 copy_Bps: float = 1e12, flop_peak: float | None = 1e14, peers=None):
        self.timer = timer
        self.device = device
        self.copy_Bps = copy_Bps
        self.flop_peak = flop_peak
        self.flop_source = "fake"
        self._peers = peers or (lambda case: {})
        self.timer_kind = "fake"

    def machine(self):
        from .roofline import Machine
        return Machine(self.device, self.backend, self.copy_Bps, "fake", self.flop_peak, self.flop_source)

    def measure(self, case) -> float:
        return self.timer.measure(case)

    def peers(self, case) -> dict[str, float]:
        return self._peers(case)

    def close(self) -> None:
        pass
