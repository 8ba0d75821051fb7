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
  margin, ``all`` the smallest, ``vote`` the k-th largest (threshold 1.0); combined
  flagged <=> combined score > 1, in a run of at least ``min_run`` consecutive such
  windows, and the host past its ``warmup``.
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
* ``cohort``: the windows of the host's peers — other hosts of the same cohort
  (:func:`cohorts`: same hardware, then the same *workload behaviour*) in the same
  interval — so a host misconfigured since boot is still caught. Needs at least
  ``min_cohort`` hosts in the cohort (the host included); else the host is judged by
  its own history.

What the detectors see (docs/analytics.md, "Verdicts"): robust z-scores, one-sided for
features with a direction of trouble, log-compressed and down-weighted for workload
activity (:func:`evidence_weights`), as centred 120-s running medians
(:func:`_detection_matrix`), so benign phases shorter than a minute (checkpoints,
bursts) are not anomalies and sustained inefficiencies are from their first windows.
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np
import polars as pl
from sklearn import config_context

from analytics import attribution
from analytics.baselines import GaussianMixtureNLL, PCAReconstruction
from analytics.catalog import FAMILIES, lookup
from analytics.detectors import (
    IsolationForestDetector,
    MahalanobisDetector,
    RepeatedRows,
    RobustStandardizer,
    RobustZScore,
    ThresholdRule,
    _Detector,
    margin,
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
    detector's threshold (``None``: each detector's default); ``threshold_rule``: how
    every detector's threshold is set from its reference scores (``mad``: median + k·MAD;
    ``quantile:S``; ``pot:L:R``; see :class:`analytics.detectors.ThresholdRule`);
    ``detector_params``: extra constructor parameters per detector name."""

    window: WindowSpec = field(default_factory=WindowSpec)
    detectors: tuple[str, ...] = ("zscore", "iforest", "mahalanobis")
    combine: Literal["any", "all", "vote"] = "vote"
    vote_k: int = 2
    reference: Literal["self", "cohort", "both"] = "both"
    history: timedelta = timedelta(hours=1)
    top_k: int = 5
    random_state: int = 0
    threshold_k: float | None = None
    threshold_rule: str = "mad"
    detector_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    min_windows: int = 10
    min_cohort: int = 3
    #: a cohort's reference is drawn from at most this many of its hosts (:func:`cohort_sample`)
    cohort_sample: int = 16
    max_reference_rows: int = 20000
    one_sided: bool = True
    activity_weight: float = 0.25
    min_run: int = 3
    cohort_by: Literal["behaviour", "hardware"] = "behaviour"
    cohort_tolerance: float = 2.0
    warmup: timedelta = timedelta(minutes=5)
    smooth: timedelta = timedelta(seconds=120)
    #: the live sweep may fit the hosts' own references once per multiple of this on the
    #: clock (epoch e: their windows of [e + refit - history, e)) and score each step's
    #: windows against it; None (default): refitted at every analysis step on
    #: [step start - history, step end) (docs/analytics.md, "The live protocol": measured,
    #: epochs add false incidents on self-judged hosts for ~5-15 % less CPU)
    refit: timedelta | None = None

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
        if not isinstance(self.warmup, timedelta) or self.warmup < timedelta(0):
            raise ValueError(f"analytics.warmup must be a non-negative timedelta, not {self.warmup!r}")
        if not isinstance(self.history, timedelta) or self.history < timedelta(0):
            raise ValueError(f"analytics.history must be a non-negative timedelta, not {self.history!r}")
        if self.refit is not None and (not isinstance(self.refit, timedelta) or self.refit <= timedelta(0)):
            raise ValueError(f"analytics.refit must be a positive timedelta or None (off), not {self.refit!r}")
        if not (isinstance(self.activity_weight, int | float) and 0.0 < self.activity_weight <= 1.0):
            raise ValueError(f"analytics.activity_weight must be in (0, 1], not {self.activity_weight!r}")
        if not isinstance(self.one_sided, bool):
            raise ValueError(f"analytics.one_sided must be true or false, not {self.one_sided!r}")
        if self.cohort_by not in ("behaviour", "hardware"):
            raise ValueError(f"analytics.cohort_by must be behaviour or hardware, not {self.cohort_by!r}")
        if not (isinstance(self.cohort_tolerance, int | float) and self.cohort_tolerance > 1.0):
            raise ValueError(f"analytics.cohort_tolerance must be a factor > 1, not {self.cohort_tolerance!r}")
        for key in ("top_k", "min_windows", "min_cohort", "cohort_sample", "max_reference_rows", "min_run"):
            v = getattr(self, key)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"analytics.{key} must be a positive integer, not {v!r}")
        if self.threshold_k is not None and not self.threshold_k > 0:
            raise ValueError(f"analytics.threshold_k must be > 0, not {self.threshold_k!r}")
        try:
            ThresholdRule.parse(self.threshold_rule)
        except ValueError as exc:
            raise ValueError(f"analytics.threshold_rule: {exc}") from None
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

    def make_detector(self, name: str, *, capped: bool = False) -> _Detector:
        """The configured detector; ``capped``: set its ``max_threshold`` (if it has one)
        to the detector's cap for telemetry with catalog floors (see detectors._cap)."""
        params: dict[str, Any] = {"standardize": False}
        if self.threshold_k is not None:
            params["threshold_k"] = self.threshold_k
        defaults = DETECTORS[name]().get_params()
        if "threshold_rule" in defaults:
            params["threshold_rule"] = self.threshold_rule
        if "random_state" in defaults:
            params["random_state"] = self.random_state
        if capped and "max_threshold" in defaults:
            params["max_threshold"] = DETECTORS[name]._cap
        params.update(self.detector_params.get(name, {}))
        return DETECTORS[name](**params)


@dataclass
class AnalysisResult:
    """What :func:`analyze` found and what it judged with: downstream (the knowledge base's
    detector, the sweep step) reads the settings, the window spec and the cohorts here
    instead of deriving them again (with other settings)."""

    features: pl.DataFrame
    scores: pl.DataFrame
    findings: pl.DataFrame
    config: AnalyticsConfig
    #: host -> the cohort analytics judged it in (:func:`cohorts` with the configured
    #: ``cohort_by``/``cohort_tolerance``); empty when no cohort reference was formed
    #: (reference "self", or fewer hosts than ``min_cohort``)
    cohorts: Mapping[str, str]

    @property
    def window(self) -> WindowSpec:
        return self.config.window


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
    # at least `warmup` before start, so a running host's first scored windows are judged
    frames = load_frames(lake_root, start - max(config.history, config.warmup), end, hosts)
    facts_lf = frames.pop("host_facts", None)
    facts = facts_lf.collect() if facts_lf is not None else None
    return analyze(frames, config, host_facts=facts, score_since=start)


