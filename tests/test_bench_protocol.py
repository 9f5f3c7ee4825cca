"""The golden record / compare protocol, driven by a fake timer (no library, no device).

The fake timer gives each case a fresh random base time; every measurement carries small
noise (uniform within +-NOISE, well inside the band) and the tests inject, per case and
per call, what a real machine does now and then: one slow spike (noise that must NOT be
reported) or a lasting change (a real regression or improvement that MUST be reported).
Seeds are printed on failure.
"""
from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest

from pyquant import bench
from pyquant.bench import cases as C
from pyquant.bench import golden as G
from pyquant.bench.timing import FakeRunner, FakeTimer

BAND = G.GPU_NOISE_BAND
# +-0.5 % jitter: a quiet GPU's median-of-many timing moves about this much; it is six
# times smaller than the band, so it can never cross it on its own.
NOISE = 0.005
SPIKE = 1.30    # a preempted / throttled measurement: 30 % slow, far outside the band
SLOWER = 1.25   # an injected real regression: every call 25 % slower
FASTER = 0.80   # an injected real improvement


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy
    print(f"seed = {seed}")
    return np.random.default_rng(seed)


def suite():
    return [C.Case("w4a16", "int4", "g128-asym-bf16", m, 14336, 4096) for m in (1, 2, 4, 8, 16, 32)]


class Machine:
    """Fake timings: base[case] * jitter * injected(case, call)."""

    def __init__(self, rng, cases):
        self.rng = rng
        self.base = {c.key: float(rng.uniform(10e-6, 500e-6)) for c in cases}
        self.inject = {}   # case key -> function(call) -> factor

    def model(self, case, call):
        factor = self.inject.get(case.key, lambda call: 1.0)(call)
        return self.base[case.key] * factor * (1.0 + self.rng.uniform(-NOISE, NOISE))

    def timer(self):
        return FakeTimer(self.model)


def spike_on(*calls):
    return lambda call: SPIKE if call in calls else 1.0


def always(f):
    return lambda call: f


def golden_rows(recorded):
    return [{"family": r.case.family, "format": r.case.format, "variant": r.case.variant,
             "m": r.case.m, "n": r.case.n, "k": r.case.k, "median_us": r.median_s * 1e6,
             "reproducible": r.reproducible} for r in recorded]


def test_record_flags_entries_that_do_not_repeat(rng):
    cases = suite()
    machine = Machine(rng, cases)
    machine.inject[cases[1].key] = spike_on(1)   # the second of three measurements spikes
    machine.inject[cases[4].key] = spike_on(2)   # the third one spikes
    timer = machine.timer()
    recorded = G.record(cases, timer.measure, BAND)
    flags = {r.case.key: r.reproducible for r in recorded}
    assert flags == {c.key: c not in (cases[1], cases[4]) for c in cases}
    assert all(timer.calls[c.key] == G.REPEATS for c in cases)
    for r in recorded:  # the written median is the median of the three measurements
        assert r.median_s == sorted(r.times_s)[1]


def test_compare_reports_reproduced_changes_and_calls_the_rest_noise(rng):
    cases = suite()
    machine = Machine(rng, cases)
    machine.inject[cases[5].key] = spike_on(0)   # unreliable at record time
    recorded = G.record(cases, machine.timer().measure, BAND)
    assert [r.reproducible for r in recorded] == [True] * 5 + [False]

    stable, regressed, improved, spiked, spiked_twice, untrusted = cases
    machine.inject = {
        regressed.key: always(SLOWER),
        improved.key: always(FASTER),
        spiked.key: spike_on(0),                 # only the first compare measurement is slow
        spiked_twice.key: spike_on(0, 2),        # the first and one of three re-runs are slow
        untrusted.key: always(SLOWER),           # slower, but its golden is not truth
    }
    timer = machine.timer()
    results = G.compare(cases, golden_rows(recorded), timer.measure, BAND)
    outcome = {r.case.key: r.outcome for r in results}
    assert outcome == {stable.key: G.OK, regressed.key: G.REGRESSION, improved.key: G.IMPROVEMENT,
                       spiked.key: G.NOISE, spiked_twice.key: G.NOISE, untrusted.key: G.UNTRUSTED}
    # Only what moved is re-run, three more times; an untrusted golden is not even measured.
    assert timer.calls == {stable.key: 1, regressed.key: 1 + G.RERUNS, improved.key: 1 + G.RERUNS,
                           spiked.key: 1 + G.RERUNS, spiked_twice.key: 1 + G.RERUNS}
    assert G.has_regression(results)
    change = {r.case.key: r.change for r in results}
    # The reported change is the injected one, give or take the jitter on both sides.
    assert abs(change[regressed.key] - (SLOWER - 1)) < 3 * NOISE
    assert abs(change[improved.key] - (FASTER - 1)) < 3 * NOISE


