"""Rows in the golden schema, the printed table, the progress bar, the plot and the HTML page."""
from __future__ import annotations

import base64
import html
import io
import json
import time

from . import cases as C
from . import golden as G
from . import roofline as R
# The bench's progress line is the library's: a bar on a terminal, a line at every tenth
# of the cases in a log.
from ..progress import Progress  # noqa: F401

ROW_FIELDS = ("family", "format", "variant", "m", "n", "k", "median_us", "GBps", "TFLOPs",
              "roofline_pct", "reproducible", "peers")


def make_row(case: C.Case, seconds: float, machine: R.Machine, reproducible: bool | None,
             peers_s: dict[str, float] | None = None) -> dict:
    """One golden-schema row (DESIGN.md): times in microseconds, peers too. reproducible
    is None for a single measurement (a run, or compare's current time): not checked,
    which is neither reproducible nor not (golden.load takes it as untrusted)."""
    nbytes, flops = C.case_bytes(case), C.case_flops(case)
    return {
        "family": case.family, "format": case.format, "variant": case.variant,
        "m": case.m, "n": case.n, "k": case.k,
        "median_us": round(seconds * 1e6, 3),
        "GBps": round(nbytes / seconds / 1e9, 1),
        "TFLOPs": round(flops / seconds / 1e12, 3),
        "roofline_pct": round(R.roofline_pct(nbytes, flops, seconds, machine.copy_Bps, machine.flop_peak), 1),
        "reproducible": None if reproducible is None else bool(reproducible),
        "peers": {name: round(t * 1e6, 3) for name, t in sorted((peers_s or {}).items())},
    }


def row_case(row: dict) -> C.Case:
    return C.Case(row["family"], row["format"], row["variant"], int(row["m"]), int(row["n"]), int(row["k"]))


def document(machine: R.Machine, rows: list[dict], *, band: float, repeats: int, timer: str,
             build: str = "") -> dict:
    """The golden file: DESIGN.md's schema plus how the ceilings and times were measured."""
    return {
        "device": machine.device,
        "backend": machine.backend,
        "copy_GBps": round(machine.copy_GBps, 1),
        "bf16_TFLOPs": None if machine.flop_peak is None else round(machine.flop_TFLOPs, 2),
        "copy_source": machine.copy_source,
        "flop_source": machine.flop_source,
        "timer": timer,
        "noise_band": band,
        "repeats": repeats,
        "build": build,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": rows,
    }