# ------------------------------------------------------------------------- cohorts
#: families that describe what a host's ML workload is doing, not how well: the
#: behavioural cohort compares hosts on these (GPU, GPU interconnect and NIC traffic).
#: Ratios where inefficiencies show (power limit, IRQ locality, clocks ...) and host-side
#: activity that noisy neighbours and contention change (disk I/O, CPU busy) are left
#: out, so a host with an inefficiency still lands in its peers' cohort.
BEHAVIOUR_FAMILIES: tuple[str, ...] = (
    "gpu.util", "gpu.mem_util", "gpu.mem_used_share", "nvlink.tx_rate", "nvlink.rx_rate", "pcie.tx_rate",
    "pcie.rx_rate", "net.rx_bytes_rate", "net.tx_bytes_rate",
)


def hardware_cohorts(features: pl.DataFrame, host_facts: pl.DataFrame | None = None) -> dict[str, str]:
    """host -> ``<gpu count>x<gpu model>`` from host_facts (category gpu, key name), else
    the GPU count seen in the features (``<n>xgpu``); hosts without GPUs: ``0xgpu``."""
    hosts = features[HOST].unique().to_list()
    out: dict[str, str] = {}
    gpus = gpu_names(host_facts)
    if gpus is not None:
        g = (
            gpus
            .group_by(HOST)
            .agg(pl.col("device").n_unique().alias("n"), pl.col("value").drop_nulls().sort().first().alias("model"))
        )
        for h, n, model in g.iter_rows():
            out[h] = f"{n}x{model}"
    gpu_cols = [c for c in feature_columns(features) if lookup(c).family.startswith("gpu.") and "@" in c]
    missing = [h for h in hosts if h not in out]
    if missing:
        seen = features.filter(pl.col(HOST).is_in(missing)).group_by(HOST).agg(
            [pl.col(c).is_not_null().any().alias(c) for c in gpu_cols])
        for row in seen.iter_rows(named=True):
            devs = {c.partition("@")[2] for c in gpu_cols if row[c]}
            out[row[HOST]] = f"{len(devs)}xgpu"
    return out


def gpu_names(host_facts: pl.DataFrame | None) -> pl.DataFrame | None:
    """The host_facts rows :func:`hardware_cohorts` reads (each GPU's name); None without."""
    if host_facts is None or host_facts.is_empty() or not {"category", "key", "device"} <= set(host_facts.columns):
        return None
    return host_facts.filter((pl.col("category") == "gpu") & (pl.col("key") == "name"))


def behaviour_profiles(features: pl.DataFrame) -> pl.DataFrame:
    """One row per host: the median over its windows of each behaviour family (the mean
    over the family's devices in each window)."""
    fams: dict[str, list[str]] = {}
    for c in feature_columns(features):
        fam = lookup(c).family
        if fam in BEHAVIOUR_FAMILIES:
            fams.setdefault(fam, []).append(c)
    if not fams:
        return features.select(HOST).unique().sort(HOST)
    per_window = features.select(HOST, *[pl.mean_horizontal(cs).alias(f) for f, cs in fams.items()])
    return per_window.group_by(HOST).agg(pl.col(list(fams)).median()).sort(HOST)


def cohorts(features: pl.DataFrame, host_facts: pl.DataFrame | None = None, *,
            by: Literal["behaviour", "hardware"] = "behaviour", tolerance: float = 2.0) -> dict[str, str]:
    """host -> cohort label. Hosts are first grouped by hardware (:func:`hardware_cohorts`);
    with ``by="behaviour"`` (default) each group is split by workload: two hosts are
    alike when, for every behaviour family (:data:`BEHAVIOUR_FAMILIES`), their interval
    medians differ by less than a factor ``tolerance`` or by less than 5 catalog floors
    (noise); cohorts are the complete-linkage clusters of that relation (every pair in a
    cohort is alike), labelled ``<hardware>/<n>``. An LLM-serving host and a training
    host of the same model are thus different cohorts (NVLink all-reduce traffic, disk
    checkpoints, GPU utilisation differ by far more than 2x)."""
    hw = hardware_cohorts(features, host_facts)
    if by == "hardware" or features.is_empty():
        return hw
    return cluster_cohorts(hw, behaviour_profiles(features), tolerance)


def cohort_members(cohort_of: Mapping[str, str]) -> dict[str, list[str]]:
    """host -> cohort inverted: each cohort's hosts, cohorts and hosts in the order given."""
    members: dict[str, list[str]] = {}
    for h, c in cohort_of.items():
        members.setdefault(c, []).append(h)
    return members