def test_regression_survives_one_noisy_rerun(rng):
    # A real 25 % regression whose second re-run happens to come back fast: two of three
    # re-runs still confirm it.
    cases = suite()[:1]
    machine = Machine(rng, cases)
    recorded = G.record(cases, machine.timer().measure, BAND)
    machine.inject[cases[0].key] = lambda call: 1.0 if call == 2 else SLOWER
    results = G.compare(cases, golden_rows(recorded), machine.timer().measure, BAND)
    assert [r.outcome for r in results] == [G.REGRESSION]


def test_change_inside_the_band_is_not_reported(rng):
    cases = suite()
    machine = Machine(rng, cases)
    recorded = G.record(cases, machine.timer().measure, BAND)
    # Half the band, in either direction, on every call of every case: with the jitter on
    # both the golden and the new time the ratio stays within 1.5 % + 2 * 0.5 % < 3 %.
    for i, c in enumerate(cases):
        machine.inject[c.key] = always(1 + BAND / 2 if i % 2 else 1 - BAND / 2)
    results = G.compare(cases, golden_rows(recorded), machine.timer().measure, BAND)
    assert {r.outcome for r in results} == {G.OK}
    assert not G.has_regression(results)


def test_cli_record_then_compare_exit_status(rng, tmp_path, capsys):
    cases = C.build_suite(quick=True)
    machine = Machine(rng, cases)
    machine.inject[cases[2].key] = spike_on(0)   # not reproducible at record time
    path = tmp_path / "fake.json"
    argv = ["--quick", "--band", str(BAND)]
    assert bench.main(argv + ["--record", str(path)], runner=FakeRunner(machine.timer())) == 0

    doc = json.loads(path.read_text())
    assert {"device", "copy_GBps", "bf16_TFLOPs", "rows"} <= set(doc)
    assert [(r["family"], r["format"], r["variant"], r["m"], r["n"], r["k"]) for r in doc["rows"]] == \
        [c.key for c in C.order_for_weights(cases)]
    schema = {"family", "format", "variant", "m", "n", "k", "median_us", "GBps", "TFLOPs",
              "roofline_pct", "reproducible", "peers"}
    assert all(schema <= set(r) for r in doc["rows"])
    assert [r["reproducible"] for r in doc["rows"]].count(False) == 1

    # Noise only (a spike on the first compare measurement of two cases): exit 0.
    machine.inject = {cases[0].key: spike_on(0), cases[3].key: spike_on(0)}
    assert bench.main(argv + ["--compare", str(path)], runner=FakeRunner(machine.timer())) == 0
    out = capsys.readouterr().out
    assert "NOISE" in out and "REGRESSION" not in out

    # A reproduced regression: exit status 1, and the case is named.
    machine.inject = {cases[1].key: always(SLOWER)}
    assert bench.main(argv + ["--compare", str(path)], runner=FakeRunner(machine.timer())) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and cases[1].label in out


def test_unsupported_cases_are_skipped_not_fatal(rng):
    # A build without a kernel for one case: record leaves it out, compare lists it as
    # SKIPPED, and neither stops the other cases.
    cases = suite()[:3]
    machine = Machine(rng, cases)
    missing = cases[1]

    def measure(timer):
        def run(case):
            if case.key == missing.key:
                raise G.Unsupported("no prefill tier in this build")
            return timer.measure(case)
        return run

    skipped = []
    recorded = G.record(cases, measure(machine.timer()), BAND, on_skip=lambda c, why: skipped.append(c))
    assert [r.case for r in recorded] == [cases[0], cases[2]] and skipped == [missing]
    rows = golden_rows(recorded) + [dict(golden_rows(recorded)[0], m=missing.m, median_us=10.0)]
    results = G.compare(cases, rows, measure(machine.timer()), BAND)
    assert [r.outcome for r in results] == [G.OK, G.SKIPPED, G.OK]
    assert "no prefill tier" in results[1].note


