"""Open benchmark: the Server Machine Dataset (SMD, OmniAnomaly, KDD 2019).

For each machine the unlabelled train and test series are imported through the real
import path (:func:`ingest.importer.import_files`, one row per minute) into a scratch
lake, turned into windows by :func:`analytics.features.compute_features` (the imported
table's metrics are generic gauges ``smd.c1 .. smd.c38``), scored by our detectors
(robust Z, Isolation Forest, Mahalanobis, combined like the pipeline: margins, then
any / all / k-th largest) and explained by :mod:`analytics.attribution`.

No label is used before scoring: the detectors are fitted on the train windows (or, with
``--reference all``, on train + test, both unlabelled) and flag a window when its score
exceeds the detector's own label-free threshold (median + k·MAD of the log reference
scores, k = ``--threshold-k``). The default setting, one for every machine (docs/smd.md):
5-minute windows, k = 8, the mean of the IF and Mahalanobis margins
(``mean(IF,Maha)``), gaps of up to 30 unflagged minutes between flags closed, and
attribution by the squared robust z of each metric averaged over the flagged run so far
(:mod:`analytics.scoring`). Labels are read only to compute the figures:

* point-wise F1 (test rows, no adjustment);
* point-adjusted F1 (a labelled segment of ``test_label`` counts as detected in full when
  any of its rows is flagged);
* HitRate@150 %: for every flagged row with ``test_label`` 1 inside an
  ``interpretation_label`` segment with blamed metrics G, the share of G among the top
  ⌊1.5·|G|⌋ metrics ranked by attribution, averaged over those rows (OmniAnomaly's
  definition; HitRate@100 % is printed too);
* for comparison with published *best-F1* figures only: the point-wise F1 of the
  combined score at the best threshold chosen with the labels ("oracle"; not ours).

    python benchmarks/smd.py [--data DIR] [--machines machine-1-6 ...]
                             [--configs "Z|IF|Maha|vote2|mean(IF,Maha)|mean(IF,Maha,PCA)"]
                             [--reference train|all] [--window 5] [--threshold-k 8]
                             [--close-gaps 30] [--attribution row|run|incident] [--seed 0]
                             [--maha-fit-rows N] [--k-grid 6,7,8,9] [--json FILE]

The shipped label-free default on any dataset in SMD's layout (``train/``, ``test/``,
``test_label/``, ``interpretation_label/``, a ``NAME.txt`` per machine), e.g. one sampled
every 5 minutes:

    python benchmarks/smd.py --shipped --data DIR --period 5 [--machines NAME ...] [--json FILE]

Protocols and constants chosen without the reported labels (issue 16, docs/smd.md):

    python benchmarks/smd.py --nested [--protocol causal|standard|transductive]
                             [--refit-every 240] [--spans all,20160,10080]
                             [--rules "mad:8|quantile:0.01|pot:0.98:1e-4|tail:0.02:0.5"]
                             [--combos "mean(IF,Maha)|mean(Maha,Chan)"] [--gaps 0,30] [--transfer 5] [--cache DIR]

scores every machine under the protocol (causal online: each test row judged by detectors
refitted every ``--refit-every`` rows on the windows before its block), then chooses the
window, combination, threshold rule, gap closing and attribution by nested leave-one-
machine-out and leave-one-group-out, and (``--transfer``) applies each group's choice to
the group resampled to a coarser period.
``Chan`` in ``--combos`` is the per-channel tail score (:class:`analytics.scoring.ChannelTail`
on the windows and their trailing 60-min mean), fitted on the same causal blocks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analytics import attribution, scoring
from analytics.baselines import PCAReconstruction
from analytics.detectors import (
    RobustStandardizer,
    ThresholdRule,
    calibrate_threshold,
    scores_to_labels,
)
from analytics.evaluation import ComboSpec, parse_configs
from analytics.features import WindowSpec, compute_features, feature_columns
from analytics.pipeline import AnalyticsConfig
from ingest.importer import import_files
from ingest.lake import scan

log = logging.getLogger("benchmarks.smd")

DATA = Path("/work/shared/datasets/smd")
TABLE = "smd"
T0 = datetime(2020, 1, 1, tzinfo=UTC)  # arbitrary: SMD rows carry no time
STEP = timedelta(minutes=1)
#: the documented setting (docs/smd.md): window 5 min, k = 8, mean of the IF and
#: Mahalanobis margins, gaps of up to 30 min closed, attribution over the flagged run
DEFAULT_CONFIG = "mean(IF,Maha)"
DEFAULT_CONFIGS = f"Z|IF|Maha|vote2|IF∨Maha|mean(Z,IF,Maha)|mean(IF,Maha,PCA)|{DEFAULT_CONFIG}"
DEFAULT_WINDOW = 5
DEFAULT_THRESHOLD_K = 8.0
DEFAULT_CLOSE_GAPS = 30
DEFAULT_ATTRIBUTION = "run"
ATTRIBUTIONS = ("row", "run", "incident")
DETECTOR_NAMES = {"z": "zscore", "zscore": "zscore", "if": "iforest", "iforest": "iforest", "maha": "mahalanobis",
                  "mahalanobis": "mahalanobis", "pca": "pca", "chan": "chan"}


def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


# --------------------------------------------------------------------------- data


@dataclass
class Machine:
    name: str
    n_train: int
    n_test: int
    features: pl.DataFrame  # host, window_start, window_end, smd.c1 ... (one row per window)
    dims: list[int]  # 1-based SMD metric number of each feature column, in column order
    labels: np.ndarray  # bool per test row
    segments: list[tuple[int, int, frozenset[int]]]  # (start, end exclusive, blamed dims, 1-based)


def machines(data: Path) -> list[str]:
    """Machines whose train, test and labels are all present (any name: SMD's layout holds
    other datasets too)."""
    names = sorted(p.stem for p in (data / "test").glob("*.txt"))
    return [n for n in names if (data / "train" / f"{n}.txt").is_file() and (data / "test_label" / f"{n}.txt").is_file()]


def read_segments(path: Path) -> list[tuple[int, int, frozenset[int]]]:
    """``start-end:d1,d2`` lines (0-based test rows, end exclusive, dims from 1)."""
    out: list[tuple[int, int, frozenset[int]]] = []
    if not path.is_file():
        return out
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            span, dims = line.split(":")
            a, b = span.split("-")
            out.append((int(a), int(b), frozenset(int(d) for d in dims.split(",") if d.strip())))
        except ValueError:
            raise ValueError(f"{path}:{n}: bad interpretation line {line!r}") from None
    return out


def load_machine(data: Path, name: str, lake: Path, *, window: int = 1, rows: int | None = None) -> Machine:
    """Import train+test of one machine into ``lake`` and compute its window features.

    ``rows``: keep only the first ``rows`` rows of each file (tests use a small slice)."""
    train, test = data / "train" / f"{name}.txt", data / "test" / f"{name}.txt"
    files: list[Path] = [train, test]
    if rows is not None:
        files = []
        for src in (train, test):
            dst = lake.parent / f"{name}-{src.parent.name}.txt"
            with src.open() as fh:
                dst.write_text("".join(line for _, line in zip(range(rows), fh, strict=False)))
            files.append(dst)
    rep = import_files(lake, name, files, table=TABLE, interval=STEP, start=T0, has_header=False)
    if rep.skipped:
        log.warning("%s: %d rows skipped on import, e.g. %s", name, len(rep.skipped), rep.skipped[0])
    n_train = sum(1 for _ in files[0].open())
    n_test = sum(1 for _ in files[1].open())
    feats = compute_features({TABLE: scan(lake, TABLE, hosts=[name])}, WindowSpec(60.0 * window, 60.0))
    cols = feature_columns(feats)
    dims = [int(c.rsplit(".c", 1)[1]) for c in cols]
    label_path = data / "test_label" / f"{name}.txt"
    labels = np.loadtxt(label_path, dtype=np.int64, ndmin=1).astype(bool)[:n_test]
    if labels.size < n_test:
        raise ValueError(f"{label_path}: {labels.size} labels for {n_test} test rows")
    segs = [s for s in read_segments(data / "interpretation_label" / f"{name}.txt") if s[0] < n_test]
    return Machine(name, n_train, n_test, feats, dims, labels, segs)


# ------------------------------------------------------------------------ metrics


def f1_score(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float, float]:
    """(precision, recall, F1); 0 where undefined (the literature's convention)."""
    tp = int(np.sum(pred & truth))
    fp = int(np.sum(pred & ~truth))
    fn = int(np.sum(~pred & truth))
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def segments_of(truth: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of True as (start, end exclusive)."""
    t = np.concatenate([[False], truth.astype(bool), [False]])
    d = np.diff(t.astype(np.int8))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def point_adjust(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Standard PA: a true segment with any flagged row becomes entirely flagged."""
    out = pred.astype(bool).copy()
    for a, b in segments_of(truth):
        if out[a:b].any():
            out[a:b] = True
    return out


def hit_rate(ranked: dict[int, list[int]], pred: np.ndarray, truth: np.ndarray,
             segments: Sequence[tuple[int, int, frozenset[int]]], p: float = 1.5) -> tuple[float | None, int]:
    """Mean of |top-⌊p·|G|⌋ ∩ G| / |G| over flagged, labelled rows inside a segment.

    ``ranked``: row -> metric numbers ordered by attribution (most responsible first).
    Returns (hit rate or None when no row qualifies, number of rows averaged)."""
    hits: list[float] = []
    for a, b, g in segments:
        if not g:
            continue
        k = math.floor(p * len(g))
        for row in range(a, min(b, len(truth))):
            if not (pred[row] and truth[row]) or row not in ranked:
                continue
            hits.append(len(set(ranked[row][:k]) & g) / len(g))
    return (float(np.mean(hits)) if hits else None), len(hits)


def best_f1(score: np.ndarray, truth: np.ndarray, n: int = 400) -> float:
    """Oracle: the best point-wise F1 over ``n`` score quantiles (uses the labels)."""
    finite = score[np.isfinite(score)]
    if finite.size == 0:
        return 0.0
    qs = np.unique(np.quantile(finite, np.linspace(0.0, 1.0, n, endpoint=False)))
    return max(f1_score(score > q, truth)[2] for q in qs)


# ------------------------------------------------------------------------ scoring


@dataclass(frozen=True)
class MeanSpec:
    """A combination by the mean of the detectors' margins (:func:`analytics.scoring.mean_margin`)."""

    name: str
    detectors: tuple[str, ...]


Spec = ComboSpec | MeanSpec


def parse_specs(text: str) -> list[Spec]:
    """The pipeline's ``--configs`` syntax (:func:`analytics.evaluation.parse_configs`) plus
    ``mean(D1,D2,...)`` (mean of margins) and ``PCA`` (the reconstruction-error baseline,
    :class:`analytics.baselines.PCAReconstruction`, alone or inside ``mean(...)``)."""
    out: list[Spec] = []
    for item in (x.strip() for x in text.replace("|", ";").split(";")):
        if not item:
            continue
        low = item.lower().replace(" ", "")
        if low.startswith("mean(") and low.endswith(")"):
            names = [p for p in low[5:-1].split(",") if p]
            try:
                dets = tuple(dict.fromkeys(DETECTOR_NAMES[p] for p in names))
            except KeyError as exc:
                raise ValueError(f"--configs: unknown detector {exc.args[0]!r} in {item!r}; use Z, IF, Maha, PCA") from None
            if not dets:
                raise ValueError(f"--configs: empty item {item!r}")
            out.append(MeanSpec(item.replace(" ", ""), dets))
        elif low == "pca":
            out.append(MeanSpec("PCA", ("pca",)))
        else:
            out += parse_configs(item)
    if not out:
        raise ValueError(f"--configs {text!r}: no configuration")
    return out


@dataclass
class Fitted:
    """All three detectors fitted once; combinations are derived from their margins."""

    scaler: RobustStandardizer
    models: dict
    margins: dict[str, np.ndarray]  # detector -> margin per test row (threshold at 1)
    flags: dict[str, np.ndarray]
    z: np.ndarray  # standardised test matrix
    scores: dict[str, np.ndarray] = field(default_factory=dict)  # detector -> raw score per test row

    def margins_at(self, k: float) -> dict[str, np.ndarray]:
        """The margins with every detector's threshold recalibrated at multiplier ``k`` on
        its own reference scores (what refitting with ``threshold_k=k`` gives, without
        refitting: the models do not depend on k)."""
        out = {}
        for name, m in self.models.items():
            thr = m._bounded(calibrate_threshold(m.reference_scores_, k, log_scale=m._log_scale))
            s, span = self.scores[name], thr - m.score_median_
            out[name] = (s - m.score_median_) / span if np.isfinite(span) and span > 0 else np.where(s > thr, np.inf, 0.0)
        return out


def fit_detectors(ref: np.ndarray, test: np.ndarray, floors: np.ndarray, *, threshold_k: float | None,
                  random_state: int = 0, pca: bool = False, maha_fit_rows: int | None = None) -> Fitted:
    """Every detector fitted on ``ref``, scored on ``test``. ``maha_fit_rows``: rows of
    the reference the Mahalanobis covariance is fitted on (a random subsample above it;
    None: all of them — on SMD's ~47 000 windows the detector's default 2 000 makes the
    result depend on the seed, ±0.02 F1)."""
    maha = {"max_fit_rows": max(1, ref.shape[0]) if maha_fit_rows is None else maha_fit_rows}
    cfg = AnalyticsConfig(threshold_k=threshold_k, random_state=random_state, detector_params={"mahalanobis": maha})
    scaler = RobustStandardizer(floors=floors).fit(ref)
    zr, zt = scaler.transform(ref), scaler.transform(test)
    models, margins, flags, scores = {}, {}, {}, {}
    for name in ("zscore", "iforest", "mahalanobis", *(("pca",) if pca else ())):
        if name == "pca":
            m = PCAReconstruction(standardize=False, random_state=random_state,
                                  **({} if threshold_k is None else {"threshold_k": threshold_k})).fit(zr)
        else:
            m = cfg.make_detector(name).fit(zr)
        s = m.score_samples(zt)
        models[name], margins[name], flags[name], scores[name] = m, m.margin(s), scores_to_labels(s, m.threshold_), s
    return Fitted(scaler, models, margins, flags, zt, scores)


def combine(fit: Fitted, spec: Spec, close_gaps: int = 0,
            margins: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(combined margin, flagged) of a combination: any / all / k-th largest margin exactly
    as the pipeline combines, or the mean of the margins (:class:`MeanSpec`); then runs
    of at most ``close_gaps`` unflagged test rows between flagged ones are flagged.
    ``margins``: instead of the fitted ones (see :meth:`Fitted.margins_at`)."""
    mg = fit.margins if margins is None else margins
    if isinstance(spec, MeanSpec):
        comb = scoring.mean_margin([mg[d] for d in spec.detectors])
        return comb, scoring.close_gaps(scores_to_labels(comb, 1.0), close_gaps)
    m = np.vstack([mg[d] for d in spec.detectors])
    rank = {"any": 1, "all": len(spec.detectors), "vote": spec.vote_k}[spec.combine]
    m = np.where(np.isnan(m), -np.inf, m)
    comb = -np.sort(-m, axis=0)[rank - 1]
    return comb, scoring.close_gaps(scores_to_labels(comb, 1.0), close_gaps)


def rank_dims(fit: Fitted, spec: Spec, rows: np.ndarray, dims: Sequence[int], *, mode: str = "row",
              pred: np.ndarray | None = None) -> dict[int, list[int]]:
    """Metric numbers ordered by attribution for each of ``rows``.

    * ``row``: the shares of the detectors of the combination that flagged the row (all
      of them if none did), averaged, as in findings;
    * ``run``: the squared robust z of each metric (the window vs the reference) averaged
      over the flagged run of ``pred`` the row belongs to, from the run's first row up
      to the row (causal);
    * ``incident``: the same over the whole flagged run (known only once it ends)."""
    out: dict[int, list[int]] = {}
    if rows.size == 0:
        return out
    dim_arr = np.asarray(dims)
    if mode in ("run", "incident"):
        if pred is None:
            raise ValueError(f"rank_dims: mode {mode!r} needs the flags (pred)")
        dev = scoring.run_mean(fit.z * fit.z, pred, causal=mode == "run")[rows]
        order = np.argsort(-dev, axis=1, kind="stable")
        return {r: dim_arr[order[i]].tolist() for i, r in enumerate(rows.tolist())}
    if mode != "row":
        raise ValueError(f"rank_dims: mode must be one of {ATTRIBUTIONS}, not {mode!r}")
    groups: dict[tuple[str, ...], list[int]] = {}
    for r in rows.tolist():
        dets = tuple(d for d in spec.detectors if fit.flags[d][r]) or spec.detectors
        groups.setdefault(dets, []).append(r)
    for dets, rs in groups.items():
        z = fit.z[rs]
        shares = attribution.combine_shares([fit.models[d].contributions(z) for d in dets])
        order = np.argsort(-shares, axis=1, kind="stable")
        for i, r in enumerate(rs):
            out[r] = dim_arr[order[i]].tolist()
    return out


@dataclass
class Result:
    machine: str
    config: str
    flagged_share: float
    precision: float
    recall: float
    f1: float
    f1_pa: float
    hit100: float | None
    hit150: float | None
    hit_rows: int
    best_f1_oracle: float


@dataclass
class SweepPoint:
    """Point-wise figures of one combination on one machine at threshold multiplier k."""

    machine: str
    config: str
    k: float
    f1: float
    f1_pa: float
    flagged_share: float


def leave_one_out(points: Sequence[SweepPoint], config: str) -> tuple[float, dict[str, float]]:
    """Leave-one-machine-out F1 of choosing k with the labels: for each machine, the k
    with the best mean F1 over the *other* machines is applied to it. Returns (mean of
    those held-out F1, machine -> k chosen without it). An honest figure for a global k
    picked on these machines."""
    pts = [p for p in points if p.config == config]
    names = list(dict.fromkeys(p.machine for p in pts))
    ks = sorted({p.k for p in pts})
    f1 = {(p.machine, p.k): p.f1 for p in pts}
    held, chosen = [], {}
    for out in names:
        others = [n for n in names if n != out]
        if not others:
            break
        k = max(ks, key=lambda k: (np.mean([f1[(n, k)] for n in others]), -k))
        chosen[out] = k
        held.append(f1[(out, k)])
    return (float(np.mean(held)) if held else float("nan")), chosen


@dataclass
class Run:
    reference: str
    window: int
    threshold_k: float | None
    close_gaps: int = 0
    attribution: str = "row"
    results: list[Result] = field(default_factory=list)
    sweep: list[SweepPoint] = field(default_factory=list)
    seconds: float = 0.0

    def means(self) -> dict[str, dict[str, float | None]]:
        out: dict[str, dict[str, float | None]] = {}
        for cfg in dict.fromkeys(r.config for r in self.results):
            rs = [r for r in self.results if r.config == cfg]
            row: dict[str, float | None] = {}
            for k in ("precision", "recall", "f1", "f1_pa", "hit100", "hit150", "best_f1_oracle", "flagged_share"):
                vals = [getattr(r, k) for r in rs if getattr(r, k) is not None]
                row[k] = float(np.mean(vals)) if vals else None
            out[cfg] = row
        return out


def evaluate_machine(m: Machine, specs: Sequence[Spec], *, reference: str = "all", window: int = DEFAULT_WINDOW,
                     threshold_k: float | None = DEFAULT_THRESHOLD_K, floor_frac: float = 0.01,
                     close_gaps: int = DEFAULT_CLOSE_GAPS, attribution_mode: str = DEFAULT_ATTRIBUTION,
                     k_grid: Sequence[float] = (), sweep: list[SweepPoint] | None = None,
                     random_state: int = 0, maha_fit_rows: int | None = None) -> list[Result]:
    """Score one machine under every combination. Window w covers rows [w, w+window); the
    score of test row r is that of the window ending at r (causal). With ``k_grid``, the
    point-wise figures at each threshold multiplier are appended to ``sweep``."""
    X = m.features.select(feature_columns(m.features)).to_numpy().astype(np.float64)
    n_train_w = max(0, m.n_train - window + 1)  # windows entirely inside train
    first_test_w = m.n_train - window + 1  # window ending at the first test row
    # a window ending at test row r starts at row n_train + r - window + 1
    idx = np.arange(m.n_test) + first_test_w
    ok = (idx >= 0) & (idx < X.shape[0])
    test = np.full((m.n_test, X.shape[1]), np.nan)
    test[ok] = X[idx[ok]]
    # imported metrics have no catalog floor: the smallest change worth noticing is a
    # fraction of each metric's range over the whole unlabelled series
    with np.errstate(all="ignore"):
        span = np.nanmax(X, axis=0) - np.nanmin(X, axis=0)
    floors = floor_frac * np.nan_to_num(span, nan=0.0)
    ref = X[:n_train_w] if reference == "train" else X
    fit = fit_detectors(ref, test, floors, threshold_k=threshold_k, random_state=random_state,
                        pca=any("pca" in s.detectors for s in specs), maha_fit_rows=maha_fit_rows)
    truth = m.labels[: m.n_test]
    out = []
    for spec in specs:
        comb, pred = combine(fit, spec, close_gaps)
        p, r, f = f1_score(pred, truth)
        _, _, fpa = f1_score(point_adjust(pred, truth), truth)
        rows = np.flatnonzero(pred & truth)
        ranked = rank_dims(fit, spec, rows, m.dims, mode=attribution_mode, pred=pred)
        h100, _ = hit_rate(ranked, pred, truth, m.segments, 1.0)
        h150, n_rows = hit_rate(ranked, pred, truth, m.segments, 1.5)
        out.append(Result(m.name, spec.name, float(pred.mean()), p, r, f, fpa, h100, h150, n_rows,
                          best_f1(comb, truth)))
    if sweep is not None:
        for k in k_grid:
            margins = fit.margins_at(k)
            for spec in specs:
                _, pred = combine(fit, spec, close_gaps, margins)
                fpa = f1_score(point_adjust(pred, truth), truth)[2]
                sweep.append(SweepPoint(m.name, spec.name, float(k), f1_score(pred, truth)[2], fpa, float(pred.mean())))
    return out


def run(data: Path = DATA, names: Sequence[str] | None = None, configs: str = DEFAULT_CONFIGS, *,
        reference: str = "all", window: int = DEFAULT_WINDOW, threshold_k: float | None = DEFAULT_THRESHOLD_K,
        floor_frac: float = 0.01, close_gaps: int = DEFAULT_CLOSE_GAPS, attribution_mode: str = DEFAULT_ATTRIBUTION,
        k_grid: Sequence[float] = (), random_state: int = 0, maha_fit_rows: int | None = None,
        rows: int | None = None) -> Run:
    """The whole benchmark (``rows`` limits each file, for tests). ``threshold_k`` None:
    the detectors' own default (4). ``k_grid``: also the point-wise figures at each of
    these threshold multipliers (``Run.sweep``; see :func:`leave_one_out`)."""
    if reference not in ("train", "all"):
        raise ValueError(f"reference must be 'train' or 'all', not {reference!r}")
    if attribution_mode not in ATTRIBUTIONS:
        raise ValueError(f"attribution must be one of {ATTRIBUTIONS}, not {attribution_mode!r}")
    if window < 1 or close_gaps < 0:
        raise ValueError(f"window must be >= 1 and close_gaps >= 0, not {window!r} and {close_gaps!r}")
    specs = parse_specs(configs)
    if any(CHANNEL_DETECTOR in s.detectors for s in specs):
        raise ValueError(f"--configs {configs!r}: Chan is scored with --nested only (see --combos)")
    names = list(names) if names else machines(data)
    if not names:
        raise ValueError(f"no SMD machines with train, test and labels under {data}")
    out = Run(reference, window, threshold_k, close_gaps, attribution_mode)
    t0 = time.perf_counter()
    for name in names:
        with tempfile.TemporaryDirectory(prefix="unveil-smd-") as tmp:
            lake = Path(tmp) / "lake"
            lake.mkdir()
            m = load_machine(data, name, lake, window=window, rows=rows)
            out.results += evaluate_machine(m, specs, reference=reference, window=window, threshold_k=threshold_k,
                                            floor_frac=floor_frac, close_gaps=close_gaps,
                                            attribution_mode=attribution_mode, k_grid=k_grid, sweep=out.sweep,
                                            random_state=random_state, maha_fit_rows=maha_fit_rows)
        log.info("%s done", name)
    out.seconds = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------------- protocols
#
# standard:     fit on the train windows, score every test row against them;
# causal:       test row r is judged against every window that ends before the block of
#               test rows it belongs to (train + the test rows already seen): the detectors
#               (and the metric floors) are refitted every ``refit_every`` test rows, as a
#               scheduled sweep refits on the history it has; never a later row;
# transductive: fit on train + test (the whole unlabelled series; the old ``--reference
#               all``) — a labelled comparison only: it sees the rows it judges.

PROTOCOLS = ("causal", "standard", "transductive")
DEFAULT_PROTOCOL = "causal"
#: causal refit cadence, in test rows (minutes of SMD): once per 4 hours of data
DEFAULT_REFIT_EVERY = 240
SCORED_DETECTORS = ("zscore", "iforest", "mahalanobis")
#: the per-channel tail score (:class:`analytics.scoring.ChannelTail`, ``Chan`` in
#: ``--combos``), scored with the detectors' blocks and references on the windows and
#: their trailing mean over this many minutes (a slow copy: a sustained moderate shift
#: of a bursty metric shows in its hourly mean, not in one 5-min window). Cheap, so not
#: cached: recomputed from the cached features.
CHANNEL_DETECTOR = "chan"
CHANNEL_SLOW = 60


@dataclass
class Scored:
    """One machine scored under one protocol: the raw score of every test row per
    detector, the block (refit) each row was judged in, and per block each detector's
    reference scores (the windows it was fitted on, scored by it) — everything a
    threshold rule needs, so rules and combinations are compared without refitting."""

    machine: str
    protocol: str
    window: int
    labels: np.ndarray
    segments: list[tuple[int, int, frozenset[int]]]
    dims: list[int]
    scores: dict[str, np.ndarray]  # detector -> raw score per test row
    block: np.ndarray  # block index per test row
    refs: list[dict[str, np.ndarray]]  # per block: detector -> finite reference scores
    z: np.ndarray  # each test row standardised against its block's reference
    min_threshold: dict[str, float] = field(default_factory=dict)


def test_matrix(X: np.ndarray, n_train: int, n_test: int, window: int) -> np.ndarray:
    """The window ending at each test row (NaN where there is none)."""
    first_test_w = n_train - window + 1
    idx = np.arange(n_test) + first_test_w
    ok = (idx >= 0) & (idx < X.shape[0])
    test = np.full((n_test, X.shape[1]), np.nan)
    test[ok] = X[idx[ok]]
    return test


def block_bounds(n_test: int, protocol: str, refit_every: int) -> list[tuple[int, int]]:
    """Test row ranges [a, b) judged by one fit."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
    if protocol != "causal":
        return [(0, n_test)]
    if refit_every < 1:
        raise ValueError(f"refit_every must be >= 1, not {refit_every!r}")
    return [(a, min(a + refit_every, n_test)) for a in range(0, n_test, refit_every)]


def reference_rows(X: np.ndarray, n_train: int, window: int, protocol: str, first_row: int,
                   span: int | None = None) -> np.ndarray:
    """The windows a block starting at test row ``first_row`` is fitted on: those that
    end before it (causal; ``first_row`` 0 = the train windows, = standard), or all.
    ``span`` (causal only): the most recent ``span`` of them (None: all)."""
    if protocol == "transductive":
        return X
    end = max(0, n_train - window + 1 + (first_row if protocol == "causal" else 0))
    start = max(0, end - span) if span is not None and protocol == "causal" else 0
    return X[start:end]


def score_protocol(X: np.ndarray, n_train: int, n_test: int, window: int, *, protocol: str = DEFAULT_PROTOCOL,
                   refit_every: int = DEFAULT_REFIT_EVERY, span: int | None = None, floor_frac: float = 0.01,
                   random_state: int = 0, maha_fit_rows: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray,
                                                              list[dict[str, np.ndarray]], np.ndarray, dict[str, float]]:
    """(scores, block, refs, z, min_threshold) of :class:`Scored` for a window matrix ``X``.
    The metric floors (``floor_frac`` of each metric's range) come from the reference
    of each block, so the causal protocol never reads a later row."""
    test = test_matrix(X, n_train, n_test, window)
    scores = {d: np.full(n_test, np.nan) for d in SCORED_DETECTORS}
    z = np.full(test.shape, np.nan)
    block = np.zeros(n_test, dtype=np.int64)
    refs: list[dict[str, np.ndarray]] = []
    mins: dict[str, float] = {}
    for i, (a, b) in enumerate(block_bounds(n_test, protocol, refit_every)):
        ref = reference_rows(X, n_train, window, protocol, a, span)
        if ref.shape[0] < 2:
            raise ValueError(f"protocol {protocol}: block at test row {a} has {ref.shape[0]} reference windows")
        with np.errstate(all="ignore"):
            rng = np.nanmax(ref, axis=0) - np.nanmin(ref, axis=0)
        fit = fit_detectors(ref, test[a:b], floor_frac * np.nan_to_num(rng, nan=0.0), threshold_k=None,
                            random_state=random_state, maha_fit_rows=maha_fit_rows)
        refs.append({})
        for d in SCORED_DETECTORS:
            scores[d][a:b] = fit.scores[d]
            r = np.asarray(fit.models[d].reference_scores_, dtype=np.float64)
            refs[-1][d] = np.sort(r[np.isfinite(r)]).astype(np.float32)
            mins[d] = float(fit.models[d]._min_threshold)
        z[a:b] = fit.z
        block[a:b] = i
    return scores, block, refs, z, mins


def channel_scores(X: np.ndarray, n_train: int, n_test: int, window: int, *, protocol: str = DEFAULT_PROTOCOL,
                   refit_every: int = DEFAULT_REFIT_EVERY, span: int | None = None, slow: int = CHANNEL_SLOW,
                   floor_frac: float = 0.01) -> tuple[np.ndarray, list[np.ndarray]]:
    """(score per test row, sorted reference scores per block) of the per-channel tail
    score (:class:`analytics.scoring.ChannelTail`) on the windows and their trailing
    mean over ``slow`` rows, fitted on the same blocks and references as the detectors
    (:func:`score_protocol`): the causal protocol never reads a later row."""
    F = np.hstack([X, scoring.rolling_mean(X, slow)]) if slow > 1 else X
    test = test_matrix(F, n_train, n_test, window)
    out = np.full(n_test, np.nan)
    refs: list[np.ndarray] = []
    for a, b in block_bounds(n_test, protocol, refit_every):
        ref = reference_rows(F, n_train, window, protocol, a, span)
        with np.errstate(all="ignore"):
            rng = np.nanmax(ref, axis=0) - np.nanmin(ref, axis=0)
        ct = scoring.ChannelTail(floors=floor_frac * np.nan_to_num(rng, nan=0.0)).fit(ref)
        out[a:b] = np.where(np.isnan(test[a:b]).all(axis=1), np.nan, ct.score_samples(test[a:b]))
        refs.append(np.sort(ct.reference_scores_))
    return out, refs


def scored_machine(data: Path, name: str, *, protocol: str = DEFAULT_PROTOCOL, window: int = DEFAULT_WINDOW,
                   refit_every: int = DEFAULT_REFIT_EVERY, span: int | None = None, random_state: int = 0,
                   resample: int = 1, rows: int | None = None, cache: Path | None = None) -> Scored:
    """Import, featurise and score one machine (cached under ``cache`` when given).
    ``resample``: average every ``resample`` raw rows first (SMD at a coarser period;
    ``window``, ``refit_every`` and ``span`` are then counted in resampled rows). The
    per-channel tail score (:data:`CHANNEL_DETECTOR`) is added from the features."""
    key = f"{name}-{_source(data)}-{protocol}-w{window}-r{refit_every}-p{span}-s{random_state}-x{resample}-n{rows}"
    path = cache / f"{key}.npz" if cache is not None else None
    X, n_train, n_test, labels, dims, segments = _features(data, name, window=window, resample=resample, rows=rows,
                                                           cache=cache)
    if path is not None and path.is_file():
        s = _load_scored(path)
    else:
        scores, block, refs, z, mins = score_protocol(X, n_train, n_test, window, protocol=protocol,
                                                      refit_every=refit_every, span=span, random_state=random_state)
        s = Scored(name, protocol, window, labels, segments, dims, scores, block, refs, z.astype(np.float32), mins)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            _save_scored(path, s)
    chan, chan_refs = channel_scores(X, n_train, n_test, window, protocol=protocol, refit_every=refit_every, span=span,
                                     slow=max(1, round(CHANNEL_SLOW / resample)))
    s.scores[CHANNEL_DETECTOR] = chan
    for ref, r in zip(s.refs, chan_refs, strict=True):
        ref[CHANNEL_DETECTOR] = r.astype(np.float32)
    return s


def _source(data: Path) -> str:
    """A short name of the dataset directory for cache keys (two datasets may name their
    machines alike)."""
    return hashlib.sha1(str(data.resolve()).encode()).hexdigest()[:8]


def _features(data: Path, name: str, *, window: int, resample: int, rows: int | None, cache: Path | None
              ) -> tuple[np.ndarray, int, int, np.ndarray, list[int], list[tuple[int, int, frozenset[int]]]]:
    """(window matrix, n_train, n_test, labels, dims, segments) of one machine, cached."""
    fpath = cache / f"{name}-{_source(data)}-w{window}-x{resample}-n{rows}.features.npz" if cache is not None else None
    if fpath is not None and fpath.is_file():
        with np.load(fpath) as f:
            X, n_train, n_test, labels = f["X"], int(f["n_train"]), int(f["n_test"]), f["labels"]
            meta = json.loads(f["meta"].tobytes().decode())
            dims, segments = meta["dims"], [(a, b, frozenset(g)) for a, b, g in meta["segments"]]
    else:
        with tempfile.TemporaryDirectory(prefix="unveil-smd-") as tmp:
            lake = Path(tmp) / "lake"
            lake.mkdir()
            src = data
            if resample > 1:
                src = resample_data(data, name, Path(tmp) / "data", resample, rows=rows)
            m = load_machine(src, name, lake, window=window, rows=None if resample > 1 else rows)
        X = m.features.select(feature_columns(m.features)).to_numpy().astype(np.float64)
        n_train, n_test, labels, dims, segments = m.n_train, m.n_test, m.labels[: m.n_test], m.dims, m.segments
        if fpath is not None:
            fpath.parent.mkdir(parents=True, exist_ok=True)
            meta_b = json.dumps({"dims": dims, "segments": [[a, b, sorted(g)] for a, b, g in segments]}).encode()
            np.savez(fpath, X=X, n_train=n_train, n_test=n_test, labels=labels,
                     meta=np.frombuffer(meta_b, dtype=np.uint8))
    return X, n_train, n_test, labels, dims, segments


def _save_scored(path: Path, s: Scored) -> None:
    arrays: dict[str, Any] = {"labels": s.labels, "block": s.block, "z": s.z}  # (np.savez: **kwds)
    for d in SCORED_DETECTORS:
        arrays[f"score.{d}"] = s.scores[d]
    for i, ref in enumerate(s.refs):
        for d in SCORED_DETECTORS:
            arrays[f"ref.{i}.{d}"] = ref[d]
    meta = {"machine": s.machine, "protocol": s.protocol, "window": s.window, "dims": s.dims,
            "segments": [[a, b, sorted(g)] for a, b, g in s.segments], "n_blocks": len(s.refs),
            "min_threshold": s.min_threshold}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def _load_scored(path: Path) -> Scored:
    with np.load(path) as f:
        meta = json.loads(f["meta"].tobytes().decode())
        scores = {d: f[f"score.{d}"] for d in SCORED_DETECTORS}
        refs = [{d: f[f"ref.{i}.{d}"] for d in SCORED_DETECTORS} for i in range(meta["n_blocks"])]
        return Scored(meta["machine"], meta["protocol"], meta["window"], f["labels"],
                      [(a, b, frozenset(g)) for a, b, g in meta["segments"]], meta["dims"], scores, f["block"],
                      refs, f["z"], meta["min_threshold"])


def resample_data(data: Path, name: str, out: Path, factor: int, *, rows: int | None = None) -> Path:
    """SMD of one machine at ``factor`` times its period: the mean of each ``factor``
    consecutive rows (a trailing partial group is dropped), a resampled row labelled when
    any of its rows is, interpretation segments mapped onto the resampled rows."""
    for sub in ("train", "test", "test_label", "interpretation_label"):
        (out / sub).mkdir(parents=True, exist_ok=True)

    def load(path: Path) -> np.ndarray:
        x = np.loadtxt(path, delimiter=",", ndmin=2, max_rows=rows)
        n = x.shape[0] // factor * factor
        return np.asarray(x[:n].reshape(-1, factor, x.shape[1]).mean(axis=1))

    for sub in ("train", "test"):
        np.savetxt(out / sub / f"{name}.txt", load(data / sub / f"{name}.txt"), delimiter=",", fmt="%.6g")
    lab = np.loadtxt(data / "test_label" / f"{name}.txt", dtype=np.int64, max_rows=rows)
    n = lab.size // factor * factor
    np.savetxt(out / "test_label" / f"{name}.txt", lab[:n].reshape(-1, factor).max(axis=1), fmt="%d")
    lines = [f"{a // factor}-{max(a // factor + 1, -(-b // factor))}:{','.join(map(str, sorted(g)))}"
             for a, b, g in read_segments(data / "interpretation_label" / f"{name}.txt") if a < n]
    (out / "interpretation_label" / f"{name}.txt").write_text("\n".join(lines) + ("\n" if lines else ""))
    return out


# ----------------------------------------------------------------- threshold rules


@dataclass(frozen=True)
class Rule:
    """A label-free threshold from a detector's reference scores:

    * ``mad`` (a = k): median + k·MAD of the log scores, with the low-end rule;
    * ``pot`` (a = initial level, b = risk): peaks over threshold — a generalised Pareto
      tail fitted to the log scores above their ``a`` quantile, the threshold where the
      tail's exceedance probability is ``b`` per window;
    * ``quantile`` (a = budget): the reference's ``1 - a`` quantile (an alert budget: about
      a share ``a`` of healthy windows flagged, e.g. 0.01 = 14 min per host-day).
    * ``tail`` (a = budget, b = width): the budget's quantile pushed out by b tail widths
      (log scale: ``Q(1-a) + b·(Q(1-a) - median)``);
    * ``either`` (a = k, b = budget): the lower of ``mad:a`` and ``quantile:b``.

    Each is :class:`analytics.detectors.ThresholdRule` (what the pipeline runs), with
    the multiplier k of ``mad`` made part of the rule."""

    kind: str
    a: float
    b: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.a:g}" + (f":{self.b:g}" if self.kind in ("pot", "tail", "either") else "")

    @property
    def detector_rule(self) -> ThresholdRule:
        if self.kind == "pot":
            return ThresholdRule("pot", level=self.a, risk=self.b)
        if self.kind == "tail":
            return ThresholdRule("tail", share=self.a, width=self.b)
        if self.kind == "either":
            return ThresholdRule("either", share=self.b)
        return ThresholdRule("quantile", share=self.a) if self.kind == "quantile" else ThresholdRule()

    def threshold(self, ref: np.ndarray) -> float:
        return self.detector_rule.threshold(ref, self.a if self.kind in ("mad", "either") else 4.0)


def parse_rule(text: str) -> Rule:
    """``mad:8``, ``quantile:0.01``, ``pot:0.98:1e-4``, ``tail:0.01:1``, ``either:10:0.01``."""
    parts = text.strip().split(":")
    try:
        if parts[0] in ("mad", "quantile") and len(parts) == 2:
            rule = Rule(parts[0], float(parts[1]))
        elif parts[0] in ("pot", "tail", "either") and len(parts) == 3:
            rule = Rule(parts[0], float(parts[1]), float(parts[2]))
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"threshold rule {text!r}: use mad:K, quantile:SHARE, pot:LEVEL:RISK, tail:SHARE:WIDTH "
                         "or either:K:SHARE") from None
    if (not rule.a > 0 or (rule.kind not in ("mad", "either") and not rule.a < 1) or (rule.kind == "pot" and not 0 < rule.b < 1)
            or (rule.kind == "tail" and not (math.isfinite(rule.b) and rule.b >= 0))
            or (rule.kind == "either" and not 0 < rule.b < 1)):
        raise ValueError(f"threshold rule {text!r}: parameter out of range")
    return rule


DEFAULT_COMBOS = "mean(IF,Maha)|mean(Z,IF,Maha)|Maha|mean(Maha,Chan)|mean(IF,Maha,Chan)"
DEFAULT_RULES = ("mad:6|mad:7|mad:8|mad:9|mad:10|mad:12|quantile:0.005|quantile:0.01|quantile:0.02|quantile:0.04"
                 "|pot:0.98:1e-3|pot:0.98:1e-4|pot:0.99:1e-3|pot:0.99:1e-4|pot:0.95:1e-4"
                 "|tail:0.01:0.25|tail:0.01:0.5|tail:0.01:1|tail:0.02:0.25|tail:0.02:0.5|tail:0.02:1"
                 "|tail:0.05:0.25|tail:0.05:0.5|tail:0.05:1"
                 "|either:8:0.005|either:8:0.01|either:8:0.02|either:9:0.005|either:9:0.01|either:9:0.02"
                 "|either:10:0.005|either:10:0.01|either:10:0.02")


def rule_margins(s: Scored, rule: Rule) -> dict[str, np.ndarray]:
    """Each detector's margin per test row with its threshold set by ``rule`` on the
    reference of the row's block (reference median 0, threshold 1)."""
    out = {}
    for d in s.scores:
        thr = np.array([max(rule.threshold(r[d]), s.min_threshold.get(d, -np.inf)) for r in s.refs])
        med = np.array([float(np.median(r[d])) if r[d].size else 0.0 for r in s.refs])
        span = (thr - med)[s.block]
        sc = s.scores[d]
        with np.errstate(all="ignore"):
            m = np.where(np.isfinite(span) & (span > 0), (sc - med[s.block]) / span,
                         np.where(sc > thr[s.block], np.inf, 0.0))
        out[d] = np.where(np.isnan(sc), np.nan, m)
    return out


@dataclass(frozen=True)
class Setting:
    """Every constant of a label-free detection: window (rows), combination (mean of
    these detectors' margins), threshold rule, gap closing (rows), attribution."""

    window: int
    detectors: tuple[str, ...]
    rule: Rule
    close_gaps: int
    attribution: str = DEFAULT_ATTRIBUTION
    span: int | None = None  # causal reference: the most recent windows (None: all)

    @property
    def key(self) -> tuple[int, int | None]:
        """What the scores depend on: (window, span)."""
        return self.window, self.span

    @property
    def name(self) -> str:
        short = {"zscore": "Z", "iforest": "IF", "mahalanobis": "Maha", CHANNEL_DETECTOR: "Chan"}
        return (f"w{self.window}{'' if self.span is None else f' ref{self.span}'} "
                f"mean({','.join(short[d] for d in self.detectors)}) {self.rule.name} "
                f"gaps{self.close_gaps} {self.attribution}")


def flags_of(s: Scored, margins: dict[str, np.ndarray], detectors: Sequence[str], close_gaps: int
             ) -> tuple[np.ndarray, np.ndarray]:
    comb = scoring.mean_margin([margins[d] for d in detectors])
    return comb, scoring.close_gaps(scores_to_labels(comb, 1.0), close_gaps)


def oracle_f1(comb: np.ndarray, truth: np.ndarray, close_gaps: int, n: int = 200) -> float:
    """F1*: the best point-wise F1 of the same combined score and gap closing over
    thresholds chosen with the labels (isolates the threshold from the ranking)."""
    finite = comb[np.isfinite(comb)]
    if finite.size == 0:
        return 0.0
    qs = np.unique(np.quantile(finite, 1.0 - np.geomspace(1.0, 1e-4, n)))
    return max(f1_score(scoring.close_gaps(scores_to_labels(comb, q), close_gaps), truth)[2] for q in qs)


def judge(s: Scored, setting: Setting, margins: dict[str, np.ndarray] | None = None, *,
          oracle: bool = True) -> Result:
    """The figures of one machine under one setting."""
    mg = rule_margins(s, setting.rule) if margins is None else margins
    comb, pred = flags_of(s, mg, setting.detectors, setting.close_gaps)
    truth = s.labels
    p, r, f = f1_score(pred, truth)
    fpa = f1_score(point_adjust(pred, truth), truth)[2]
    rows = np.flatnonzero(pred & truth)
    fit = Fitted(RobustStandardizer(), {}, {}, {}, np.nan_to_num(s.z.astype(np.float64)))
    ranked = rank_dims(fit, MeanSpec("", setting.detectors), rows, s.dims, mode=setting.attribution, pred=pred)
    h100, _ = hit_rate(ranked, pred, truth, s.segments, 1.0)
    h150, n_rows = hit_rate(ranked, pred, truth, s.segments, 1.5)
    star = oracle_f1(comb, truth, setting.close_gaps) if oracle else float("nan")
    return Result(s.machine, setting.name, float(pred.mean()), p, r, f, fpa, h100, h150, n_rows, star)


def grid_f1(scored: dict[tuple[str, int, int | None], Scored], settings: Sequence[Setting]) -> dict[tuple[str, Setting], float]:
    """Point-wise F1 of every (machine, setting); ``scored`` maps (machine, window) to
    its scores. Margins are computed once per (machine, window, rule)."""
    out: dict[tuple[str, Setting], float] = {}
    by_mwr: dict[tuple[str, int, int | None, Rule], list[Setting]] = {}
    for (name, w, p) in scored:
        for st in settings:
            if st.key == (w, p):
                by_mwr.setdefault((name, w, p, st.rule), []).append(st)
    for (name, w, p, rule), sts in by_mwr.items():
        s = scored[(name, w, p)]
        mg = rule_margins(s, rule)
        for st in sts:
            out[(name, st)] = f1_score(flags_of(s, mg, st.detectors, st.close_gaps)[1], s.labels)[2]
    return out


def select(f1: dict[tuple[str, Setting], float], names: Sequence[str], settings: Sequence[Setting]) -> Setting:
    """The setting with the best mean F1 over ``names`` (the first of equals)."""
    best, best_v = settings[0], -1.0
    for st in settings:
        v = float(np.mean([f1[(n, st)] for n in names]))
        if v > best_v + 1e-12:
            best, best_v = st, v
    return best


def select_attribution(scored: dict[tuple[str, int, int | None], Scored], names: Sequence[str], st: Setting) -> Setting:
    """The attribution with the best mean HitRate@150 % over ``names`` at setting ``st``."""
    best, best_v = st, -1.0
    for mode in ("run", "incident", "row"):
        if mode == "row":
            continue  # needs the fitted models' shares, not cached; measured worse (docs/smd.md)
        cand = Setting(st.window, st.detectors, st.rule, st.close_gaps, mode, st.span)
        hs = [judge(scored[(n, *st.key)], cand, oracle=False).hit150 for n in names]
        v = float(np.mean([h for h in hs if h is not None])) if any(h is not None for h in hs) else 0.0
        if v > best_v + 1e-12:
            best, best_v = cand, v
    return best


def nested(scored: dict[tuple[str, int, int | None], Scored], settings: Sequence[Setting], held_out: Sequence[Sequence[str]],
           *, apply_to: dict[tuple[str, int, int | None], Scored] | None = None, factor: int = 1
           ) -> list[tuple[Result, Setting]]:
    """For each group of held-out machines, the whole selection (window, combination,
    threshold rule and parameters, gap closing; then attribution by HitRate) runs on the
    other machines; the chosen setting is judged on the group (in ``apply_to`` when given:
    the same machines resampled by ``factor``, the setting mapped onto its rows by
    :func:`rescale`)."""
    f1 = grid_f1(scored, settings)
    names = list(dict.fromkeys(k[0] for k in scored))
    out = []
    for group in held_out:
        train = [n for n in names if n not in group]
        if not train:
            raise ValueError(f"nested: holding out {list(group)} leaves no machine to choose the setting on")
        st = select_attribution(scored, train, select(f1, train, settings))
        if apply_to is not None:
            st = rescale(st, factor)
        for n in group:
            out.append((judge((apply_to or scored)[(n, *st.key)], st), st))
    return out


def rescale(st: Setting, factor: int) -> Setting:
    """A setting counted in rows of a series ``factor`` times coarser (the same minutes;
    the threshold rule is per window, unchanged)."""
    return Setting(max(1, round(st.window / factor)), st.detectors, st.rule, round(st.close_gaps / factor),
                   st.attribution, None if st.span is None else max(1, round(st.span / factor)))


def group_of(name: str) -> str:
    """SMD's machine group: ``machine-2-7`` -> ``2-x``."""
    parts = name.split("-")
    return f"{parts[1]}-x" if len(parts) == 3 else name


def settings_grid(windows: Sequence[int], combos: Sequence[tuple[str, ...]], rules: Sequence[Rule],
                  gaps: Sequence[int], spans: Sequence[int | None] = (None,)) -> list[Setting]:
    return [Setting(w, c, r, g, DEFAULT_ATTRIBUTION, p)
            for w in windows for p in spans for c in combos for r in rules for g in gaps]


def parse_combos(text: str) -> list[tuple[str, ...]]:
    """``mean(IF,Maha)|Maha``: the detectors whose margins are averaged."""
    out = []
    for spec in parse_specs(text):
        if not isinstance(spec, MeanSpec) or "pca" in spec.detectors:
            dets = spec.detectors if isinstance(spec, ComboSpec) and len(spec.detectors) == 1 else None
            if dets is None:
                raise ValueError(f"--combos: {spec.name!r}: only mean(...) of Z, IF, Maha, Chan or one detector")
            out.append(tuple(dets))
        else:
            out.append(spec.detectors)
    return out


def result_table(rows: Sequence[tuple[Result, Setting]], setting: str = "setting (chosen without this machine)") -> str:
    head = (f"{'machine':<13}{'flag%':>7}{'P':>7}{'R':>7}{'F1':>7}{'F1-PA':>7}{'Hit@100':>9}{'Hit@150':>9}"
            f"{'rows':>6}{'F1*':>7}{'F1/F1*':>8}  {setting}")
    lines = [head, "-" * len(head)]
    for r, st in rows:
        ratio = r.f1 / r.best_f1_oracle if r.best_f1_oracle > 0 else float("nan")
        lines.append(f"{r.machine:<13}{100 * r.flagged_share:>6.1f}%{_f(r.precision):>7}{_f(r.recall):>7}{_f(r.f1):>7}"
                     f"{_f(r.f1_pa):>7}{_f(r.hit100):>9}{_f(r.hit150):>9}{r.hit_rows:>6}{_f(r.best_f1_oracle):>7}"
                     f"{ratio:>8.2f}  {st.name}")
    res = [r for r, _ in rows]
    lines.append("-" * len(head))

    def mean(k: str) -> float | None:
        v = [getattr(r, k) for r in res if getattr(r, k) is not None]
        return float(np.mean(v)) if v else None

    f1, star = mean("f1"), mean("best_f1_oracle")
    ratio = (f1 / star) if f1 is not None and star else float("nan")
    lines.append(f"{'MEAN':<13}{100 * (mean('flagged_share') or 0):>6.1f}%{_f(mean('precision')):>7}"
                 f"{_f(mean('recall')):>7}{_f(f1):>7}{_f(mean('f1_pa')):>7}{_f(mean('hit100')):>9}"
                 f"{_f(mean('hit150')):>9}{'':>6}{_f(star):>7}{ratio:>8.2f}")
    groups = {g: [r for r in res if group_of(r.machine) == g] for g in dict.fromkeys(group_of(r.machine) for r in res)}
    if len(groups) == len(res):
        return "\n".join(lines)  # (a group of one machine each: their own rows)
    for g, rg in groups.items():
        f, s = float(np.mean([r.f1 for r in rg])), float(np.mean([r.best_f1_oracle for r in rg]))
        lines.append(f"{'group ' + g:<13}{'':>7}{'':>7}{'':>7}{f:>7.3f}{'':>7}{'':>9}{'':>9}{'':>6}{s:>7.3f}"
                     f"{(f / s if s else float('nan')):>8.2f}")
    return "\n".join(lines)


def rule_table(scored: dict[tuple[str, int, int | None], Scored], settings: Sequence[Setting]) -> str:
    """Mean F1 over machines of every threshold rule at each (window, combination, gaps)
    of the grid's best: how much each rule family gives when its own parameter is best
    for these machines (in-sample; for comparing rules, not a headline)."""
    f1 = grid_f1(scored, settings)
    names = list(dict.fromkeys(k[0] for k in scored))
    lines = [f"{'setting':<48}{'mean F1':>8}" + "".join(f"{n[8:]:>7}" for n in names), "-" * (56 + 7 * len(names))]
    ranked = sorted(settings, key=lambda st: -float(np.mean([f1[(n, st)] for n in names])))
    seen: set[str] = set()
    for st in ranked:
        if st.rule.kind in seen:
            continue
        seen.add(st.rule.kind)
        lines.append(f"{st.name:<48}{np.mean([f1[(n, st)] for n in names]):>8.3f}"
                     + "".join(f"{f1[(n, st)]:>7.3f}" for n in names))
    return "\n".join(lines)


# ------------------------------------------------------------------------ output


def _f(x: float | None) -> str:
    return "  n/a" if x is None else f"{x:.3f}"


def table(res: Run) -> str:
    head = f"{'machine':<13}{'config':<19}{'flag%':>7}{'P':>7}{'R':>7}{'F1':>7}{'F1-PA':>7}{'Hit@100':>9}{'Hit@150':>9}{'rows':>6}{'F1*':>7}"
    lines = [head, "-" * len(head)]
    for r in res.results:
        lines.append(f"{r.machine:<13}{r.config:<19}{100 * r.flagged_share:>6.1f}%{_f(r.precision):>7}{_f(r.recall):>7}"
                     f"{_f(r.f1):>7}{_f(r.f1_pa):>7}{_f(r.hit100):>9}{_f(r.hit150):>9}{r.hit_rows:>6}{_f(r.best_f1_oracle):>7}")
    lines.append("-" * len(head))
    for cfg, m in res.means().items():
        fs = m["flagged_share"] or 0.0
        lines.append(f"{'MEAN':<13}{cfg:<19}{100 * fs:>6.1f}%{_f(m['precision']):>7}{_f(m['recall']):>7}{_f(m['f1']):>7}"
                     f"{_f(m['f1_pa']):>7}{_f(m['hit100']):>9}{_f(m['hit150']):>9}{'':>6}{_f(m['best_f1_oracle']):>7}")
    return "\n".join(lines)


def sweep_table(res: Run) -> str:
    """Mean point-wise F1 (and flagged share) per combination and k, with the
    leave-one-machine-out F1 of choosing k on the other machines."""
    ks = sorted({p.k for p in res.sweep})
    head = f"{'config':<19}" + "".join(f"{'k=' + format(k, 'g'):>8}" for k in ks) + f"{'LOO F1':>8}"
    lines = [head, "-" * len(head)]
    for cfg in dict.fromkeys(p.config for p in res.sweep):
        cells = [np.mean([p.f1 for p in res.sweep if p.config == cfg and p.k == k]) for k in ks]
        loo, _ = leave_one_out(res.sweep, cfg)
        lines.append(f"{cfg:<19}" + "".join(f"{c:>8.3f}" for c in cells) + f"{loo:>8.3f}")
    return "\n".join(lines)


#: the setting every leave-one-machine-out fold chose (causal protocol, 990 settings; docs/smd.md,
#: third round): what this benchmark ships as its label-free default for other data
SHIPPED = Setting(DEFAULT_WINDOW, ("mahalanobis",), Rule("quantile", 0.02), 30, "incident", None)


def main_nested(args: argparse.Namespace) -> int:
    """``--nested``: the protocol's scores (cached), every setting of the grid, and the
    nested selections: leave one machine out, leave one group out, and (``--transfer``)
    leave one group out applied to the group resampled at a coarser period."""
    names = list(args.machines) if args.machines else machines(args.data)
    windows = args.windows or [DEFAULT_WINDOW]
    rules = [parse_rule(r) for r in args.rules.split("|") if r.strip()]
    combos = parse_combos(args.combos)
    spans = args.spans if args.protocol == "causal" else [None]
    settings = settings_grid(windows, combos, rules, args.gaps, spans)
    t0 = time.perf_counter()
    scored = {(n, w, p): scored_machine(args.data, n, protocol=args.protocol, window=w, refit_every=args.refit_every,
                                        span=p, random_state=args.seed, cache=args.cache)
              for w in windows for p in spans for n in names}
    _out(f"SMD, protocol {args.protocol}" + (f" (refit every {args.refit_every} test rows)" if args.protocol == "causal"
                                              else "") + f": {len(names)} machines, {len(settings)} settings "
         f"(windows {windows}, {len(combos)} combinations, {len(rules)} threshold rules, gaps {args.gaps})")
    default = Setting(DEFAULT_WINDOW, ("iforest", "mahalanobis"), Rule("mad", DEFAULT_THRESHOLD_K), DEFAULT_CLOSE_GAPS,
                      DEFAULT_ATTRIBUTION, spans[0])
    if (names[0], *default.key) in scored:
        _out(f"\nThe previous fixed default ({default.name}), same protocol:")
        _out(result_table([(judge(scored[(n, *default.key)], default), default) for n in names]))
    _out("\nBest setting of each threshold rule family over all machines (in-sample, for comparing rules):")
    _out(rule_table(scored, settings))
    _out("\nNested leave-one-machine-out (each row's setting chosen on the other machines' labels):")
    loo = nested(scored, settings, [[n] for n in names])
    _out(result_table(loo))
    groups = list(dict.fromkeys(group_of(n) for n in names))
    by_group = [[n for n in names if group_of(n) == g] for g in groups]
    if len(groups) > 1:
        _out("\nLeave one group out (setting chosen on the other groups' machines):")
        _out(result_table(nested(scored, settings, by_group)))
    if args.transfer > 1:
        coarse = {(n, *k): scored_machine(args.data, n, protocol=args.protocol, window=k[0],
                                          refit_every=max(1, round(args.refit_every / args.transfer)), span=k[1],
                                          random_state=args.seed, resample=args.transfer, cache=args.cache)
                  for k in dict.fromkeys(rescale(st, args.transfer).key for st in settings) for n in names}
        _out(f"\nTransfer: setting chosen at 1 min on the other groups, applied to the held-out group resampled "
             f"to {args.transfer} min:")
        _out(result_table(nested(scored, settings, by_group if len(groups) > 1 else [names], apply_to=coarse,
                                 factor=args.transfer)))
        for label, st in (("previous fixed default", default), ("shipped default", SHIPPED)):
            d = rescale(st, args.transfer)
            if (names[0], *d.key) in coarse:
                _out(f"\nThe {label} at {args.transfer} min"
                     + (" (its constants saw these machines' 1-min labels: a check of the resolution only)"
                        if st is SHIPPED else "") + ":")
                _out(result_table([(judge(coarse[(n, *d.key)], d), d) for n in names]))
    _out(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


def main_shipped(args: argparse.Namespace) -> int:
    """:data:`SHIPPED` under the causal protocol on every machine of ``--data``, its
    constants (counted in 1-min rows) mapped onto rows of ``--period`` minutes: the
    label-free default on data it has not seen. Labels are read for the figures only."""
    if args.period < 1:
        raise SystemExit(f"--period must be a whole number of minutes >= 1, not {args.period}")
    names = list(args.machines) if args.machines else machines(args.data)
    if not names:
        raise SystemExit(f"{args.data}: no machine with train/, test/ and test_label/ files (SMD's layout, "
                         "docs/smd.md)")
    st = rescale(SHIPPED, args.period)
    refit = max(1, round(args.refit_every / args.period))
    t0 = time.perf_counter()
    rows = [(judge(scored_machine(args.data, n, protocol="causal", window=st.window, refit_every=refit,
                                  span=st.span, random_state=args.seed, cache=args.cache), st), st) for n in names]
    _out(f"The shipped default ({SHIPPED.name}, at 1 min) on {len(names)} machines of {args.data}, rows of "
         f"{args.period} min: {st.name}, causal protocol (refit every {refit} test rows)")
    if args.data.resolve() == DATA.resolve():
        _out("(these are SMD machines, the setting was chosen on their labels: in-sample, not held out)")
    _out(result_table(rows, "setting"))
    _out("F1* = the same score's best point-wise F1 over thresholds chosen WITH the labels (oracle); "
         "F1/F1* = what the label-free threshold keeps of it")
    _out(f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        res = [r for r, _ in rows]
        f1, star = float(np.mean([r.f1 for r in res])), float(np.mean([r.best_f1_oracle for r in res]))
        args.json.write_text(json.dumps({"setting": st.name, "period_min": args.period, "refit_every": refit,
                                         "results": [asdict(r) for r in res],
                                         "mean_f1": f1, "mean_f1_oracle": star,
                                         "f1_over_oracle": f1 / star if star else None}, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--data", type=Path, default=DATA, help="SMD directory (default %(default)s)")
    ap.add_argument("--machines", nargs="+", help="machine names (default: all with train/test/labels)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="detector combinations (default %(default)s)")
    ap.add_argument("--reference", choices=["train", "all"], default="all",
                    help="fit on the train windows, or on train+test, both unlabelled (default %(default)s)")
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                    help="window length in rows (minutes), stride 1 (default %(default)s)")
    ap.add_argument("--threshold-k", type=float, default=DEFAULT_THRESHOLD_K,
                    help="threshold multiplier of every detector (default %(default)s; 0: the detectors' own, 4)")
    ap.add_argument("--close-gaps", type=int, default=DEFAULT_CLOSE_GAPS,
                    help="flag runs of at most this many unflagged rows between flagged ones (default %(default)s)")
    ap.add_argument("--attribution", choices=ATTRIBUTIONS, default=DEFAULT_ATTRIBUTION,
                    help="rank metrics per row (detector shares), over the flagged run so far, or over the whole "
                         "flagged run (default %(default)s)")
    ap.add_argument("--floor-frac", type=float, default=0.01,
                    help="scale floor of each metric as a fraction of its range (default %(default)s)")
    ap.add_argument("--k-grid", type=lambda t: [float(x) for x in t.split(",") if x.strip()], default=[],
                    help="also print mean point-wise F1 at these threshold multipliers, e.g. 6,7,8,9,10, with the "
                         "leave-one-machine-out F1 of choosing k with the labels")
    ap.add_argument("--seed", type=int, default=0, help="random state of the detectors (default %(default)s)")
    ap.add_argument("--maha-fit-rows", type=int, default=None,
                    help="fit the Mahalanobis covariance on this many random reference windows (default: all; "
                         "the detector's own default is 2000)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    nest = ap.add_argument_group("protocols and nested selection (--nested)")
    nest.add_argument("--nested", action="store_true",
                      help="score under --protocol and choose every constant by nested leave-one-out")
    nest.add_argument("--protocol", choices=PROTOCOLS, default=DEFAULT_PROTOCOL, help="(default %(default)s)")
    nest.add_argument("--refit-every", type=int, default=DEFAULT_REFIT_EVERY,
                      help="causal protocol: refit every this many test rows (default %(default)s)")
    nest.add_argument("--windows", type=lambda t: [int(x) for x in t.split(",") if x.strip()], default=[],
                      help="window lengths to choose from, rows (default: 5)")
    nest.add_argument("--rules", default=DEFAULT_RULES, help="threshold rules to choose from (default %(default)s)")
    nest.add_argument("--combos", default=DEFAULT_COMBOS,
                      help="combinations to choose from (default %(default)s)")
    nest.add_argument("--gaps", type=lambda t: [int(x) for x in t.split(",") if x.strip()], default=[0, 30],
                      help="gap closings to choose from, rows (default 0,30)")
    nest.add_argument("--spans", type=lambda t: [None if x.strip() == "all" else int(x) for x in t.split(",")
                                                 if x.strip()], default=[None, 20160, 10080],
                      help="causal reference lengths to choose from, windows ('all': every window before, or "
                      "a number: the most recent ones; default all,20160,10080: all, two weeks, one week)")
    nest.add_argument("--transfer", type=int, default=0,
                      help="also apply each group's choice to the group resampled this many times coarser")
    nest.add_argument("--cache", type=Path, help="cache the per-machine scores here")
    ship = ap.add_argument_group("the shipped default on another dataset (--shipped)")
    ship.add_argument("--shipped", action="store_true",
                      help="judge every machine of --data with the shipped label-free default (causal protocol)")
    ship.add_argument("--period", type=int, default=1,
                      help="the data's sampling period in minutes; the default's window, gap closing and refit "
                           "cadence are counted in minutes (default %(default)s)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.shipped:
        return main_shipped(args)
    if args.nested:
        return main_nested(args)
    res = run(args.data, args.machines, args.configs, reference=args.reference, window=args.window,
              threshold_k=args.threshold_k or None, floor_frac=args.floor_frac, close_gaps=args.close_gaps,
              attribution_mode=args.attribution, k_grid=args.k_grid, random_state=args.seed,
              maha_fit_rows=args.maha_fit_rows)
    _out(f"SMD: {len({r.machine for r in res.results})} machines, reference={res.reference}, "
         f"window={res.window} min, threshold_k={res.threshold_k or 'default (4)'}, close_gaps={res.close_gaps}, "
         f"attribution={res.attribution}, {res.seconds:.0f} s (default config: {DEFAULT_CONFIG})")
    _out(table(res))
    _out("F1* = best point-wise F1 over thresholds chosen WITH the labels (oracle; only for comparison "
         "with published best-F1 figures)")
    if res.sweep:
        _out()
        _out("Point-wise F1 (mean over machines) by threshold multiplier k; LOO F1 = k chosen WITH the labels "
             "of the other machines, applied to the held-out one")
        _out(sweep_table(res))
    if args.json:
        args.json.write_text(json.dumps({"reference": res.reference, "window": res.window,
                                         "threshold_k": res.threshold_k, "close_gaps": res.close_gaps,
                                         "attribution": res.attribution, "seconds": res.seconds,
                                         "results": [asdict(r) for r in res.results], "means": res.means(),
                                         "sweep": [asdict(p) for p in res.sweep]},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
