"""The analytics pipeline: lake interval -> features, scores, findings.

Public API (stable; jobs/ and the evaluation build on it)::

    cfg = AnalyticsConfig(window=WindowSpec(3, 1), reference="both")
    frames = load_frames(lake_root, start, end, hosts=None)     # name -> LazyFrame
    result = analyze(frames, cfg, host_facts=facts)              # AnalysisResult
    result = analyze_lake(lake_root, start, end, hosts=None, config=cfg)

Tables (they become the lake tables ``features``, ``scores``, ``findings``; see
docs/analytics.md):

* ``features``: host, window_start, window_end, one Float64 column per feature
  (:mod:`analytics.catalog` names them).
* ``scores``: host, window_start, window_end, detector (each configured detector and
  ``combined``), reference (``self`` / ``cohort``), score (Float64, higher = worse),
  threshold, flagged (bool). ``combined`` scores are margins: each detector's score is
  rescaled so its reference median is 0 and its threshold 1; ``any`` takes the largest
  margin, ``all`` the smallest, ``vote`` the k-th largest, so combined flagged <=>
  combined score > 1 (threshold 1.0).
* ``findings``: one row per window whose combined score is flagged under the judging
  reference: the cohort when the host has one, else its own history (with
  ``reference="self"`` or ``"cohort"`` only, that one). Columns: host, window_start,
  window_end, reference, score (the combined score), detectors (List[str] that flagged),
  top_factors (List[Struct{feature, family, device, subsystem, contribution, direction,
  value, reference}]), share_cpu ... share_other.

References (the same standardisation and detectors, only the reference rows differ):

* ``self``: the host's own windows of the interval plus ``history`` before it (loaded
  by :func:`analyze_lake`; only windows from ``start`` on are scored). Robust statistics
  (median/MAD, trimmed covariance) tolerate an anomaly covering less than half of it.
* ``cohort``: the windows of the host's peers — other hosts of the same cohort (same
  GPU count and model from host_facts, or from the GPUs seen in the features) in the
  same interval — so a host misconfigured since boot is still caught. Needs at least
  ``min_cohort`` hosts in the cohort (the host included).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np
import polars as pl

from analytics import attribution
from analytics.baselines import GaussianMixtureNLL, PCAReconstruction
from analytics.catalog import lookup
from analytics.detectors import (
    IsolationForestDetector,
    MahalanobisDetector,
    RobustStandardizer,
    RobustZScore,
    _Detector,
    scores_to_labels,
)
from analytics.features import (
    HOST,
    KEYS,
    WINDOW_END,
    WINDOW_START,
    WindowSpec,
    compute_features,
    feature_columns,
)
from ingest import schema

log = logging.getLogger(__name__)

DETECTORS: dict[str, type[_Detector]] = {
    "zscore": RobustZScore,
    "iforest": IsolationForestDetector,
    "mahalanobis": MahalanobisDetector,
    "pca": PCAReconstruction,
    "gmm": GaussianMixtureNLL,
}

COMBINED = "combined"
REFERENCES = ("self", "cohort")

SCORES_SCHEMA: dict[str, pl.DataType] = {
    HOST: pl.String(),
    WINDOW_START: schema.TIME_DTYPE,
    WINDOW_END: schema.TIME_DTYPE,
    "detector": pl.String(),
    "reference": pl.String(),
    "score": pl.Float64(),
    "threshold": pl.Float64(),
    "flagged": pl.Boolean(),
}

FINDINGS_SCHEMA: dict[str, pl.DataType] = {
    HOST: pl.String(),
    WINDOW_START: schema.TIME_DTYPE,
    WINDOW_END: schema.TIME_DTYPE,
    "reference": pl.String(),
    "score": pl.Float64(),
    "detectors": pl.List(pl.String()),
    "top_factors": pl.List(attribution.FACTOR_DTYPE),
    **{c: pl.Float64() for c in attribution.SHARE_COLUMNS},
}


@dataclass(frozen=True)
class AnalyticsConfig:
    """What the pipeline does; validated on construction (errors name the key).

    ``threshold_k``: multiplier of the robust spread of reference scores in every
    detector's threshold (``None``: each detector's default); ``detector_params``:
    extra constructor parameters per detector name."""

    window: WindowSpec = field(default_factory=WindowSpec)
    detectors: tuple[str, ...] = ("zscore", "iforest", "mahalanobis")
    combine: Literal["any", "all", "vote"] = "vote"
    vote_k: int = 2
    reference: Literal["self", "cohort", "both"] = "both"
    history: timedelta = timedelta(hours=1)
    top_k: int = 5
    random_state: int = 0
    threshold_k: float | None = None
    detector_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    min_windows: int = 10
    min_cohort: int = 3
    max_reference_rows: int = 20000

    def __post_init__(self) -> None:
        if not isinstance(self.window, WindowSpec):
            raise ValueError(f"analytics.window must be a WindowSpec, not {type(self.window).__name__}")
        dets = tuple(self.detectors)
        object.__setattr__(self, "detectors", dets)
        if not dets:
            raise ValueError("analytics.detectors must name at least one detector")
        unknown = [d for d in dets if d not in DETECTORS]
        if unknown:
            raise ValueError(f"analytics.detectors: unknown {unknown}; known: {', '.join(DETECTORS)}")
        if len(set(dets)) != len(dets):
            raise ValueError(f"analytics.detectors: duplicates in {list(dets)}")
        if self.combine not in ("any", "all", "vote"):
            raise ValueError(f"analytics.combine must be any, all or vote, not {self.combine!r}")
        if self.combine == "vote" and not 1 <= self.vote_k <= len(dets):
            raise ValueError(f"analytics.vote_k must be between 1 and {len(dets)} (the number of detectors), "
                             f"not {self.vote_k!r}")
        if self.reference not in ("self", "cohort", "both"):
            raise ValueError(f"analytics.reference must be self, cohort or both, not {self.reference!r}")
        if not isinstance(self.history, timedelta) or self.history < timedelta(0):
            raise ValueError(f"analytics.history must be a non-negative timedelta, not {self.history!r}")
        for key in ("top_k", "min_windows", "min_cohort", "max_reference_rows"):
            v = getattr(self, key)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"analytics.{key} must be a positive integer, not {v!r}")
        if self.threshold_k is not None and not self.threshold_k > 0:
            raise ValueError(f"analytics.threshold_k must be > 0, not {self.threshold_k!r}")
        bad = [k for k in self.detector_params if k not in DETECTORS]
        if bad:
            raise ValueError(f"analytics.detector_params: unknown detector(s) {bad}")

    @property
    def references(self) -> tuple[str, ...]:
        return REFERENCES if self.reference == "both" else (self.reference,)

    @property
    def combine_rank(self) -> int:
        """Which largest margin decides the combined flag (1 = any)."""
        n = len(self.detectors)
        return {"any": 1, "all": n, "vote": self.vote_k}[self.combine]

    def make_detector(self, name: str) -> _Detector:
        params: dict[str, Any] = {"standardize": False}
        if self.threshold_k is not None:
            params["threshold_k"] = self.threshold_k
        if "random_state" in DETECTORS[name]().get_params():
            params["random_state"] = self.random_state
        params.update(self.detector_params.get(name, {}))
        return DETECTORS[name](**params)


@dataclass
class AnalysisResult:
    features: pl.DataFrame
    scores: pl.DataFrame
    findings: pl.DataFrame


# --------------------------------------------------------------------------- loading
def load_frames(lake_root: str | os.PathLike[str], start: datetime | None, end: datetime | None,
                hosts: Sequence[str] | None = None) -> dict[str, pl.LazyFrame]:
    """LazyFrames of every telemetry table present in the lake for [start, end), plus
    imported tables; downstream tables (features, scores ...) and ground truth are left
    out. ``host_facts`` is included (unfiltered by time: facts are static)."""
    from analytics.features import SKIPPED
    from ingest import lake  # the lake's reader; imported here to keep analytics importable alone

    out: dict[str, pl.LazyFrame] = {}
    for table in lake.tables(lake_root):
        if table == "host_facts":
            out[table] = lake.scan(lake_root, table, hosts=hosts)
        elif table not in SKIPPED:
            out[table] = lake.scan(lake_root, table, start=start, end=end, hosts=hosts)
    return out


def analyze_lake(lake_root: str | os.PathLike[str], start: datetime, end: datetime,
                 hosts: Sequence[str] | None = None, config: AnalyticsConfig | None = None) -> AnalysisResult:
    """Load [start - history, end) from the lake and analyze it; only windows starting
    at or after ``start`` are scored (the history is reference only)."""
    config = config or AnalyticsConfig()
    frames = load_frames(lake_root, start - config.history, end, hosts)
    facts_lf = frames.pop("host_facts", None)
    facts = facts_lf.collect() if facts_lf is not None else None
    return analyze(frames, config, host_facts=facts, score_since=start)


# ------------------------------------------------------------------------- cohorts
def cohorts(features: pl.DataFrame, host_facts: pl.DataFrame | None = None) -> dict[str, str]:
    """host -> cohort label: ``<gpu count>x<gpu model>`` from host_facts (category gpu,
    key name), else the GPU count seen in the features (``<n>xgpu``); hosts without
    GPUs: ``0xgpu``."""
    hosts = features[HOST].unique().to_list()
    out: dict[str, str] = {}
    if host_facts is not None and not host_facts.is_empty() and {"category", "key", "device"} <= set(host_facts.columns):
        g = (
            host_facts.filter((pl.col("category") == "gpu") & (pl.col("key") == "name"))
            .group_by(HOST)
            .agg(pl.col("device").n_unique().alias("n"), pl.col("value").drop_nulls().sort().first().alias("model"))
        )
        for h, n, model in g.iter_rows():
            out[h] = f"{n}x{model}"
    gpu_cols = [c for c in feature_columns(features) if lookup(c).family.startswith("gpu.") and "@" in c]
    for h in hosts:
        if h in out:
            continue
        sub = features.filter(pl.col(HOST) == h).select(gpu_cols)
        devs = {c.partition("@")[2] for c in gpu_cols if sub[c].null_count() < sub.height}
        out[h] = f"{len(devs)}xgpu"
    return out


# ------------------------------------------------------------------------- scoring
@dataclass
class _Fit:
    scaler: RobustStandardizer
    models: dict[str, _Detector]


def _fit(config: AnalyticsConfig, ref: np.ndarray, floors: np.ndarray) -> _Fit:
    scaler = RobustStandardizer(floors=floors).fit(ref)
    z = scaler.transform(ref)
    return _Fit(scaler, {d: config.make_detector(d).fit(z) for d in config.detectors})


def _fit_and_score(config: AnalyticsConfig, X: np.ndarray, ref_rows: np.ndarray, target: np.ndarray,
                   floors: np.ndarray) -> tuple[_Fit, dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    fit = _fit(config, X[ref_rows], floors)
    if np.array_equal(ref_rows, target):  # self reference without history: reuse the fit's scores
        return fit, *_score(config, fit, None)
    return fit, *_score(config, fit, fit.scaler.transform(X[target]))


def _combine(margins: np.ndarray, rank: int) -> np.ndarray:
    """k-th largest margin per row (margins: (n_detectors, n_rows))."""
    m = np.where(np.isfinite(margins) | np.isinf(margins), margins, -np.inf)
    return np.asarray(-np.sort(-m, axis=0)[rank - 1])


@dataclass
class _Block:
    """Scores of one host under one reference."""

    host: str
    reference: str
    rows: np.ndarray  # indices into the feature matrix
    fit: _Fit
    scores: dict[str, np.ndarray]
    flags: dict[str, np.ndarray]
    combined: np.ndarray
    thresholds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.thresholds:
            self.thresholds = {d: m.threshold_ for d, m in self.fit.models.items()}


def _margin(s: np.ndarray, median: float, threshold: float) -> np.ndarray:
    span = threshold - median
    if not np.isfinite(span) or span <= 0:
        return np.where(s > threshold, np.inf, 0.0)
    return np.asarray((s - median) / span)


def _recalibrate_cohort(config: AnalyticsConfig, blocks: Sequence[_Block]) -> None:
    """One threshold per detector for a cohort, from the *out-of-sample* scores of its
    hosts (each scored against its peers): median over hosts of each host's median, plus
    k times the median over hosts of each host's MAD (log scale where the detector
    calibrates on it). In-sample thresholds are too low for a host never seen in its
    reference: host-specific offsets of many features add up."""
    if not blocks:
        return
    margins: dict[int, list[np.ndarray]] = {id(b): [] for b in blocks}
    for d, det in blocks[0].fit.models.items():
        # per host: median and MAD of its out-of-sample scores; across hosts: their medians,
        # so a minority of anomalous hosts (or a host anomalous all along) cannot move them
        stats = []
        for b in blocks:
            v = b.scores[d][np.isfinite(b.scores[d])]
            if v.size:
                v = np.log(np.maximum(v, 1e-12)) if det._log_scale else v
                m = float(np.median(v))
                stats.append((m, 1.4826 * float(np.median(np.abs(v - m)))))
        if not stats:
            continue
        med_l = float(np.median([m for m, _ in stats]))
        mad_l = float(np.median([a for _, a in stats]))
        floor = 0.05 if det._log_scale else 0.05 * max(abs(med_l), 1.0)
        thr = med_l + det.threshold_k * max(mad_l, floor)
        med = med_l
        if det._log_scale:
            thr, med = float(np.exp(thr)), float(np.exp(med_l))
        for b in blocks:
            b.thresholds[d] = thr
            b.flags[d] = scores_to_labels(b.scores[d], thr)
            margins[id(b)].append(_margin(b.scores[d], med, thr))
    for b in blocks:
        b.combined = _combine(np.vstack(margins[id(b)]), config.combine_rank)


def _score(config: AnalyticsConfig, fit: _Fit, z: np.ndarray | None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Scores, flags and combined margins of z (None: the reference rows themselves)."""
    scores, flags, margins = {}, {}, []
    for name, det in fit.models.items():
        s = det.reference_scores_ if z is None else det._score_z(z)
        scores[name] = s
        flags[name] = scores_to_labels(s, det.threshold_)
        margins.append(det.margin(s))
    return scores, flags, _combine(np.vstack(margins), config.combine_rank)


