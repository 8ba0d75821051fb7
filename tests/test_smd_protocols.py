"""The SMD benchmark's protocols (standard / causal online / transductive), its
threshold rules, the nested selection and the resampled transfer (benchmarks/smd.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.test_smd import DATA, smd


def _series(n: int = 400, d: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d))


def test_causal_protocol_never_reads_a_later_row() -> None:
    X = _series()
    n_train, n_test, window = 200, 201, 1  # window w ends at row w: X has one window per row
    base = smd.score_protocol(X, n_train, n_test, window, protocol="causal", refit_every=50)
    spoiled = X.copy()
    spoiled[320:] += 50.0  # a huge later change: rows judged before it must not move
    after = smd.score_protocol(spoiled, n_train, n_test, window, protocol="causal", refit_every=50)
    # test row r is window n_train + r; blocks start at test rows 0, 50, 100, 150
    for d in smd.SCORED_DETECTORS:
        np.testing.assert_array_equal(base[0][d][:120], after[0][d][:120])  # blocks 0-2 (rows < 150)
    assert not np.allclose(base[0]["mahalanobis"][150:], after[0]["mahalanobis"][150:])
    # each block's reference is everything before it, growing by the cadence
    assert [int(r["mahalanobis"].size) for r in base[2]] == [200, 250, 300, 350, 400]
    # a trailing reference: the most recent 120 windows before each block
    short = smd.score_protocol(X, n_train, n_test, window, protocol="causal", refit_every=50, span=120)
    assert [int(r["mahalanobis"].size) for r in short[2]] == [120] * 5
    assert base[1].tolist() == [i // 50 for i in range(n_test)]


def test_protocol_references() -> None:
    X = _series(100)
    assert smd.reference_rows(X, 60, 5, "standard", 30).shape[0] == 56  # train windows only
    assert smd.reference_rows(X, 60, 5, "causal", 0).shape[0] == 56
    assert smd.reference_rows(X, 60, 5, "causal", 30).shape[0] == 86  # + the 30 test rows seen
    assert smd.reference_rows(X, 60, 5, "transductive", 30).shape[0] == 100
    np.testing.assert_array_equal(smd.reference_rows(X, 60, 5, "causal", 30, span=20), X[66:86])
    assert smd.reference_rows(X, 60, 5, "standard", 30, span=20).shape[0] == 56  # span: causal only
    assert smd.block_bounds(10, "causal", 4) == [(0, 4), (4, 8), (8, 10)]
    assert smd.block_bounds(10, "standard", 4) == [(0, 10)]
    with pytest.raises(ValueError, match="protocol"):
        smd.block_bounds(10, "future", 4)


def test_threshold_rules_flag_what_they_promise() -> None:
    s = np.exp(np.random.default_rng(2).normal(size=50000))  # log-normal healthy scores
    assert (s > smd.parse_rule("quantile:0.01").threshold(s)).mean() == pytest.approx(0.01, abs=1e-3)
    # POT at risk 1e-3 per window: about 0.1 % of healthy windows above it
    assert (s > smd.parse_rule("pot:0.98:1e-3").threshold(s)).mean() == pytest.approx(1e-3, abs=5e-4)
    assert smd.parse_rule("mad:8").threshold(s) > smd.parse_rule("mad:4").threshold(s)
    for bad in ("mad", "pot:0.98", "quantile:1.5", "pot:0.98:2", "knee:3"):
        with pytest.raises(ValueError, match="threshold rule"):
            smd.parse_rule(bad)


def _fake(name: str, good: float) -> smd.Scored:
    """A machine whose labelled rows score ``good`` above the healthy ones."""
    rng = np.random.default_rng(len(name))
    n = 600
    labels = np.zeros(n, dtype=bool)
    labels[300:330] = True
    s = np.exp(rng.normal(size=n)) + labels * good
    ref = {d: np.sort(np.exp(rng.normal(size=2000))) for d in smd.SCORED_DETECTORS}
    return smd.Scored(name, "causal", 1, labels, [], [1, 2], {d: s for d in smd.SCORED_DETECTORS},
                      np.zeros(n, dtype=np.int64), [ref], np.zeros((n, 2), np.float32))


def test_nested_selection_never_sees_the_held_out_machine() -> None:
    scored = {(n, 1, None): _fake(n, g) for n, g in (("machine-1-1", 20.0), ("machine-1-2", 20.0), ("machine-2-1", 20.0))}
    rules = [smd.parse_rule(r) for r in ("quantile:0.2", "quantile:0.05")]
    settings = smd.settings_grid([1], [("mahalanobis",)], rules, [0])
    f1 = smd.grid_f1(scored, settings)
    # 30 of 600 rows (5 %) are anomalous: the 5 % budget is better on every machine
    assert all(f1[(n, settings[1])] > f1[(n, settings[0])] for n, _, _ in scored)
    out = smd.nested(scored, settings, [["machine-1-1"], ["machine-1-2"], ["machine-2-1"]])
    assert [r.machine for r, _ in out] == ["machine-1-1", "machine-1-2", "machine-2-1"]
    assert all(st.rule == rules[1] for _, st in out)
    # the choice follows the other machines: spoil them and the held-out one changes
    f1_spoiled = dict(f1)
    for n in ("machine-1-2", "machine-2-1"):
        f1_spoiled[(n, settings[0])] = 1.0
    assert smd.select(f1_spoiled, ["machine-1-2", "machine-2-1"], settings) == settings[0]
    assert smd.select(f1_spoiled, ["machine-1-1"], settings) == settings[1]
    with pytest.raises(ValueError, match="no machine"):
        smd.nested(scored, settings, [["machine-1-1", "machine-1-2", "machine-2-1"]])
    assert smd.group_of("machine-2-7") == "2-x"


def test_resample_averages_rows_and_maps_labels(tmp_path: Path) -> None:
    out = smd.resample_data(DATA, "machine-1-6", tmp_path / "r5", 5)
    raw = np.loadtxt(DATA / "train" / "machine-1-6.txt", delimiter=",")
    coarse = np.loadtxt(out / "train" / "machine-1-6.txt", delimiter=",")
    assert coarse.shape == (raw.shape[0] // 5, raw.shape[1])
    np.testing.assert_allclose(coarse[3], raw[15:20].mean(axis=0), atol=1e-5)
    lab = np.loadtxt(DATA / "test_label" / "machine-1-6.txt", dtype=int)
    lab5 = np.loadtxt(out / "test_label" / "machine-1-6.txt", dtype=int)
    assert lab5.tolist() == lab[: lab.size // 5 * 5].reshape(-1, 5).max(axis=1).tolist()
    # segment 246-252 (rows 246..251) covers resampled rows 49 and 50
    assert smd.read_segments(out / "interpretation_label" / "machine-1-6.txt")[0][:2] == (49, 51)
    assert smd.rescale(smd.Setting(10, ("mahalanobis",), smd.parse_rule("mad:8"), 30), 5).window == 2


def test_nested_slice_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "smd"
    for sub in ("train", "test", "test_label", "interpretation_label"):
        (data / sub).mkdir(parents=True)
        for name in ("machine-1-6", "machine-2-6"):
            shutil.copy(DATA / sub / "machine-1-6.txt", data / sub / f"{name}.txt")
    cache = tmp_path / "cache"
    args = ["--data", str(data), "--nested", "--refit-every", "60", "--spans", "all", "--rules", "mad:8|quantile:0.02",
            "--cache", str(cache), "--transfer", "5"]
    assert smd.main(args) == 0
    out = capsys.readouterr().out
    # the shipped default at 5 min: the same setting counted in 5-min rows
    assert "The shipped default at 5 min" in out and "w1 mean(Maha) quantile:0.02 gaps6 incident" in out
    # 2 machines at 1 min and at 5 min: scores and features
    assert len(list(cache.glob("*.features.npz"))) == 4 and len(list(cache.glob("*causal*.npz"))) == 4
    a = smd.scored_machine(data, "machine-1-6", refit_every=60, cache=cache)  # from the cache
    b = smd.scored_machine(data, "machine-1-6", refit_every=60)
    for d in smd.SCORED_DETECTORS:
        np.testing.assert_allclose(a.scores[d], b.scores[d], rtol=1e-12)
    assert len(a.refs) == 5 and a.labels.sum() == 6


def _renamed(src: Path, name: str, out: Path, columns: int) -> Path:
    """``src``'s machine-1-6 as machine ``name`` with its first ``columns`` metrics: another
    dataset in SMD's layout (names and metric count of its own)."""
    for sub in ("train", "test", "test_label", "interpretation_label"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for sub in ("train", "test"):
        x = np.loadtxt(src / sub / "machine-1-6.txt", delimiter=",", ndmin=2)[:, :columns]
        np.savetxt(out / sub / f"{name}.txt", x, delimiter=",", fmt="%.6g")
    shutil.copy(src / "test_label" / "machine-1-6.txt", out / "test_label" / f"{name}.txt")
    segs = [(a, b, sorted(d for d in g if d <= columns)) for a, b, g in
            smd.read_segments(src / "interpretation_label" / "machine-1-6.txt")]
    (out / "interpretation_label" / f"{name}.txt").write_text(
        "".join(f"{a}-{b}:{','.join(map(str, g))}\n" for a, b, g in segs if g))
    return out


def test_shipped_default_on_another_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--shipped --period 5`` judges any machine of an SMD-layout directory with the shipped
    setting counted in 5-min rows, and says so."""
    coarse = smd.resample_data(DATA, "machine-1-6", tmp_path / "r5", 5)
    data = _renamed(coarse, "omi-1", tmp_path / "omi", 19)
    assert smd.machines(data) == ["omi-1"]
    out_json = tmp_path / "shipped.json"
    assert smd.main(["--shipped", "--data", str(data), "--period", "5", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "w1 mean(Maha) quantile:0.02 gaps6 incident" in out and "refit every 48 test rows" in out
    assert "in-sample" not in out  # not SMD's own machines
    got = json.loads(out_json.read_text())
    assert [r["machine"] for r in got["results"]] == ["omi-1"] and got["period_min"] == 5
    s = smd.scored_machine(data, "omi-1", window=1, refit_every=48)
    assert s.z.shape[1] == 19  # the dataset's own metric count
    assert got["results"][0]["f1"] == smd.judge(s, smd.rescale(smd.SHIPPED, 5)).f1
    # counted in 1-min rows the same data gets the 1-min setting's 5-row windows
    assert smd.main(["--shipped", "--data", str(data)]) == 0
    assert "w5 mean(Maha) quantile:0.02 gaps30 incident" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no machine"):
        smd.main(["--shipped", "--data", str(tmp_path / "empty")])
    with pytest.raises(SystemExit, match="--period"):
        smd.main(["--shipped", "--data", str(data), "--period", "0"])


def test_cache_keeps_datasets_apart(tmp_path: Path) -> None:
    """Two datasets whose machines share a name do not share cached scores."""
    a = _renamed(DATA, "m", tmp_path / "a", 38)
    b = _renamed(DATA, "m", tmp_path / "b", 19)
    cache = tmp_path / "cache"
    sa = smd.scored_machine(a, "m", refit_every=60, cache=cache)
    sb = smd.scored_machine(b, "m", refit_every=60, cache=cache)
    assert sa.z.shape[1] == 38 and sb.z.shape[1] == 19


def test_too_few_labels_is_a_clear_error(tmp_path: Path) -> None:
    data = _renamed(DATA, "m", tmp_path / "d", 38)
    lab = data / "test_label" / "m.txt"
    lab.write_text("".join(lab.read_text().splitlines(keepends=True)[:250]))
    with pytest.raises(ValueError, match=r"m.txt: 250 labels for 300 test rows"):
        smd.scored_machine(data, "m", refit_every=60)