def test_plot_without_matplotlib_is_a_clear_usage_error(rng, tmp_path, monkeypatch, capsys):
    from pyquant.bench import report
    monkeypatch.setattr(report, "have_matplotlib", lambda: False)
    machine = Machine(rng, C.build_suite(quick=True))
    timer = machine.timer()
    status = bench.main(["--quick", "--plot", str(tmp_path / "p.png")], runner=FakeRunner(timer))
    assert status == bench.EXIT_USAGE
    assert "matplotlib" in capsys.readouterr().err
    assert timer.calls == {}, "nothing may be measured before the missing tool is reported"
    assert not (tmp_path / "p.png").exists()


def test_family_without_a_tier_on_the_backend_is_known_from_the_build():
    """The GPU bench skips MXFP4 / MoE before making their weights when the build says it
    has no GPU tier for them (the build string of the H200 runs)."""
    from pyquant.bench.runner import family_has_tier
    build = ("quantgemm 0.1.0 format 1; backends: cpu cuda(sm_90a); tiers: w4a16=cpu,cuda "
             "gguf=cpu,cuda mxfp4=cpu moe=cpu; build: Release GNU 13.3.0")
    assert family_has_tier(build, "gguf", "cuda") and family_has_tier(build, "w4a16", "cpu")
    assert family_has_tier(build, "moe", "cpu"), "the last family's list ends at the ';'"
    assert not family_has_tier(build, "mxfp4", "cuda") and not family_has_tier(build, "moe", "cuda")
    assert not family_has_tier(build, "moe", "hip")
    assert family_has_tier(build.replace("moe=cpu", "moe=cpu,hip(gfx942)"), "moe", "hip")
    assert family_has_tier("quantgemm 0.1.0 (no tier list)", "moe", "cuda")


def test_cpu_bench_runs_moe_instead_of_skipping_it(capsys):
    """The real runner on the CPU backend (every family has a CPU tier): the MoE case of the
    quick suite is measured, not skipped. It was skipped when the build's tier list was
    misread ("moe=cpu;" as "cpu;")."""
    argv = ["--backend", "cpu", "--family", "moe", "--variant", "gpt-oss-20b", "--m", "1",
            "--budget", "0.01", "--no-peers"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "skipped" not in out, out
    assert any(line.startswith("moe ") for line in out.splitlines()), out


def test_option_reaches_the_context_and_a_bad_one_is_a_usage_error(tmp_path, capsys):
    """--option NAME=VALUE sets a context option of the real runner (printed in the header
    and kept in --json); an unknown name or a value the library refuses stops the bench
    before any case, and golden rows (--record) never carry a forced choice."""
    argv = ["--backend", "cpu", "--family", "w4a16", "--variant", "g128-asym-bf16", "--m", "1",
            "--shape", "256x512", "--budget", "0.01", "--no-peers"]
    out_json = tmp_path / "o.json"
    assert bench.main(argv + ["--option", "cpu_precision=1", "--json", str(out_json)]) == 0
    assert "options       : cpu_precision=1" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["options"] == {"cpu_precision": 1}
    for bad in ("bogus=1", "prefill_tile=96", "cpu_precision=x"):
        with pytest.raises(SystemExit) if bad.endswith("=x") else contextlib.nullcontext():
            assert bench.main(argv + ["--option", bad]) == bench.EXIT_USAGE, bad
        capsys.readouterr()
    assert bench.main(argv + ["--option", "split_k=2", "--record", str(tmp_path / "g.json")]) == bench.EXIT_USAGE
    assert "--option with --record" in capsys.readouterr().err
    assert not (tmp_path / "g.json").exists()
