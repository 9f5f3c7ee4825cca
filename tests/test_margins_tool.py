"""tools/margins.py: the summary keeps each test's largest err/bound and the check at it."""
from __future__ import annotations

import importlib.util
import pathlib

_path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "margins.py"
_spec = importlib.util.spec_from_file_location("margins", _path)
margins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(margins)


def test_summary_groups_parameters_and_keeps_the_max():
    lines = ["tests/a.py::t[x-1]\tfirst\t0.2500\n",
             "tests/a.py::t[x-2]\tsecond\t0.7500\n",
             "tests/a.py::t[x-3]\tthird\t0.5000\n",
             "tests/b.py::u\tonly\t0.0100\n"]
    got = margins.summarise(lines)
    assert got == {"tests/a.py::t": (0.75, 3, "second"), "tests/b.py::u": (0.01, 1, "only")}