def _subsample(rows: np.ndarray, limit: int, rng: np.random.Generator) -> np.ndarray:
    return rows if rows.size <= limit else np.sort(rng.choice(rows, limit, replace=False))


def analyze(
    frames: Mapping[str, pl.LazyFrame],
    config: AnalyticsConfig | None = None,
    *,
    host_facts: pl.DataFrame | None = None,
    score_since: datetime | None = None,
    features: pl.DataFrame | None = None,
) -> AnalysisResult:
    """Features, scores and findings of the given telemetry frames.

    ``frames``: measurement name -> LazyFrame (``host_facts`` may be among them);
    ``score_since``: windows starting earlier are reference only (history);
    ``features``: a precomputed wide feature frame (then ``frames`` is not read)."""
    config = config or AnalyticsConfig()
    frames = dict(frames)
    if host_facts is None and "host_facts" in frames:
        host_facts = frames["host_facts"].collect()
    frames.pop("host_facts", None)
    feats = features if features is not None else compute_features(frames, config.window, host_facts=host_facts)
    cols = feature_columns(feats)
    X = feats.select(cols).to_numpy().astype(np.float64, copy=False) if cols else np.zeros((feats.height, 0))
    floors = np.array([lookup(c).floor for c in cols], dtype=np.float64)
    host_arr = feats[HOST].to_numpy()
    scored = np.ones(feats.height, dtype=bool)
    if score_since is not None:
        since = score_since if score_since.tzinfo else score_since.replace(tzinfo=UTC)
        scored = (feats[WINDOW_START] >= since).to_numpy()
    rng = np.random.default_rng(config.random_state)
    hosts = list(dict.fromkeys(host_arr.tolist()))
    host_rows = {h: np.flatnonzero(host_arr == h) for h in hosts}

    blocks: list[_Block] = []
    if "self" in config.references:
        for h in hosts:
            rows = host_rows[h]
            target = rows[scored[rows]]
            if rows.size < config.min_windows or target.size == 0:
                log.info("host %s: %d windows < min_windows=%d, no self reference", h, rows.size, config.min_windows)
                continue
            ref = _subsample(rows, config.max_reference_rows, rng)
            blocks.append(_Block(h, "self", target, *_fit_and_score(config, X, ref, target, floors)))
    if "cohort" in config.references and len(hosts) >= config.min_cohort:
        groups: dict[str, list[str]] = {}
        for h, c in cohorts(feats, host_facts).items():
            groups.setdefault(c, []).append(h)
        for label, members in groups.items():
            if len(members) < config.min_cohort:
                log.info("cohort %s has %d host(s) < min_cohort=%d", label, len(members), config.min_cohort)
                continue
            cohort_blocks: list[_Block] = []
            for h in members:
                peers = np.concatenate([host_rows[p][scored[host_rows[p]]] for p in members if p != h])
                target = host_rows[h][scored[host_rows[h]]]
                if peers.size < config.min_windows or target.size == 0:
                    continue
                ref = _subsample(peers, config.max_reference_rows, rng)
                cohort_blocks.append(_Block(h, "cohort", target, *_fit_and_score(config, X, ref, target, floors)))
            _recalibrate_cohort(config, cohort_blocks)
            blocks += cohort_blocks

    scores = _scores_table(feats, blocks)
    # "both": a host's findings come from its cohort when it has one (peers doing the same
    # thing at the same time cancel workload phases that self-history would flag), else
    # from its own history; the scores table keeps both
    with_cohort = {b.host for b in blocks if b.reference == "cohort"}
    judged = [b for b in blocks if b.reference == "cohort" or b.host not in with_cohort]
    findings = _findings_table(feats, X, cols, judged, config)
    return AnalysisResult(features=feats, scores=scores, findings=findings)