def cluster_cohorts(hw: Mapping[str, str], prof: pl.DataFrame, tolerance: float = 2.0) -> dict[str, str]:
    """The behavioural cohorts of :func:`cohorts` from each host's hardware cohort and
    behaviour profile (:func:`hardware_cohorts`, :func:`behaviour_profiles`: per host, so
    they can be computed on batches of hosts and put together)."""
    fams = [c for c in prof.columns if c != HOST]
    if not fams:
        return dict(hw)
    from scipy.cluster.hierarchy import fcluster, linkage

    floors = np.array([5.0 * lookup(f).floor for f in fams])
    log_tol = float(np.log(tolerance))
    out: dict[str, str] = {}
    have = set(prof[HOST].to_list())  # (a host known from its facts only has no windows to judge)
    for label, members in cohort_members({h: c for h, c in hw.items() if h in have}).items():
        members = sorted(members)
        if len(members) == 1:
            out[members[0]] = f"{label}/0"
            continue
        P = prof.filter(pl.col(HOST).is_in(members)).sort(HOST).select(fams).to_numpy().astype(np.float64)
        # pairwise distance in units of the tolerance: a pair is alike when it is <= 1
        a, b = P[:, None, :], P[None, :, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.abs(np.log(np.maximum(np.abs(a), floors) / np.maximum(np.abs(b), floors))) / log_tol
        ratio = np.where(np.isfinite(ratio), ratio, 0.0)  # a family missing on one host: no evidence
        dist = ratio.max(axis=2)
        iu = np.triu_indices(len(members), 1)
        clusters = fcluster(linkage(dist[iu], method="complete"), t=1.0, criterion="distance")
        for h, c in zip(members, clusters.tolist(), strict=True):
            out[h] = f"{label}/{c - 1}"
    return out


# ------------------------------------------------------------------------- scoring
@dataclass
class _Fit:
    """A reference: its standardiser, the evidence transform and the fitted detectors."""

    scaler: RobustStandardizer
    models: dict[str, _Detector]
    sign: np.ndarray  # +1: only increases count (trouble "up"), -1: only decreases, 0: both
    weight: np.ndarray  # per-feature weight of the evidence

    def evidence(self, X: np.ndarray) -> np.ndarray:
        """Standardised deviations as the detectors see them: one-sided for features
        with a direction of trouble, down-weighted for workload-activity features."""
        return self.evidence_rows(RepeatedRows(X)).rows

    def evidence_rows(self, X: RepeatedRows) -> RepeatedRows:
        return X.with_rows(_evidence(self.scaler.transform_rows(X).rows, self.sign, self.weight))


def _evidence(z: np.ndarray, sign: np.ndarray, weight: np.ndarray) -> np.ndarray:
    if sign.any():  # one pass: up-features clipped below at 0, down-features above
        np.maximum(z, np.where(sign > 0, 0.0, -np.inf), out=z)  # (np.clip with array bounds is slower)
        np.minimum(z, np.where(sign < 0, 0.0, np.inf), out=z)
    act = weight < 1.0
    if act.any():  # activity: log-compressed, so a 1000x burst is ~7 scales, not 1000
        za = z[:, act]
        z[:, act] = np.sign(za) * np.log1p(np.abs(za)) * weight[act]
    return z


def evidence_weights(cols: Sequence[str], config: AnalyticsConfig) -> tuple[np.ndarray, np.ndarray]:
    """(sign, weight) per feature from the catalog: the direction of trouble decides
    which side of the reference counts (``one_sided``); families that only describe
    workload activity (direction ``both``: utilisation, traffic, I/O rates) get
    ``activity_weight`` on a log-compressed deviation (``w·sign(z)·log1p(|z|)``): a
    workload phase (model load, checkpoint, evaluation) moves them by orders of
    magnitude without being an inefficiency; with the default 0.25 no activity feature
    reaches the Z-score's minimum threshold (3) alone below a 10^5-fold deviation, yet
    they still shape the multivariate detectors and the fingerprints. Families marked
    ``context`` (levels that follow load on a healthy host: GPU temperature, power-cap time)
    are weighed the same way, on their side of trouble. Imported metrics (unknown families)
    keep weight 1, linear, both sides."""
    sign = np.zeros(len(cols))
    weight = np.ones(len(cols))
    for j, c in enumerate(cols):
        info = lookup(c)
        if info.family not in FAMILIES:
            continue
        if info.direction == "both" or info.context:
            weight[j] = config.activity_weight
        if info.direction != "both" and config.one_sided:
            sign[j] = 1.0 if info.direction == "up" else -1.0
    return sign, weight


def _fit(config: AnalyticsConfig, ref: RepeatedRows, floors: np.ndarray, sign: np.ndarray,
         weight: np.ndarray, capped: bool = False) -> tuple[_Fit, RepeatedRows]:
    # the detection matrix holds finite values or NaN (features are null, never inf), z is
    # finite by construction (transform zeroes the rest) and the parameters are the
    # config's: sklearn's per-call finiteness scans and parameter checks only cost time
    with config_context(assume_finite=True, skip_parameter_validation=True):
        scaler = RobustStandardizer(floors=floors).fit(ref)
        z = ref.with_rows(_evidence(scaler.transform_rows(ref).rows, sign, weight))
        models = {d: config.make_detector(d, capped=capped).fit(z) for d in config.detectors}
    return _Fit(scaler, models, sign, weight), z


def _fit_and_score(config: AnalyticsConfig, X: RepeatedRows, ref_rows: np.ndarray, target: np.ndarray,
                   floors: np.ndarray, sign: np.ndarray, weight: np.ndarray, capped: bool = False
                   ) -> tuple[_Fit, dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    # (all rows, in order: the matrix itself, not a copy; nothing writes into it)
    fit, _ = _fit(config, X if ref_rows.size == X.shape[0] else X.take(ref_rows), floors, sign, weight, capped)
    pos = np.searchsorted(ref_rows, target)
    if target.size and pos.max() < ref_rows.size and np.array_equal(ref_rows[pos], target):
        # the targets are reference rows (self reference): reuse the fit's scores
        return fit, *_score(config, fit, None, pos)
    return fit, *_score(config, fit, fit.evidence_rows(X.take(target)))


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
    combined_flags: np.ndarray | None = None  # combined > 1, persistent (see persistent()), judged
    judged: np.ndarray | None = None  # per row: out of warm-up (may be flagged)
    medians: dict[str, float] = field(default_factory=dict)  # cohort: score medians of the margins

    def __post_init__(self) -> None:
        if not self.thresholds:
            self.thresholds = {d: m.threshold_ for d, m in self.fit.models.items()}


def _cohort_thresholds(pool_of: Sequence[_Block]) -> dict[str, tuple[float, float]]:
    """Detector -> (threshold, median) for a cohort, from the *out-of-sample* scores of the
    hosts of ``pool_of`` pooled (each scored against its peers): the detector's
    :class:`ThresholdRule` on the pool. In-sample thresholds are too low for a host never
    seen in its reference (host-specific offsets of many features add up). Within one
    analysis step a host's windows share nearly one smoothed row, so its scores are
    nearly one value: the spread that matters is between hosts, and only the pool has it
    (a threshold from each host's own scores sits on that host's level; the median of
    those put half of every cohort above it). The rule's robust centre and spread keep a
    minority of anomalous hosts from moving it."""
    out: dict[str, tuple[float, float]] = {}
    if not pool_of:
        return out
    for d, det in pool_of[0].fit.models.items():
        pool = np.concatenate([b.scores[d] if b.judged is None else b.scores[d][b.judged] for b in pool_of])
        pool = pool[np.isfinite(pool)]
        if not pool.size:
            continue
        rule = ThresholdRule.parse(det.threshold_rule)
        thr = det._bounded(rule.threshold(pool, det.threshold_k, log_scale=det._log_scale))
        med = float(np.exp(np.median(np.log(np.maximum(pool, 1e-12))))) if det._log_scale else float(np.median(pool))
        out[d] = (thr, med)
    return out


def _recalibrate_cohort(config: AnalyticsConfig, blocks: Sequence[_Block],
                        thresholds: Mapping[str, tuple[float, float]]) -> None:
    """The cohort's ``blocks`` judged with its pooled thresholds (:func:`_cohort_thresholds`)."""
    margins: dict[int, list[np.ndarray]] = {id(b): [] for b in blocks}
    for d, (thr, med) in thresholds.items():
        for b in blocks:
            b.thresholds[d] = thr
            b.medians[d] = med
            b.flags[d] = scores_to_labels(b.scores[d], thr)
            margins[id(b)].append(margin(b.scores[d], med, thr))
    for b in blocks:
        b.combined = _combine(np.vstack(margins[id(b)]), config.combine_rank)


def _score(config: AnalyticsConfig, fit: _Fit, z: RepeatedRows | None, ref_pos: np.ndarray | None = None
           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Scores, flags and combined margins of z (None: the reference rows at ``ref_pos``)."""
    scores, flags, margins = {}, {}, []
    for name, det in fit.models.items():
        s = det.reference_scores_[ref_pos] if z is None else det._score_rows(z)
        scores[name] = s
        flags[name] = scores_to_labels(s, det.threshold_)
        margins.append(det.margin(s))
    return scores, flags, _combine(np.vstack(margins), config.combine_rank)


def persistent(flags: np.ndarray, starts_us: np.ndarray, stride_us: int, min_run: int) -> np.ndarray:
    """Flags kept only inside runs of at least ``min_run`` consecutive flagged windows
    (consecutive = window starts one stride apart). A one- or two-window blip (a burst
    of interrupts, a short stall) is not reported; a sustained inefficiency loses only
    its first ``min_run - 1`` windows' worth of delay, not its windows."""
    flags = np.asarray(flags, dtype=bool)
    if min_run <= 1 or not flags.any():
        return flags
    n = flags.size
    contiguous = np.ones(n, dtype=bool)
    contiguous[1:] = np.diff(starts_us) == stride_us
    # a new run starts at every flagged window whose predecessor is unflagged or not adjacent
    prev = np.r_[False, flags[:-1]]
    start = flags & ~(prev & contiguous)
    run_id = np.cumsum(start) * flags  # 0 for unflagged windows
    lengths = np.bincount(run_id, minlength=1)
    keep = lengths >= min_run
    keep[0] = False
    return np.asarray(keep[run_id])


def _detection_matrix(feats: pl.DataFrame, cols: Sequence[str], config: AnalyticsConfig
                      ) -> tuple[RepeatedRows, np.ndarray]:
    """The matrix the detectors see: each feature's centred running median over
    ``config.smooth`` of the host's windows (``smooth`` <= one stride: the raw
    features). Workload phases shorter than half of it (a checkpoint, an evaluation
    pass, a burst of I/O) leave the median alone; a step that lasts longer moves it at
    once (a centred median follows a step without delay), so a sustained inefficiency
    is found from its first windows and a benign phase is not.

    Cost: a running median of 120 windows over every feature is ~0.4 s per host-hour;
    this is a median of block means instead: means of blocks of ``smooth/12`` (10 s),
    then a centred running median over 12 blocks, mapped back to the windows (~50 ms).
    A burst inflates the mean of the one or few blocks it touches, which the median of
    12 ignores as long as it touches fewer than half of them. Time resolution: a block.

    At the ends of a host's data the window of 12 blocks is shifted inward (a truncated
    window would let a final checkpoint be half of it), so there the smoothed value is
    not centred on the window: the second result marks those *edge* rows, whose verdict
    must also hold on the raw window (see :func:`analyze`): a fault that stopped 30 s
    before the end is not extended to the end, a checkpoint at the end is not flagged.

    The matrix comes as its block rows and each window's block (:class:`RepeatedRows`):
    the detectors fit and score each block once, not each of its ten windows."""
    no_edge = np.zeros(feats.height, dtype=bool)
    if not cols:
        return RepeatedRows(np.zeros((feats.height, 0))), no_edge
    stride_us = round(config.window.stride_s * 1e6)
    w = round(config.smooth.total_seconds() * 1e6 / stride_us)
    if w <= 1:
        return RepeatedRows(feats.select(cols).to_numpy().astype(np.float64, copy=False)), no_edge
    k = min(w, 12)
    block_us = max(1, w // k) * stride_us
    bid = (pl.col(WINDOW_START).dt.epoch("us") // block_us).alias("_blk")
    # maintain_order: the same means (each group's rows in row order either way) at about
    # half the cost of the hash grouping on the usual (host, time)-sorted frame
    blocks = feats.group_by(HOST, bid, maintain_order=True).agg(pl.col(cols).cast(pl.Float64).mean()).sort(HOST, "_blk")
    hosts_b = blocks[HOST].to_numpy()
    if k > 1:
        # trailing medians over k blocks, then each block takes the window of k blocks
        # centred on it, shifted inward at the ends of the host's data (a truncated window
        # at the end of an interval would let a final checkpoint be half of it)
        trail = np.array(blocks.select(cols).to_numpy())  # (writable: one column may come zero-copy)
        # a column whose block means never change (a power limit, a link width: a third
        # of them) is its own running median: only the others are computed
        moving = np.ones(len(cols), dtype=bool)
        finite = np.isfinite(trail).all(axis=0)
        if trail.shape[0]:
            with np.errstate(invalid="ignore"):
                moving = ~(finite & (trail.max(axis=0) == trail.min(axis=0)))
        starts = np.flatnonzero(np.r_[True, hosts_b[1:] != hosts_b[:-1]])
        lengths = np.diff(np.r_[starts, hosts_b.size])
        if moving.any():  # host by host; nulls (NaN here) are skipped as Polars' rolling_median does
            part = trail[:, moving]
            for s, n in zip(starts.tolist(), lengths.tolist(), strict=True):
                part[s:s + n] = _rolling_median(part[s:s + n], k)
            trail[:, moving] = part
        first = np.repeat(starts, lengths)
        length = np.repeat(lengths, lengths)
        local = np.arange(hosts_b.size) - first
        end = np.clip(local + k // 2, np.minimum(k - 1, length - 1), length - 1)
        values, shifted = trail[first + end], end != local + k // 2
    else:
        values, shifted = blocks.select(cols).to_numpy(), np.zeros(hosts_b.size, dtype=bool)
    # each window's block, by a join of the keys only
    at = feats.select(HOST, bid).join(blocks.select(HOST, "_blk").with_row_index("_i"), on=[HOST, "_blk"],
                                      how="left", maintain_order="left")["_i"].to_numpy()
    return RepeatedRows(np.asarray(values, dtype=np.float64), at), shifted[at]


def _rolling_median(values: np.ndarray, k: int) -> np.ndarray:
    """Trailing running medians over ``k`` rows of each column, NaN skipped (NaN where a
    window has no value), the first ``k - 1`` rows over the rows so far: Polars'
    ``rolling_median(k, min_samples=1)`` with NaN for null, bit for bit (even counts:
    ``a + (b - a) / 2`` of the middle pair), by sorting each window in numpy (NaN sorts
    last; Polars' kernel costs 1.4-1.6x as much here)."""
    n = values.shape[0]
    out = np.empty_like(values, dtype=np.float64)
    nan = np.isnan(values)
    gaps = nan.any(axis=0)
    if gaps.any() and not gaps.all():  # complete columns take the cheaper path
        out[:, gaps], out[:, ~gaps] = (_rolling_median(values[:, g], k) for g in (gaps, ~gaps))
        return out
    ok = None if not gaps.any() else ~nan

    def middle(srt: np.ndarray, cnt: np.ndarray | int) -> np.ndarray:
        """The median of the first ``cnt`` (the valid) values of each sorted window."""
        if isinstance(cnt, int):  # (no gaps: the middle positions are the same everywhere)
            a, b = srt[..., (cnt - 1) // 2], srt[..., cnt // 2]
            return np.asarray(a if cnt % 2 else a + (b - a) * 0.5)
        c = np.maximum(cnt, 1)[..., None]
        a = np.take_along_axis(srt, (c - 1) // 2, axis=-1)[..., 0]
        b = np.take_along_axis(srt, c // 2, axis=-1)[..., 0]
        return np.where(cnt % 2 == 1, a, np.where(cnt > 0, a + (b - a) * 0.5, np.nan))

    for i in range(min(k - 1, n)):
        out[i] = middle(np.sort(values[:i + 1], axis=0).T, i + 1 if ok is None else ok[:i + 1].sum(axis=0))
    if n >= k:
        win = np.lib.stride_tricks.sliding_window_view
        out[k - 1:] = middle(np.sort(win(values, k, axis=0), axis=-1), k if ok is None else win(ok, k, axis=0).sum(axis=-1))
    return out


def _confirm_edges(feats: pl.DataFrame, cols: Sequence[str], config: AnalyticsConfig, blocks: Sequence[_Block],
                   edge: np.ndarray) -> None:
    """Windows whose smoothed value is not centred on them (the ends of a host's data)
    keep the smaller of their smoothed and raw combined margins: flagged only when both
    say so."""
    for b in blocks:
        sel = np.flatnonzero(edge[b.rows])
        if not sel.size:
            continue
        raw = feats[b.rows[sel], list(cols)].to_numpy().astype(np.float64)  # the few rows, then the columns
        z = b.fit.evidence(raw)
        margins = []
        for d, det in b.fit.models.items():
            med = det.score_median_ if b.reference == "self" else b.medians.get(d, det.score_median_)
            margins.append(margin(det._score_z(z), med, b.thresholds[d]))
        b.combined[sel] = np.minimum(b.combined[sel], _combine(np.vstack(margins), config.combine_rank))


def _host_level(X: RepeatedRows, rows: np.ndarray) -> np.ndarray:
    """Per-feature median of a host's windows (NaN where it has no value)."""
    if not rows.size:
        return np.full(X.shape[1], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        return np.asarray(np.nanmedian(X.gather(rows), axis=0))


def _peer_spread(levels: np.ndarray) -> np.ndarray:
    """Largest absolute offset of one peer's level from the peers' median level (0 where
    fewer than two peers have a value)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(levels, axis=0)
        spread = np.nanmax(np.abs(levels - med), axis=0)
    ok = np.isfinite(levels).sum(axis=0) >= 2
    return np.where(ok & np.isfinite(spread), spread, 0.0)


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
    """Features, scores and findings of the given telemetry frames, every window judged
    against references fitted on the whole frame (history and the scored windows alike).

    ``frames``: measurement name -> LazyFrame (``host_facts`` may be among them);
    ``score_since``: windows starting earlier are reference only (history);
    ``features``: a precomputed wide feature frame (then ``frames`` is not read).
    The live sweep fits once and scores many instead (:func:`fit`, :func:`score`)."""
    config = config or AnalyticsConfig()
    frames = dict(frames)
    if host_facts is None and "host_facts" in frames:
        host_facts = frames["host_facts"].collect()
    frames.pop("host_facts", None)
    feats = features if features is not None else compute_features(frames, config.window, host_facts=host_facts)
    m = _Matrix.of(feats, config)
    scored = np.ones(feats.height, dtype=bool)
    if score_since is not None:
        since = score_since if score_since.tzinfo else score_since.replace(tzinfo=UTC)
        scored = (feats[WINDOW_START] >= since).to_numpy()
    warm = m.warm(config, None)
    rng = np.random.default_rng(config.random_state)
    blocks = _self_blocks(config, m, scored, warm, rng) if "self" in config.references else []
    cohort_of = frame_cohorts(config, feats, host_facts)
    blocks += _cohort_blocks(config, m, cohort_of, scored, warm)
    return _result(feats, m, config, blocks, cohort_of)


def _result(feats: pl.DataFrame, m: _Matrix, config: AnalyticsConfig, blocks: list[_Block],
            cohort_of: Mapping[str, str]) -> AnalysisResult:
    """Edges confirmed, persistence, then the scores and findings tables of ``blocks``."""
    if m.edge.any():
        _confirm_edges(feats, m.cols, config, blocks, m.edge)
    stride_us = round(config.window.stride_s * 1e6)
    for b in blocks:
        flags = persistent(scores_to_labels(b.combined, 1.0), m.starts_us[b.rows], stride_us, config.min_run)
        b.combined_flags = flags & b.judged if b.judged is not None else flags
    scores = _scores_table(feats, blocks)
    # "both": a host's findings come from its cohort when it has one (peers doing the same
    # thing at the same time cancel workload phases that self-history would flag), else
    # from its own history; the scores table keeps both
    with_cohort = {b.host for b in blocks if b.reference == "cohort"}
    verdict = [b for b in blocks if b.reference == "cohort" or b.host not in with_cohort]
    findings = _findings_table(feats, m.X, m.cols, verdict, config)
    return AnalysisResult(features=feats, scores=scores, findings=findings, config=config, cohorts=dict(cohort_of))


def rows_by_host(feats: pl.DataFrame) -> dict[str, np.ndarray]:
    """host -> its row indices, ascending; hosts in order of first appearance. One grouping:
    comparing every row with each host grows with the square of the fleet."""
    g = feats.select(HOST).with_row_index("_r").group_by(HOST, maintain_order=True).agg("_r")
    return {h: np.sort(r.to_numpy()).astype(np.intp) for h, r in zip(g[HOST].to_list(), g["_r"], strict=True)}


@dataclass
class _Matrix:
    """A feature frame as the detectors see it (:func:`_detection_matrix`) with what
    fitting and scoring read per row."""

    cols: list[str]
    X: RepeatedRows
    edge: np.ndarray
    floors: np.ndarray
    sign: np.ndarray
    weight: np.ndarray
    capped: bool
    host_arr: np.ndarray
    hosts: list[str]
    host_rows: dict[str, np.ndarray]
    starts_us: np.ndarray

    @classmethod
    def of(cls, feats: pl.DataFrame, config: AnalyticsConfig) -> _Matrix:
        cols = feature_columns(feats)
        X, edge = _detection_matrix(feats, cols, config)
        floors = np.array([lookup(c).floor for c in cols], dtype=np.float64)
        sign, weight = evidence_weights(cols, config)
        # thresholds are capped (detectors' max_threshold) only on catalog telemetry, whose
        # scales have floors; imported metrics have none
        capped = bool(cols) and all(lookup(c).family in FAMILIES for c in cols)
        rows = rows_by_host(feats)
        return cls(cols, X, edge, floors, sign, weight, capped, feats[HOST].to_numpy(), list(rows), rows,
                   feats[WINDOW_START].dt.epoch("us").to_numpy())

    def warm(self, config: AnalyticsConfig, first_us: Mapping[str, int] | None) -> np.ndarray:
        """Per row: out of the host's first ``warmup`` of data. A host's first `warmup` is
        not judged: no history to compare it with, and start-up (a model load after boot)
        is unlike everything after it, yet benign (its windows are scored, but never
        flagged: `combined` and findings stay quiet). ``first_us``: host -> its first
        window start (µs) when the frame does not begin with it (default: the frame's)."""
        return _out_of_warmup(self.starts_us, self.host_rows, config, first_us)


def _out_of_warmup(starts_us: np.ndarray, host_rows: Mapping[str, np.ndarray], config: AnalyticsConfig,
                   first_us: Mapping[str, int] | None) -> np.ndarray:
    first = np.zeros(starts_us.size, dtype=np.int64)
    for h, rows in host_rows.items():
        first[rows] = first_us[h] if first_us is not None and h in first_us else starts_us[rows].min()
    return np.asarray(starts_us >= first + round(config.warmup.total_seconds() * 1e6))


def _self_blocks(config: AnalyticsConfig, m: _Matrix, scored: np.ndarray, warm: np.ndarray,
                 rng: np.random.Generator) -> list[_Block]:
    """Every host's block of the frame's ``scored`` rows judged against all its windows of
    the frame (``self``; at least ``min_windows`` of them)."""
    blocks: list[_Block] = []
    for h in m.hosts:
        rows = m.host_rows[h]
        target = rows[scored[rows]]
        if rows.size < config.min_windows or target.size == 0:
            log.info("host %s: %d windows < min_windows=%d, no self reference", h, rows.size, config.min_windows)
            continue
        ref = _subsample(rows, config.max_reference_rows, rng)
        blocks.append(_Block(h, "self", target, *_fit_and_score(config, m.X, ref, target, m.floors, m.sign, m.weight,
                                                                m.capped), judged=warm[target]))
    return blocks


def _hash_rank(h: str) -> tuple[bytes, str]:
    return hashlib.blake2b(h.encode(), digest_size=8).digest(), h


def cohort_sample(members: Sequence[str], size: int, strata: Mapping[str, str] | None = None) -> list[str]:
    """The hosts of a cohort its reference is drawn from: all of them when there are at
    most ``size``, else the ``size`` whose names hash lowest (blake2b); sorted by name (the
    peers' rows are concatenated in this order, whatever order the cohorts came in). A
    host's verdict then depends on a bounded set of peers whatever the fleet size (the peer
    spread, a maximum over peers, would otherwise grow with the fleet), one reference
    serves every host outside the sample, and the choice is stable from step to step and
    sweep to sweep (a hash, not the first names, which often share a rack).

    ``strata``: host -> a finer group inside the cohort (the behaviour cohorts of a
    hardware cohort, which the signature matcher's references span): the sample keeps
    each group's share of the cohort (largest remainder), its lowest hashes within each.
    A hash-only sample of a cohort mixing two workloads half and half can draw mostly one,
    and its median is then that workload's, not the cohort's (a 256-host simulated fleet drew
    5 serving hosts of 16; a 24-host one with a sample of 4: 12 first-window THP matches
    hash-only, 2 stratified). Only as good as the strata: in a fleet's first minute the
    behaviour cohorts do not yet tell the workloads apart."""
    if len(members) <= size:
        return sorted(members)
    ranked = sorted(members, key=_hash_rank)
    groups: dict[str, list[str]] = {}
    for h in ranked:
        groups.setdefault("" if strata is None else strata.get(h, ""), []).append(h)
    if len(groups) == 1:
        return sorted(ranked[:size])
    exact = {k: size * len(v) / len(members) for k, v in groups.items()}
    take = {k: int(x) for k, x in exact.items()}
    for k in sorted(groups, key=lambda k: (take[k] - exact[k], k))[:size - sum(take.values())]:
        take[k] += 1
    return sorted(h for k, v in groups.items() for h in v[:take[k]])


def matcher_sample(hardware: Mapping[str, str], strata: Mapping[str, str], size: int) -> set[str]:
    """The hosts the signature matcher's cohort references are drawn from: each hardware
    cohort's :func:`cohort_sample` (of ``hardware``'s hosts: those with windows) kept in
    the shares of its behaviour cohorts (``strata``, analytics' cohorts)."""
    return {h for members in cohort_members(hardware).values() for h in cohort_sample(members, size, strata)}


@dataclass(frozen=True)
class CohortReference:
    """What a cohort's hosts are judged with in one analysis step: the sample, the whole
    sample's fit (every host outside it), each sampled host's fit on the other sampled
    hosts (``fits``: the pool the thresholds come from), and the thresholds pooled from
    the sampled hosts' out-of-sample scores (detector -> (threshold, median)). Computed
    once per step on the sample's windows (:func:`cohort_references`), it lets the step
    judge its hosts in batches that do not hold each other's windows, and fit each
    reference once (a batch refitted its sampled hosts' references: ~30 % of a step's fits)."""

    sample: tuple[str, ...]
    shared: _Fit | None
    thresholds: Mapping[str, tuple[float, float]]
    fits: Mapping[str, _Fit] = field(default_factory=dict)  # sampled host -> its fit on the others

    def only(self, hosts: Collection[str]) -> CohortReference:
        """This reference with the sampled hosts' fits of ``hosts`` only (what a worker
        judging those hosts needs: a fit pickles to ~0.9 MB)."""
        return replace(self, fits={h: f for h, f in self.fits.items() if h in hosts})


def _cohort_rng(config: AnalyticsConfig, label: str) -> np.random.Generator:
    """A cohort's own random generator (the rows its references subsample): the same draws
    whether a step's cohorts are fitted together or each in a worker of its own."""
    return np.random.default_rng([config.random_state, zlib.crc32(label.encode())])


def _cohort_blocks(config: AnalyticsConfig, m: _Matrix, cohort_of: Mapping[str, str], scored: np.ndarray,
                   warm: np.ndarray, given: Mapping[str, CohortReference] | None = None,
                   made: dict[str, CohortReference] | None = None,
                   judge: Collection[str] | None = None) -> list[_Block]:
    """Every host's block of the frame's ``scored`` rows judged against its cohort peers'
    scored rows out of warm-up (``cohort``; ``cohort_of``: host -> cohort). The peers are
    the cohort's sample (:func:`cohort_sample` of the members with such rows): a sampled
    host is judged against the other sampled hosts, every other host against the whole
    sample (one fit). Thresholds are recalibrated per cohort on the sampled hosts'
    out-of-sample scores. ``given``: the cohorts' references from the step's sample
    frame (this frame is a batch of hosts; a sampled host of it is judged with its fit
    from there); a cohort absent from it has none; ``judge``: the hosts whose blocks are
    wanted then (None: all). ``made``: filled with the references computed here."""
    X, floors, host_rows = m.X, m.floors, m.host_rows
    none = np.zeros(0, dtype=np.int64)
    judged = scored & warm
    blocks: list[_Block] = []
    for label, members in cohort_members(cohort_of).items():
        if len(members) < config.min_cohort:
            log.info("cohort %s has %d host(s) < min_cohort=%d", label, len(members), config.min_cohort)
            continue
        ref = given.get(label) if given is not None else None
        if given is not None and ref is None:
            continue
        rng = _cohort_rng(config, label)
        cohort_blocks: list[_Block] = []
        rows_of = {h: host_rows.get(h, none) for h in members}
        # start-up windows are no reference: every peer loads its model at boot
        ref_rows = {h: rows_of[h][judged[rows_of[h]]] for h in members}
        sample = list(ref.sample) if ref is not None else cohort_sample(
            [h for h in members if ref_rows[h].size], config.cohort_sample)
        in_sample = set(sample)
        level = {h: _host_level(X, ref_rows[h]) for h in sample}
        shared = ref.shared if ref is not None else None  # the whole sample's fit: every host outside it
        for h in members:
            target = rows_of[h][scored[rows_of[h]]]
            if target.size == 0 or (ref is not None and judge is not None and h not in judge):
                continue
            if h in in_sample and ref is not None and h in ref.fits:  # (fitted for the thresholds)
                f = ref.fits[h]
                cohort_blocks.append(_Block(h, "cohort", target, f, *_score(config, f, f.evidence_rows(X.take(target))),
                                            judged=warm[target]))
                continue
            # no two healthy hosts are identical: a feature's scale is at least the
            # largest offset of one peer's median from the peers' median, so the host
            # is judged on deviations larger than any healthy peer shows
            if h in in_sample:
                peers = np.concatenate([ref_rows[p] for p in sample if p != h] or [none])
                if peers.size < config.min_windows:
                    continue
                spread = _peer_spread(np.vstack([level[p] for p in sample if p != h]))
                cohort_blocks.append(_Block(h, "cohort", target,
                                            *_fit_and_score(config, X, _subsample(peers, config.max_reference_rows,
                                                                                  rng),
                                                            target, np.fmax(floors, spread), m.sign, m.weight,
                                                            m.capped), judged=warm[target]))
                continue
            if shared is None and ref is None:
                shared = _sample_fit(config, m, [ref_rows[p] for p in sample], [level[p] for p in sample], rng)
            if shared is None:
                continue
            cohort_blocks.append(_Block(h, "cohort", target, shared,
                                        *_score(config, shared, shared.evidence_rows(X.take(target))),
                                        judged=warm[target]))
        if ref is not None:
            thresholds = ref.thresholds
        else:
            pool = [b for b in cohort_blocks if b.host in in_sample]
            thresholds = _cohort_thresholds(pool or cohort_blocks)
            if made is not None:
                if shared is None and len(members) > len(sample):
                    shared = _sample_fit(config, m, [ref_rows[p] for p in sample], [level[p] for p in sample], rng)
                made[label] = CohortReference(tuple(sample), shared, thresholds, {b.host: b.fit for b in pool})
        _recalibrate_cohort(config, cohort_blocks, thresholds)
        blocks += cohort_blocks
    return blocks


def _sample_fit(config: AnalyticsConfig, m: _Matrix, rows: Sequence[np.ndarray], levels: Sequence[np.ndarray],
                rng: np.random.Generator) -> _Fit | None:
    """The fit of a cohort's whole sample (its hosts' ``rows`` and ``levels``): the reference
    of every host outside it; None with fewer than ``min_windows`` rows."""
    peers = np.concatenate([*rows, np.zeros(0, dtype=np.int64)])
    if peers.size < config.min_windows:
        return None
    spread = _peer_spread(np.vstack(levels))
    fit, _ = _fit(config, m.X.take(_subsample(peers, config.max_reference_rows, rng)),
                  np.fmax(m.floors, spread), m.sign, m.weight, m.capped)
    return fit


def frame_cohorts(config: AnalyticsConfig, feats: pl.DataFrame, host_facts: pl.DataFrame | None) -> dict[str, str]:
    """host -> cohort when the frame has a cohort reference (else empty)."""
    n = feats[HOST].n_unique()
    return batched_cohorts(config, [cohort_inputs(config, feats, host_facts, n)], n)[0]


def cohort_inputs(config: AnalyticsConfig, part: pl.DataFrame, host_facts: pl.DataFrame | None,
                  n_hosts: int) -> tuple[dict[str, str], pl.DataFrame | None]:
    """What :func:`batched_cohorts` needs of one part of a fleet of ``n_hosts`` hosts (the
    behaviour and GPU columns suffice): its hosts' hardware cohorts and, when the cohorts
    are behavioural, their profiles. Per host, so a part is reduced where it is read."""
    profiled = "cohort" in config.references and n_hosts >= config.min_cohort and config.cohort_by == "behaviour"
    return hardware_cohorts(part, host_facts), behaviour_profiles(part) if profiled else None


def batched_cohorts(config: AnalyticsConfig, parts: Iterable[tuple[dict[str, str], pl.DataFrame | None]],
                    n_hosts: int) -> tuple[dict[str, str], dict[str, str]]:
    """(host -> cohort as :func:`frame_cohorts` forms it, host -> hardware cohort) of the
    ``n_hosts`` hosts of ``parts``: :func:`cohort_inputs` of frames of disjoint hosts (a
    fleet read a batch at a time)."""
    hardware: dict[str, str] = {}
    profiles = []
    for hw, profile in parts:
        hardware.update(hw)
        if profile is not None:
            profiles.append(profile)
    if "cohort" not in config.references or n_hosts < config.min_cohort:
        return {}, hardware
    if config.cohort_by != "behaviour":
        return dict(hardware), hardware
    return cluster_cohorts(hardware, pl.concat(profiles, how="diagonal_relaxed"), config.cohort_tolerance), hardware


def cohort_samples(keys: pl.DataFrame, config: AnalyticsConfig, cohort_of: Mapping[str, str], *,
                   score_since: datetime, first_us: Mapping[str, int] | None = None) -> set[str]:
    """The hosts of every cohort's sample as :func:`score` chooses them on a frame with the
    windows ``keys`` (host, window_start): members with windows scored from ``score_since``
    on and out of warm-up (:func:`cohort_sample`), in cohorts of at least ``min_cohort``."""
    rows = rows_by_host(keys)
    starts = keys[WINDOW_START].dt.epoch("us").to_numpy()
    judged = (keys[WINDOW_START] >= score_since).to_numpy() & _out_of_warmup(starts, rows, config, first_us)
    ready = {h for h, r in rows.items() if judged[r].any()}
    return {h for members in cohort_members(cohort_of).values() if len(members) >= config.min_cohort
            for h in cohort_sample([m for m in members if m in ready], config.cohort_sample)}


# ------------------------------------------------------------ fit once, score many
@dataclass(frozen=True)
class Reference:
    """Each host's own reference (``self``) fitted once on a frame of its windows
    (:func:`fit`): the evidence transform and the detectors with their thresholds, that
    later windows are scored against (:func:`score`); and each host's number of windows
    in the frame."""

    config: AnalyticsConfig
    cols: tuple[str, ...]
    fits: Mapping[str, _Fit]  # host -> its fitted reference
    windows: Mapping[str, int]


def fit(features: pl.DataFrame, config: AnalyticsConfig | None = None) -> Reference:
    """Every host's own reference fitted on its windows of ``features`` (the reference
    period; at least ``min_windows`` of them), as :func:`analyze` fits it."""
    config = config or AnalyticsConfig()
    if features.is_empty():
        return Reference(config, tuple(feature_columns(features)), {}, {})
    m = _Matrix.of(features, config)
    every = np.ones(features.height, dtype=bool)
    blocks = _self_blocks(config, m, every, every, np.random.default_rng(config.random_state))
    return Reference(config, tuple(m.cols), {b.host: b.fit for b in blocks},
                     {h: int(r.size) for h, r in m.host_rows.items()})


def score(features: pl.DataFrame, config: AnalyticsConfig, references: Mapping[str, Reference], *,
          score_since: datetime | None = None,
          first_us: Mapping[str, int] | None = None, cohort_of: Mapping[str, str] | None = None,
          host_facts: pl.DataFrame | None = None,
          cohort_refs: Mapping[str, CohortReference] | None = None,
          judge: Collection[str] | None = None) -> AnalysisResult:
    """The windows of ``features`` starting at or after ``score_since`` (None: all),
    judged as :func:`analyze` judges them, except that each host's own reference is
    ``references[host]`` (fitted by :func:`fit` on other windows; hosts without one have
    no ``self`` reference). The cohort reference is contemporaneous, fitted here: the
    peers' scored windows (``cohort_of``: host -> cohort; None: :func:`cohorts` of this
    frame). The earlier windows of the frame serve the running medians the detectors see
    (and the cohorts when not given). ``first_us``: host -> its first window start (µs since
    the epoch) when the frame does not begin with the host's data (its warm-up).
    ``cohort_refs``: the cohorts' references of this step (:func:`cohort_references`, with
    the sampled hosts' fits) when the frame holds a batch of the step's hosts, ``judge``
    those hosts. Every reference must have the frame's feature columns and been fitted
    with ``config``."""
    refs = list({id(r): r for r in references.values()}.values())
    if any(r.config != config for r in refs):
        raise ValueError("score: a reference was fitted with another analytics config")
    m = _Matrix.of(features, config)
    bad = [r for r in refs if r.cols != tuple(m.cols)]
    if bad:
        raise ValueError(f"score: a reference has {len(bad[0].cols)} feature columns, the frame {len(m.cols)}: "
                         "fit and score frames must have the same columns")
    scored = np.ones(features.height, dtype=bool)
    if score_since is not None:
        since = score_since if score_since.tzinfo else score_since.replace(tzinfo=UTC)
        scored = (features[WINDOW_START] >= since).to_numpy()
    warm = m.warm(config, first_us)
    blocks: list[_Block] = []
    if "self" in config.references:
        for h in m.hosts:
            ref = references.get(h)
            target = m.host_rows[h][scored[m.host_rows[h]]]
            f = ref.fits.get(h) if ref is not None else None
            if f is None or not target.size:
                continue
            blocks.append(_Block(h, "self", target, f, *_score(config, f, f.evidence_rows(m.X.take(target))),
                                 judged=warm[target]))
    if cohort_of is None:
        cohort_of = frame_cohorts(config, features, host_facts)
    blocks += _cohort_blocks(config, m, cohort_of, scored, warm, given=cohort_refs, judge=judge)
    return _result(features, m, config, blocks, cohort_of)


def cohort_references(features: pl.DataFrame, config: AnalyticsConfig, cohort_of: Mapping[str, str], *,
                      score_since: datetime, first_us: Mapping[str, int] | None = None
                      ) -> dict[str, CohortReference]:
    """Cohort -> its reference for the windows of ``features`` starting at or after
    ``score_since``, as :func:`score` forms it; ``features`` must hold the cohorts'
    sampled hosts (their windows from a ``smooth`` before ``score_since`` on suffice)."""
    m = _Matrix.of(features, config)
    scored = (features[WINDOW_START] >= score_since).to_numpy()
    made: dict[str, CohortReference] = {}
    _cohort_blocks(config, m, cohort_of, scored, m.warm(config, first_us), made=made)
    return made


def _scores_table(feats: pl.DataFrame, blocks: Sequence[_Block]) -> pl.DataFrame:
    parts = []
    all_keys = feats.select(KEYS)  # gather the key columns only, not every feature
    for b in blocks:
        keys = all_keys[b.rows] if b.rows.size else all_keys.clear()
        for name in [*b.scores, COMBINED]:
            if name == COMBINED:
                s, thr, fl = b.combined, 1.0, b.combined_flags
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


def _findings_table(feats: pl.DataFrame, X: RepeatedRows, cols: Sequence[str], blocks: Sequence[_Block],
                    config: AnalyticsConfig) -> pl.DataFrame:
    # best reference per window: the flagged block with the largest combined score
    best: dict[int, tuple[float, _Block, int]] = {}
    for b in blocks:
        assert b.combined_flags is not None
        for i in np.flatnonzero(b.combined_flags).tolist():
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
        z = b.fit.evidence(X.gather(rows))
        flagged_by = [tuple(d for d in b.flags if b.flags[d][i]) or tuple(b.fit.models) for i in local]
        # one vectorised explanation per set of flagging detectors
        for dets in dict.fromkeys(flagged_by):
            sel = np.array([n for n, f in enumerate(flagged_by) if f == dets], dtype=np.int64)
            contrib = {d: b.fit.models[d].contributions(z[sel]) for d in dets}
            # the window's own (unsmoothed) values; the reference is the smoothed median
            raw = feats.select(cols)[rows[sel]].to_numpy().astype(np.float64) if cols else X.gather(rows[sel])
            t, prof = attribution.explain(contrib, raw, b.fit.scaler.center_, cols, config.top_k)
            tops += t
            profiles.append(prof)
            recs += [{"_row": int(rows[n]), "reference": b.reference, "score": float(b.combined[local[n]]),
                      "detectors": list(dets)} for n in sel.tolist()]
    keys = feats.select(KEYS)[[r["_row"] for r in recs]]
    prof_arr = np.vstack(profiles)
    out = keys.with_columns(
        pl.Series("reference", [r["reference"] for r in recs], dtype=pl.String),
        pl.Series("score", [r["score"] for r in recs], dtype=pl.Float64),
        pl.Series("detectors", [r["detectors"] for r in recs], dtype=pl.List(pl.String)),
        attribution.factors_series(tops),
        *[pl.Series(c, prof_arr[:, j], dtype=pl.Float64) for j, c in enumerate(attribution.SHARE_COLUMNS)],
    )
    return out.select([pl.col(c).cast(t) for c, t in FINDINGS_SCHEMA.items()]).sort(HOST, WINDOW_START)
