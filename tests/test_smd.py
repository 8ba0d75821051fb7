"""The SMD benchmark's metric definitions, and a small real slice through the whole path
(import -> features -> our detectors -> attribution). tests/data/smd holds the first 300
train/test rows of SMD machine-1-6 (MIT licence, see its LICENSE)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "smd"


def _load():  # benchmarks/ is a folder of scripts, not a package
    spec = importlib.util.spec_from_file_location("smd_bench", ROOT / "benchmarks" / "smd.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["smd_bench"] = mod
    spec.loader.exec_module(mod)
    return mod


smd = _load()


def test_f1_and_point_adjust() -> None:
    truth = np.array([0, 1, 1, 1, 0, 0, 1, 1, 0, 0], dtype=bool)
    pred = np.array([0, 0, 1, 0, 0, 1, 0, 0, 0, 0], dtype=bool)
    p, r, f = smd.f1_score(pred, truth)
    assert (p, r) == (0.5, 0.2) and f == pytest.approx(2 * 0.1 / 0.7)
    pa = smd.point_adjust(pred, truth)
    # the first segment (rows 1-3) is hit at row 2 -> all of it counts; the second is missed
    assert pa.tolist() == [0, 1, 1, 1, 0, 1, 0, 0, 0, 0]
    p, r, f = smd.f1_score(pa, truth)
    assert (p, r) == (0.75, 0.6) and f == pytest.approx(2 * 0.45 / 1.35)
    assert smd.f1_score(np.zeros(3, bool), np.zeros(3, bool)) == (0.0, 0.0, 0.0)
    assert smd.segments_of(truth) == [(1, 4), (6, 8)]


def test_hit_rate_definition() -> None:
    truth = np.array([0, 1, 1, 1, 0], dtype=bool)
    pred = np.array([1, 1, 1, 0, 0], dtype=bool)  # row 0 flagged but normal, row 3 missed
    segments = [(1, 4, frozenset({3, 7}))]
    ranked = {0: [3, 7, 1], 1: [3, 1, 7, 2], 2: [5, 6, 7, 3]}
    # |G| = 2: @100 % looks at top 2, @150 % at top 3
    h100, n = smd.hit_rate(ranked, pred, truth, segments, 1.0)
    assert n == 2 and h100 == pytest.approx((0.5 + 0.0) / 2)  # row1 {3,1}: 1/2; row2 {5,6}: 0
    h150, _ = smd.hit_rate(ranked, pred, truth, segments, 1.5)
    assert h150 == pytest.approx((1.0 + 0.5) / 2)  # row1 {3,1,7}: 2/2; row2 {5,6,7}: 1/2
    assert smd.hit_rate(ranked, np.zeros(5, bool), truth, segments) == (None, 0)


def test_read_segments(tmp_path: Path) -> None:
    assert smd.read_segments(DATA / "interpretation_label" / "machine-1-6.txt") == [
        (246, 252, frozenset({1, 2, 3, 4, 6, 9, 10, 11, 12, 13, 15}))
    ]
    bad = tmp_path / "bad.txt"
    bad.write_text("10-20:1,2\nnonsense\n")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        smd.read_segments(bad)


def test_slice_through_the_benchmark() -> None:
    run = smd.run(DATA, ["machine-1-6"], "Z|Maha|vote2", reference="all")
    assert [r.config for r in run.results] == ["Z", "Maha", "vote2"]
    by = {r.config: r for r in run.results}
    for r in run.results:
        assert 0.0 <= r.precision <= 1.0 and 0.0 <= r.recall <= 1.0 and 0.0 <= r.f1 <= 1.0
        assert r.f1_pa >= r.f1  # point adjustment never lowers F1
        assert r.flagged_share < 0.5  # a calibrated threshold, not "everything is anomalous"
    # the labelled segment (rows 246-251, a large multi-metric excursion) is found and
    # explained: the blamed metrics rank high in our attribution
    maha = by["Maha"]
    assert maha.recall >= 0.5 and maha.hit_rows > 0
    # random ranking would give about 16/38 = 0.42 here
    assert maha.hit150 is not None and maha.hit150 > 0.5
    assert set(run.means()) == {"Z", "Maha", "vote2"}