def _scores_table(feats: pl.DataFrame, blocks: Sequence[_Block]) -> pl.DataFrame:
    parts = []
    for b in blocks:
        keys = feats[b.rows.tolist()].select(KEYS) if b.rows.size else feats.clear().select(KEYS)
        for name in [*b.scores, COMBINED]:
            if name == COMBINED:
                s, thr, fl = b.combined, 1.0, scores_to_labels(b.combined, 1.0)
            else:
                s, thr, fl = b.scores[name], b.thresholds[name], b.flags[name]
            parts.append(keys.with_columns(
                pl.lit(name).alias("detector"), pl.lit(b.reference).alias("reference"),
                pl.Series("score", s, dtype=pl.Float64), pl.lit(float(thr), dtype=pl.Float64).alias("threshold"),
                pl.Series("flagged", fl, dtype=pl.Boolean),
            ))
    if not parts:
        return pl.DataFrame(schema=SCORES_SCHEMA)
    return pl.concat(parts).select([pl.col(c).cast(t) for c, t in SCORES_SCHEMA.items()])


def _findings_table(feats: pl.DataFrame, X: np.ndarray, cols: Sequence[str], blocks: Sequence[_Block],
                    config: AnalyticsConfig) -> pl.DataFrame:
    # best reference per window: the flagged block with the largest combined score
    best: dict[int, tuple[float, _Block, int]] = {}
    for b in blocks:
        for i in np.flatnonzero(scores_to_labels(b.combined, 1.0)).tolist():
            row, s = int(b.rows[i]), float(b.combined[i])
            if row not in best or s > best[row][0]:
                best[row] = (s, b, i)
    if not best:
        return pl.DataFrame(schema=FINDINGS_SCHEMA)
    by_block: dict[int, list[tuple[int, int]]] = {}
    block_of = {id(b): b for b in blocks}
    for row, (_, b, i) in best.items():
        by_block.setdefault(id(b), []).append((row, i))
    recs: list[dict[str, Any]] = []
    tops: list[list[attribution.Factor]] = []
    profiles: list[np.ndarray] = []  # blocks of rows, in recs order
    for bid, items in by_block.items():
        b = block_of[bid]
        rows = np.array([r for r, _ in items], dtype=np.int64)
        local = np.array([i for _, i in items], dtype=np.int64)
        z = b.fit.scaler.transform(X[rows])
        flagged_by = [tuple(d for d in b.flags if b.flags[d][i]) or tuple(b.fit.models) for i in local]
        # one vectorised explanation per set of flagging detectors
        for dets in dict.fromkeys(flagged_by):
            sel = np.array([n for n, f in enumerate(flagged_by) if f == dets], dtype=np.int64)
            contrib = {d: b.fit.models[d].contributions(z[sel]) for d in dets}
            t, prof = attribution.explain(contrib, X[rows[sel]], b.fit.scaler.center_, cols, config.top_k)
            tops += t
            profiles.append(prof)
            recs += [{"_row": int(rows[n]), "reference": b.reference, "score": float(b.combined[local[n]]),
                      "detectors": list(dets)} for n in sel.tolist()]
    keys = feats[[r["_row"] for r in recs]].select(KEYS)
    prof_arr = np.vstack(profiles)
    out = keys.with_columns(
        pl.Series("reference", [r["reference"] for r in recs], dtype=pl.String),
        pl.Series("score", [r["score"] for r in recs], dtype=pl.Float64),
        pl.Series("detectors", [r["detectors"] for r in recs], dtype=pl.List(pl.String)),
        attribution.factors_series(tops),
        *[pl.Series(c, prof_arr[:, j], dtype=pl.Float64) for j, c in enumerate(attribution.SHARE_COLUMNS)],
    )
    return out.select([pl.col(c).cast(t) for c, t in FINDINGS_SCHEMA.items()]).sort(HOST, WINDOW_START)