def write_json(path, doc: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


# ------------------------------------------------------------------ text


def header_lines(machine: R.Machine, timer: str) -> list[str]:
    flops = ("n/a" if machine.flop_peak is None else f"{machine.flop_TFLOPs:.2f} TFLOP/s")
    return [
        f"device        : {machine.device} ({machine.backend})",
        f"copy bandwidth: {machine.copy_GBps:.1f} GB/s ({machine.copy_source})",
        f"FLOP ceiling  : {flops} ({machine.flop_source})",
        f"timer         : {timer}",
        "roofline_pct  = 100 * max(bytes / copy bandwidth, FLOPs / FLOP ceiling) / median time",
    ]


def _peer_text(row: dict) -> str:
    parts = []
    for name, us in row["peers"].items():
        parts.append(f"{name} {us:.1f}us x{us / row['median_us']:.2f}")
    return "  ".join(parts)


def table(rows: list[dict], recorded: bool = False) -> str:
    """Fixed-width table; peer ratio = peer time / our time (above 1: pyquant is faster).

    The repro column says yes / no after --record, "-" (not checked) otherwise."""
    head = ["family", "format", "variant", "m", "n", "k", "median_us", "GB/s", "TFLOP/s", "roof%", "repro"]
    body = []
    for r in rows:
        body.append([r["family"], r["format"], r["variant"], str(r["m"]), str(r["n"]), str(r["k"]),
                     f"{r['median_us']:.2f}", f"{r['GBps']:.1f}", f"{r['TFLOPs']:.3f}",
                     f"{r['roofline_pct']:.1f}",
                     ("yes" if r["reproducible"] else "no") if recorded else "-"])
    widths = [max(len(x) for x in col) for col in zip(head, *body)] if body else [len(h) for h in head]
    left = 3  # family, format, variant are left-aligned, numbers right-aligned

    def fmt(cells):
        return " ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [fmt(head) + "  peers (time, peer/ours)", fmt(["-" * w for w in widths])]
    for r, cells in zip(rows, body):
        lines.append(fmt(cells) + ("  " + _peer_text(r) if r["peers"] else ""))
    return "\n".join(lines)


def compare_summary(results: list[G.Compared], band: float) -> str:
    counts = {o: 0 for o in (G.OK, G.NOISE, G.REGRESSION, G.IMPROVEMENT, G.UNTRUSTED, G.NEW, G.SKIPPED)}
    for r in results:
        counts[r.outcome] += 1
    lines = [f"compare (noise band {band * 100:.1f} %, {G.RERUNS} re-runs of every case that moved): "
             + ", ".join(f"{n} {o}" for o, n in counts.items())]
    for r in results:
        if r.outcome in (G.OK,):
            continue
        label = r.case.label
        if r.outcome == G.SKIPPED:
            lines.append(f"  SKIPPED     {label}: cannot run here ({r.note})")
        elif r.outcome == G.UNTRUSTED:
            lines.append(f"  UNTRUSTED   {label}: golden entry not reproducible, not compared")
        elif r.outcome == G.NEW:
            lines.append(f"  NEW         {label}: {r.first_s * 1e6:.2f} us, no golden entry")
        else:
            reruns = ", ".join(f"{t * 1e6:.2f}" for t in r.rerun_s)
            lines.append(f"  {r.outcome.upper():<11} {label}: golden {r.golden_s * 1e6:.2f} us, "
                         f"first {r.first_s * 1e6:.2f} us, re-runs {reruns} us "
                         f"({r.change * 100:+.1f} %)")
    return "\n".join(lines)


# ------------------------------------------------------------------ pictures


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def _panels(rows: list[dict]):
    """Group rows into one panel per (family, n, k): moe per model, dense per shape."""
    panels = {}
    for r in rows:
        key = (r["family"], r["n"], r["k"]) if r["family"] != "moe" else ("moe", r["variant"], r["k"])
        panels.setdefault(key, []).append(r)
    return panels


def figure(rows: list[dict], machine_title: str):
    """roofline_pct against M per format (left), time against M beside the peers (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(rows)
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 3.2 * len(panels) + 0.5), squeeze=False)
    for (ax_pct, ax_t), (key, prs) in zip(axes, panels.items()):
        series = {}
        for r in prs:
            series.setdefault(f"{r['format']} {r['variant']}", []).append(r)
        peer_series = {}
        for name, srs in series.items():
            srs.sort(key=lambda r: r["m"])
            ms = [r["m"] for r in srs]
            ax_pct.plot(ms, [r["roofline_pct"] for r in srs], marker="o", label=name)
            ax_t.plot(ms, [r["median_us"] for r in srs], marker="o", label=name)
            for r in srs:
                for peer, us in r["peers"].items():
                    peer_series.setdefault(peer, {})[r["m"]] = us
        for peer, pts in peer_series.items():
            ms = sorted(pts)
            ax_t.plot(ms, [pts[m] for m in ms], linestyle="--", marker="x", label=peer)
        title = f"{key[0]} {key[1]}" + (f" x {key[2]}" if key[0] != "moe" else "")
        ax_pct.set_title(f"{title}: roofline %")
        ax_t.set_title(f"{title}: median time (us)")
        for ax in (ax_pct, ax_t):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("M (tokens)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        ax_pct.set_ylim(0, max(105, 5 + max(r["roofline_pct"] for r in prs)))
        ax_t.set_yscale("log")
    height = 3.2 * len(panels)
    fig.suptitle(machine_title)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / height))  # leave 0.5 inch for the title
    return fig


def save_plot(rows: list[dict], path, machine_title: str) -> None:
    import matplotlib.pyplot as plt
    fig = figure(rows, machine_title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _repro_note(repeats: int) -> str:
    if repeats > 1:
        return (f"reproducible: the {repeats} measurements of an entry agree within the noise "
                "band (record mode)")
    return ("reproducible: not checked, every entry is one measurement "
            "(python -m pyquant bench --record measures each case several times)")


def write_html(path, doc: dict, header: list[str], extra_text: str = "") -> None:
    """One page: the measurement header, the plot (when matplotlib is there) and the table."""
    rows = doc["rows"]
    img = "<p><i>matplotlib is not installed (pip install 'pyquant[bench]'): no plot.</i></p>"
    if have_matplotlib() and rows:
        import matplotlib.pyplot as plt
        fig = figure(rows, doc["device"])
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        img = f'<img alt="roofline and time against M" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'
    cols = [f for f in ROW_FIELDS if f != "peers"]
    checked = {True: "yes", False: "no", None: "not checked"}
    thead = "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "<th>peers (us, peer/ours)</th>"
    trs = []
    for r in rows:
        tds = "".join(f"<td>{html.escape(checked[r[c]] if c == 'reproducible' else str(r[c]))}</td>"
                      for c in cols)
        tds += f"<td>{html.escape(_peer_text(r))}</td>"
        trs.append(f"<tr>{tds}</tr>")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>pyquant bench: {html.escape(doc['device'])}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}} pre{{background:#f6f6f6;padding:1em}}</style>
</head><body>
<h1>pyquant bench: {html.escape(doc['device'])}</h1>
<pre>{html.escape(chr(10).join(header))}
noise band: {doc['noise_band'] * 100:.1f} %, measurements per entry: {doc['repeats']}, date: {html.escape(doc['date'])}
{_repro_note(doc['repeats'])}
{html.escape(doc.get('build', ''))}</pre>
{f'<pre>{html.escape(extra_text)}</pre>' if extra_text else ''}
{img}
<table><thead><tr>{thead}</tr></thead><tbody>
{chr(10).join(trs)}
</tbody></table>
</body></html>
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
