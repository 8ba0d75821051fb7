"""The SMD benchmark's metric definitions, and a small real slice through the whole path
(import -> features -> our detectors -> attribution). tests/data/smd holds the first 300
train/test rows of SMD machine-1-6 (MIT licence, see its LICENSE)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from analytics import scoring

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


def test_close_gaps_fills_only_short_inner_gaps() -> None:
    f = np.array([0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0], dtype=bool)
    # gaps between flags: rows 2-3 (2 long) and 5-7 (3 long); leading/trailing never filled
    assert scoring.close_gaps(f, 2).astype(int).tolist() == [0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0]
    assert scoring.close_gaps(f, 3).astype(int).tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]
    assert scoring.close_gaps(f, 0).tolist() == f.tolist()
    assert scoring.runs(f) == [(1, 2), (4, 5), (8, 9)] and scoring.runs(np.zeros(3, bool)) == []
    with pytest.raises(ValueError, match="max_gap"):
        scoring.close_gaps(f, -1)


def test_run_mean_causal_and_whole_run() -> None:
    v = np.array([[9.0, 0.0], [1.0, 3.0], [3.0, 1.0], [0.0, 8.0], [5.0, 5.0]])
    f = np.array([0, 1, 1, 1, 0], dtype=bool)
    causal = scoring.run_mean(v, f)
    # row 0 and 4 unflagged: their own values; rows 1-3: mean since the run's first row
    assert causal.tolist() == [[9.0, 0.0], [1.0, 3.0], [2.0, 2.0], [4.0 / 3.0, 4.0], [5.0, 5.0]]
    whole = scoring.run_mean(v, f, causal=False)
    assert whole[1:4].tolist() == [[4.0 / 3.0, 4.0]] * 3 and whole[0].tolist() == [9.0, 0.0]
    with pytest.raises(ValueError, match="do not match"):
        scoring.run_mean(v, f[:3])


def test_mean_margin() -> None:
    m = scoring.mean_margin([np.array([2.0, 0.0, np.nan]), np.array([0.4, 1.5, 3.0])])
    assert m[:2].tolist() == [1.2, 0.75] and np.isnan(m[2])
    with pytest.raises(ValueError):
        scoring.mean_margin([])


def test_run_attribution_ranks_by_the_run_so_far() -> None:
    from analytics.detectors import RobustStandardizer

    # metric 1 (column 0) deviates through the whole incident; at row 3 metric 2 spikes once
    z = np.array([[0.0, 0.0], [4.0, 0.0], [4.0, 1.0], [3.0, 6.0], [0.0, 9.0]])
    fit = smd.Fitted(RobustStandardizer(), {}, {}, {}, z)
    pred = np.array([0, 1, 1, 1, 0], dtype=bool)
    rows = np.array([1, 2, 3])
    spec = smd.parse_specs("mean(Z,Maha)")[0]
    run = smd.rank_dims(fit, spec, rows, [1, 2], mode="run", pred=pred)
    # row 3: mean z² since row 1 = (16+16+9)/3 vs (0+1+36)/3 -> metric 1 still first
    assert run == {1: [1, 2], 2: [1, 2], 3: [1, 2]}
    whole = smd.rank_dims(fit, spec, rows, [1, 2], mode="incident", pred=pred)
    assert whole[1] == [1, 2]
    with pytest.raises(ValueError, match="needs the flags"):
        smd.rank_dims(fit, spec, rows, [1, 2], mode="run")


def test_parse_specs() -> None:
    specs = smd.parse_specs("Maha|mean(IF, Maha)|mean(IF,Maha,PCA)|PCA|vote2")
    assert [s.name for s in specs] == ["Maha", "mean(IF,Maha)", "mean(IF,Maha,PCA)", "PCA", "vote2"]
    assert specs[1].detectors == ("iforest", "mahalanobis") and specs[3].detectors == ("pca",)
    with pytest.raises(ValueError, match="unknown detector"):
        smd.parse_specs("mean(IF,LOF)")


def test_leave_one_out_picks_k_without_the_held_out_machine() -> None:
    pts = [smd.SweepPoint(m, "c", k, f, 0.0, 0.0) for m, k, f in [
        ("a", 1.0, 0.9), ("a", 2.0, 0.5),
        ("b", 1.0, 0.8), ("b", 2.0, 0.6),
        ("c", 1.0, 0.0), ("c", 2.0, 0.7),
    ]]
    loo, chosen = smd.leave_one_out(pts, "c")
    # without a: b+c prefer k=2 (0.65 vs 0.4); without b: k=2 (0.6 vs 0.45); without c: k=1
    assert chosen == {"a": 2.0, "b": 2.0, "c": 1.0}
    assert loo == pytest.approx((0.5 + 0.6 + 0.0) / 3)


def test_read_segments(tmp_path: Path) -> None:
    assert smd.read_segments(DATA / "interpretation_label" / "machine-1-6.txt") == [
        (246, 252, frozenset({1, 2, 3, 4, 6, 9, 10, 11, 12, 13, 15}))
    ]
    bad = tmp_path / "bad.txt"
    bad.write_text("10-20:1,2\nnonsense\n")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        smd.read_segments(bad)


def test_slice_through_the_benchmark() -> None:
    # the default setting (window 5, k 8, mean(IF,Maha), gaps closed, run attribution)
    run = smd.run(DATA, ["machine-1-6"], "Z|Maha|mean(IF,Maha)", reference="all")
    assert (run.window, run.threshold_k, run.close_gaps, run.attribution) == (5, 8.0, 30, "run")
    assert [r.config for r in run.results] == ["Z", "Maha", "mean(IF,Maha)"]
    by = {r.config: r for r in run.results}
    for r in run.results:
        assert 0.0 <= r.precision <= 1.0 and 0.0 <= r.recall <= 1.0 and 0.0 <= r.f1 <= 1.0
        assert r.f1_pa >= r.f1  # point adjustment never lowers F1
        assert r.flagged_share < 0.5  # a calibrated threshold, not "everything is anomalous"
    # the labelled segment (rows 246-251, a large multi-metric excursion) is found and
    # explained: the blamed metrics rank high in our attribution (random ranking would
    # give about 16/38 = 0.42 here)
    for r in (by["Maha"], by["mean(IF,Maha)"]):
        assert r.recall >= 0.5 and r.hit_rows > 0
        assert r.hit150 is not None and r.hit150 > 0.5
    assert set(run.means()) == {"Z", "Maha", "mean(IF,Maha)"}


def test_recalibrated_margins_match_a_refit(tmp_path: Path) -> None:
    """The k sweep recalibrates thresholds instead of refitting: same margins as a fit at k."""
    lake = tmp_path / "lake"
    lake.mkdir()
    m = smd.load_machine(DATA, "machine-1-6", lake, window=5)
    X = m.features.select(smd.feature_columns(m.features)).to_numpy().astype(np.float64)
    floors = 0.01 * (X.max(axis=0) - X.min(axis=0))
    fit4 = smd.fit_detectors(X, X[-50:], floors, threshold_k=4.0)
    fit8 = smd.fit_detectors(X, X[-50:], floors, threshold_k=8.0)
    at8 = fit4.margins_at(8.0)
    for name in ("zscore", "iforest", "mahalanobis"):
        np.testing.assert_allclose(at8[name], fit8.margins[name])
    assert not np.allclose(fit4.margins["mahalanobis"], fit8.margins["mahalanobis"])
    sweep: list = []
    smd.evaluate_machine(m, smd.parse_specs("mean(IF,Maha)"), k_grid=(4.0, 8.0), sweep=sweep)
    assert [(p.config, p.k) for p in sweep] == [("mean(IF,Maha)", 4.0), ("mean(IF,Maha)", 8.0)]
    # a higher threshold never flags more
    assert sweep[1].flagged_share <= sweep[0].flagged_share


def test_slice_previous_setting_and_row_attribution() -> None:
    """The first session's setting stays reproducible (window 3, the detectors' own k,
    no gap closing, per-row detector shares)."""
    run = smd.run(DATA, ["machine-1-6"], "Maha|vote2", window=3, threshold_k=None, close_gaps=0,
                  attribution_mode="row")
    maha = run.results[0]
    assert maha.recall >= 0.5 and maha.hit150 is not None and maha.hit150 > 0.5
    with pytest.raises(ValueError, match="attribution"):
        smd.run(DATA, ["machine-1-6"], "Maha", attribution_mode="nonsense")
