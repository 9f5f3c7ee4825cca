"""Golden record / compare protocol (pure: it only sees a `measure(case) -> seconds` callable).

A golden is a time that was measured three times and agreed with itself. Timings on a
shared machine are noisy, so one measurement is never trusted on its own:

record  : every case is measured REPEATS times. The entry is `reproducible` when the
          spread (max - min) / min of those measurements is within the noise band; the
          median is written either way, but an entry with `reproducible: false` is never
          used as truth by `compare`.
compare : every case with a reproducible golden is measured once. If it moved by more than
          the band, it is measured RERUNS more times and a regression (or improvement) is
          reported only when the median of the re-runs is still beyond the band on the same
          side, i.e. at least two of three re-runs agree with the first sighting. Everything
          else that moved is listed as noise.

The band is relative: 0.03 means 3 % of the golden time.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import Callable, Iterable, Sequence

# 3 %: run-to-run spread of a median-of-many device-event timing on an otherwise idle GPU
# is about 1 %, so 3 % leaves room for clock boost variation without hiding a real change.
GPU_NOISE_BAND = 0.03
# 10 %: the CPU tier shares its cores with everything else on the machine (two cores on CI);
# host timers there routinely move by several percent between runs.
CPU_NOISE_BAND = 0.10
REPEATS = 3
RERUNS = 3

# Outcome of one case in `compare`.
OK = "ok"                    # within the band of a trusted golden
REGRESSION = "regression"    # slower beyond the band, reproduced by the re-runs
IMPROVEMENT = "improvement"  # faster beyond the band, reproduced by the re-runs
NOISE = "noise"              # moved beyond the band once, the re-runs did not confirm it
UNTRUSTED = "untrusted"      # the golden entry itself was not reproducible: not compared
NEW = "new"                  # no golden entry for this case
SKIPPED = "skipped"          # measure() raised Unsupported: this build or device cannot run it

KEY_FIELDS = ("family", "format", "variant", "m", "n", "k")


def case_key(obj) -> tuple:
    """Identity of a row or a case: (family, format, variant, m, n, k)."""
    if isinstance(obj, dict):
        return tuple(obj[f] for f in KEY_FIELDS)
    return tuple(getattr(obj, f) for f in KEY_FIELDS)


def spread(times: Sequence[float]) -> float:
    """Relative spread (max - min) / min of repeated measurements."""
    lo = min(times)
    if lo <= 0:
        raise ValueError(f"a measured time must be positive, got {lo}")
    return (max(times) - lo) / lo


class Unsupported(Exception):
    """Raised by measure(case) when the case cannot run here (the build or the device lacks
    the kernel): the case is left out of a record and reported as SKIPPED by compare."""


@dataclasses.dataclass
class Recorded:
    case: object
    times_s: list[float]
    median_s: float
    reproducible: bool


def record(cases: Iterable, measure: Callable[[object], float], band: float,
           repeats: int = REPEATS, progress: Callable[[object], None] | None = None,
           on_skip: Callable[[object, str], None] | None = None) -> list[Recorded]:
    """Measure each case `repeats` times; reproducible when the spread is within `band`.

    A case whose measure raises Unsupported is left out (and passed to on_skip)."""
    out = []
    for case in cases:
        try:
            times = [float(measure(case)) for _ in range(repeats)]
        except Unsupported as e:
            if on_skip is not None:
                on_skip(case, str(e))
        else:
            out.append(Recorded(case, times, statistics.median(times), spread(times) <= band))
        if progress is not None:
            progress(case)
    return out


@dataclasses.dataclass
class Compared:
    case: object
    outcome: str                     # OK, REGRESSION, IMPROVEMENT, NOISE, UNTRUSTED, NEW, SKIPPED
    golden_s: float | None
    first_s: float | None            # the first measurement (None when not measured)
    rerun_s: list[float]             # the re-runs (empty when the first one was within the band)
    note: str = ""                   # why a case was SKIPPED

    @property
    def current_s(self) -> float | None:
        """Best estimate of the current time: median of the re-runs, else the first one."""
        if self.rerun_s:
            return statistics.median(self.rerun_s)
        return self.first_s

    @property
    def change(self) -> float | None:
        """Relative change of current_s against the golden (+0.25 = 25 % slower)."""
        if self.golden_s is None or self.current_s is None:
            return None
        return self.current_s / self.golden_s - 1.0


def _side(t: float, golden: float, band: float) -> int:
    """+1 slower than the band allows, -1 faster, 0 within the band."""
    if t > golden * (1.0 + band):
        return 1
    if t < golden * (1.0 - band):
        return -1
    return 0


def compare(cases: Iterable, golden_rows: Iterable[dict], measure: Callable[[object], float],
            band: float, reruns: int = RERUNS,
            progress: Callable[[object], None] | None = None) -> list[Compared]:
    """Compare the current timing of each case with its golden row (see the module doc).

    golden_rows are golden-schema rows (median_us, reproducible, and the KEY_FIELDS).
    Cases without a golden row are measured once and reported as NEW.
    """
    by_key = {case_key(r): r for r in golden_rows}
    out = []
    for case in cases:
        try:
            out.append(_compare_one(case, by_key.get(case_key(case)), measure, band, reruns))
        except Unsupported as e:
            row = by_key.get(case_key(case))
            out.append(Compared(case, SKIPPED, None if row is None else row["median_us"] * 1e-6,
                                None, [], str(e)))
        if progress is not None:
            progress(case)
    return out


def _compare_one(case, row, measure, band, reruns) -> Compared:
    if row is None:
        return Compared(case, NEW, None, float(measure(case)), [])
    if not row.get("reproducible", False):
        # Never used as truth: do not even spend time measuring it.
        return Compared(case, UNTRUSTED, row["median_us"] * 1e-6, None, [])
    golden = row["median_us"] * 1e-6
    first = float(measure(case))
    side = _side(first, golden, band)
    if side == 0:
        return Compared(case, OK, golden, first, [])
    again = [float(measure(case)) for _ in range(reruns)]
    confirmed = _side(statistics.median(again), golden, band) == side
    outcome = (REGRESSION if side > 0 else IMPROVEMENT) if confirmed else NOISE
    return Compared(case, outcome, golden, first, again)


def has_regression(results: Iterable[Compared]) -> bool:
    return any(r.outcome == REGRESSION for r in results)


def load(path) -> dict:
    """Read a golden file and check the fields compare relies on."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path}: not a golden file (expected an object with a 'rows' list)")
    for i, row in enumerate(doc["rows"]):
        _check_row(path, i, row)
    return doc


def _check_row(path, i: int, row) -> None:
    """A golden row compare can use: the key fields, a positive finite median_us, a
    boolean reproducible (or null: one measurement, untrusted); anything else is named,
    never a traceback mid-run."""
    from .cases import FAMILIES
    where = f"{path}: row {i}"
    if not isinstance(row, dict):
        raise ValueError(f"{where} is {type(row).__name__}, not an object")
    missing = [f for f in KEY_FIELDS + ("median_us", "reproducible") if f not in row]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}")
    if row["family"] not in FAMILIES:
        raise ValueError(f"{where}: family {row['family']!r} is not one of {', '.join(FAMILIES)}")
    for f in ("format", "variant"):
        if not isinstance(row[f], str):
            raise ValueError(f"{where}: {f} {row[f]!r} is not a string")
    for f in ("m", "n", "k"):
        v = row[f]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{where}: {f} {v!r} is not a positive integer")
    t = row["median_us"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise ValueError(f"{where}: median_us {t!r} is not a positive number")
    if row["reproducible"] is not None and not isinstance(row["reproducible"], bool):
        raise ValueError(f"{where}: reproducible {row['reproducible']!r} is not true, false or "
                         "null (a single run's row: not checked, never used as truth)")
