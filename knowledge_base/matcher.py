"""Fingerprint matching: anomalous windows -> ranked knowledge-base candidates.

For every finding (an anomalous window with its attribution) and every entry:

1. **preconditions** on the host's facts (at the window's time) must hold;
2. each **signal** of the signature is evaluated on the window's feature values against two
   references computed here from the ``features`` frame, with the same robust
   standardisation as the detectors (median, scale floored by the catalog):

   * ``self``: the host's own windows in the frame (history included);
   * ``cohort``: the pooled windows of its peers (same cohort as the analytics use), when the
     cohort has at least ``min_cohort`` hosts — so a host misconfigured since boot still
     shows its signals.

   A signal *matches* on a device when, under either reference, its robust z in the
   expected direction is >= ``min_z`` and the absolute change is >= ``min_change`` (a match
   under ``self`` only is vetoed where the cohort z is below 1: the value is normal among
   peers, so the host's own history is what is odd), and the
   value is within ``value_below``/``value_above``. It is *contradicted* when every device
   with data moved the other way by as much. *Missing* otherwise (or *unavailable* when the
   feature has no data);
3. a candidate is **valid** when the preconditions hold, every required signal (group)
   matches and no ``excludes`` signal is present;
4. **confidence** = ``(1 - a) * signature + a * attribution``. ``signature`` =
   0.6 x the required signals' credit + 0.4 x the supporting signals' weighted credit
   (1 for a match, up to 0.5 for a move in the right direction below threshold, -0.5 for a
   contradiction; supporting signals without data are left out, and none at all counts
   0.25). ``attribution`` is how much of the detectors' attribution falls on the entry's
   signature families or subsystems (0 when the window has no attribution). An entry whose
   ``excludes`` signal is present has its confidence multiplied by ``excludes_penalty``. A
   candidate is a **match** when valid and confidence >= the entry's ``min_confidence``.

Output (:func:`match_findings`, one row per (window, candidate), best first): host,
window_start, window_end, rank, entry_id, label_type, confidence, matched, devices,
matched_signals, missing_signals, contradicted_signals, explanation. Deterministic: the
same inputs give identical output (no randomness; ties broken by entry id).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from analytics.attribution import SHARE_COLUMNS
from analytics.catalog import lookup, split_feature
from analytics.detectors import STATS_MAX_ROWS, RepeatedRows, RobustStandardizer
from analytics.pipeline import cohort_members, cohort_sample, rows_by_host
from knowledge_base.facts import FactsIndex, HostFacts, _compare
from knowledge_base.loader import Entry, KnowledgeBase, Signal, load_kb

log = logging.getLogger(__name__)

HOST, WS, WE = "host", "window_start", "window_end"
TS = pl.Datetime("us", "UTC")

MATCH_SCHEMA: dict[str, pl.DataType] = {
    HOST: pl.String(),
    WS: TS,
    WE: TS,
    "rank": pl.Int32(),
    "entry_id": pl.String(),
    "label_type": pl.String(),
    "confidence": pl.Float64(),
    "matched": pl.Boolean(),
    "devices": pl.List(pl.String()),
    "matched_signals": pl.List(pl.String()),
    "missing_signals": pl.List(pl.String()),
    "contradicted_signals": pl.List(pl.String()),
    "explanation": pl.String(),
}

#: a self-reference match is vetoed when the cohort z is below this (value normal among peers)
COHORT_VETO_Z = 1.0

#: share of the signature score carried by the required signals (the rest: supporting ones)
REQUIRED_SHARE = 0.6

EVAL_SCHEMA: dict[str, pl.DataType] = {HOST: pl.String(), WS: TS, "match_type": pl.String(), "confidence": pl.Float64()}


@dataclass(frozen=True)
class MatchConfig:
    """Matcher knobs (the defaults are what the targets were measured with)."""

    min_cohort: int = 3
    cohort_sample: int = 16  # peers drawn from at most this many hosts of a cohort (analytics.pipeline.cohort_sample)
    top_n: int = 3
    attribution_weight: float = 0.25
    excludes_penalty: float = 0.3
    max_reference_rows: int = 20000
    min_pre_windows: int = 10  # windows before a fact change needed for the "before" reference
    # the host's own reference: only its windows starting before this time (the sweep: the
    # past of the analysis step); fewer than min_pre_windows of them: no own reference
    reference_before: datetime | None = None
    # the hosts the cohort references are drawn from, chosen over the whole fleet of the
    # step (analytics.pipeline.matcher_sample; a batch of it is matched at a time); None:
    # each cohort's cohort_sample of the hosts in the features frame
    sampled: frozenset[str] | None = None
    # the step's cohort references formed once over those hosts (:func:`cohort_peers`):
    # then the features frame holds the batch's hosts only, not the sample's history too
    peers: CohortPeers | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.min_cohort < 2:
            raise ValueError(f"match.min_cohort must be >= 2, not {self.min_cohort!r}")
        if self.cohort_sample < 1:
            raise ValueError(f"match.cohort_sample must be >= 1, not {self.cohort_sample!r}")
        if self.top_n < 1:
            raise ValueError(f"match.top_n must be >= 1, not {self.top_n!r}")
        for k in ("attribution_weight", "excludes_penalty"):
            v = getattr(self, k)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"match.{k} must be in [0, 1], not {v!r}")


# --------------------------------------------------------------------------- references
@dataclass
class _Refs:
    """Per flagged window and relevant feature: value, and center/scale of both references."""

    cols: list[str]
    value: np.ndarray  # (n, p)
    c_self: np.ndarray
    s_self: np.ndarray
    c_coh: np.ndarray
    s_coh: np.ndarray
    # per watched fact: center/scale of the host's windows before that fact's last change
    # (nan where the window follows no change); used by the entries that read the fact
    pre: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def empty(cls, cols: list[str], n: int) -> _Refs:
        def nan() -> np.ndarray:
            return np.full((n, len(cols)), np.nan)

        return cls(cols, nan(), nan(), nan(), nan(), nan())


def _fit_ref(X: np.ndarray, floors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Center and scale (NaN where the reference has no data). ``X`` is :func:`_matrix`'s
    (float64, no infinite value): it goes in as the pipeline's own matrices do."""
    st = RobustStandardizer(floors=floors).fit(RepeatedRows(X))
    c = np.where(st.in_use_, st.center_, np.nan)
    s = np.where(st.in_use_, st.scale_, np.nan)
    return c, s


def _thin(rows: np.ndarray, limit: int) -> np.ndarray:
    """Deterministic subsample (every k-th row) of a large reference: at most ``limit``
    rows, then the :data:`~analytics.detectors.STATS_MAX_ROWS` of them that the
    standardiser's statistics read (the same rows; the others would be gathered, copied
    and checked for nothing: ~40 % of a cohort reference's fit)."""
    for n in (limit, STATS_MAX_ROWS):
        if rows.size > n:
            rows = rows[np.linspace(0, rows.size - 1, n).astype(np.int64)]
    return rows


def hardware_cohorts(features: pl.DataFrame, host_facts: pl.DataFrame | None) -> dict[str, str]:
    """host -> hardware cohort (GPU count and model): the matcher's peers. Hardware, not
    behaviour: a signature asks "is this value normal for this kind of machine", and the
    signatures were calibrated with peers running other workloads of the same hardware."""
    from analytics.pipeline import hardware_cohorts as by_hardware

    return by_hardware(features, host_facts)


def fact_changes(host_facts: pl.DataFrame | None, facts: frozenset[str]) -> dict[str, list[Any]]:
    """host -> sorted times at which one of ``facts`` (``category.key``, any device) took a
    new value (its first reading is not a change)."""
    out: dict[str, list[Any]] = {}
    if (host_facts is None or host_facts.is_empty() or not facts
            or not {"time", "category", "key", HOST} <= set(host_facts.columns)):
        return out
    cat_key = pl.concat_str(pl.col("category"), pl.lit("."), pl.col("key"))
    df = host_facts.filter(cat_key.is_in(sorted(facts))).with_columns(
        pl.col("device").fill_null("") if "device" in host_facts.columns else pl.lit("").alias("device"))
    if df.is_empty():
        return out
    grp = [HOST, "category", "device", "key"]
    ch = (df.sort([*grp, "time"])
          .with_columns(pl.col("value").cast(pl.String).fill_null("").alias("_v"))
          .filter((pl.col("_v") != pl.col("_v").shift(1).over(grp)).fill_null(False))
          .select(HOST, pl.col("time").cast(TS)).unique().sort(HOST, "time"))
    for h, t in ch.iter_rows():
        out.setdefault(h, []).append(t)
    return out


@dataclass
class CohortPeers:
    """The rows the references are drawn from, and the references fitted on them: a
    features frame's (:func:`_frame`, its hosts' own and its cohorts' samples) or one
    analysis step's matcher sample (:func:`cohort_peers`, read once and shared by the
    step's batches of hosts: the cohort references a batch's frame would give when it also
    held the sample's windows, the same rows in the same order). Fitted on first use."""

    cols: tuple[str, ...]
    values: pl.DataFrame  # the windows' relevant columns (``cols``), one row per window
    floors: np.ndarray
    cohort_of: dict[str, list[str]]  # host -> the hosts of its hardware cohort
    rows_of: dict[str, np.ndarray]  # host -> its rows of ``values``, ascending
    cohort_rows: dict[str, np.ndarray]  # host -> the rows of its cohort's sampled hosts, ascending
    sampled: set[str]  # the hosts of the cohorts' samples (the others share their cohort's reference)
    fitted: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows ``rows`` (ascending) of ``values`` as a matrix: a run of rows (a host's
        own past) is sliced, other rows gathered. No matrix of the whole frame is built: the
        references read at most :data:`~analytics.detectors.STATS_MAX_ROWS` rows
        (:func:`_thin`), and a row-major matrix of a step's sample (~16 hosts' hour) cost
        ~4 % of a live cycle to gather those few."""
        if rows.size and int(rows[-1]) - int(rows[0]) + 1 == rows.size:
            return _matrix(self.values.slice(int(rows[0]), rows.size))
        return self.gather(rows)

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """The rows ``rows`` (any order) of ``values`` as a matrix."""
        return _matrix(self.values[rows])

    def ref(self, key: tuple[Any, ...], rows: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Center and scale of ``rows`` (at most ``limit`` of them), remembered under ``key``
        (which must name what selected the rows)."""
        got = self.fitted.get((*key, limit))
        if got is None:
            got = _fit_ref(self.take(_thin(rows, limit)), self.floors)
            self.fitted[(*key, limit)] = got
        return got


def _matrix(values: pl.DataFrame) -> np.ndarray:
    """``values`` as a float64 matrix, NaN where not finite, column-major: Polars' own
    layout (a row-major copy costs ~4x), and the standardiser's statistics read columns."""
    X = values.to_numpy(writable=True).astype(np.float64, copy=False)
    X[~np.isfinite(X)] = np.nan
    return X


@dataclass
class _Frame:
    """What the references read from one features frame, kept between the calls on the
    same frame (:func:`_frame`): a sweep step matches its windows twice (the signature
    detector, then the findings) against the same history."""

    features: pl.DataFrame  # (kept: the memo is valid while this very object is)
    key: tuple[Any, ...]
    feats: pl.DataFrame  # keys and the relevant columns, row-indexed
    starts: np.ndarray  # window starts, µs since the epoch
    rows: CohortPeers  # its windows and the references fitted on them


def signature_families(kb: KnowledgeBase) -> frozenset[str]:
    """The feature families the knowledge base's signatures read (the references' columns)."""
    return frozenset(f for e in kb for s in e.signals if s.fact is None
                     for f in (s.family, s.gate.feature if s.gate and s.gate.feature else s.family))


def reference_columns(columns: Sequence[str], kb: KnowledgeBase | frozenset[str]) -> list[str]:
    """The columns of a features frame that the matcher's references read (``kb``: the
    knowledge base, or the :func:`signature_families` of one)."""
    families = kb if isinstance(kb, frozenset) else signature_families(kb)
    return [c for c in columns if c not in (HOST, WS, WE) and split_feature(c)[0] in families]


def _peers(sel: pl.DataFrame, cols: Sequence[str], hardware: Mapping[str, str],
           choose: Callable[[list[str]], list[str]]) -> CohortPeers:
    """:class:`CohortPeers` of the windows ``sel`` (host and ``cols``, by host then window):
    each hardware cohort's sample is ``choose`` of its members that have windows."""
    groups = cohort_members(dict(sorted(hardware.items())))
    rows_of = rows_by_host(sel)
    cohort_rows: dict[str, np.ndarray] = {}
    sampled: set[str] = set()
    for members in groups.values():
        chosen = choose([m for m in members if m in rows_of])
        rows = np.sort(np.concatenate([rows_of[m] for m in chosen] or [np.zeros(0, np.intp)]))
        cohort_rows.update({h: rows for h in members})
        sampled.update(chosen)
    return CohortPeers(tuple(cols), sel.select(cols), np.array([lookup(c).floor for c in cols], dtype=np.float64),
                       {h: members for members in groups.values() for h in members}, rows_of, cohort_rows, sampled)


def cohort_peers(sample: pl.DataFrame, hardware: Mapping[str, str], kb: KnowledgeBase) -> CohortPeers:
    """The matcher's cohort references of an analysis step (:class:`CohortPeers`):
    ``sample``, the windows of the matcher's sample (every step's history of it, the
    fleet's feature columns or at least :func:`reference_columns` of them);
    ``hardware``: host -> hardware cohort of every host of the step."""
    cols = reference_columns(sample.columns, kb)
    return _peers(sample.sort(HOST, WS).select(HOST, *cols), cols, hardware, lambda present: present)


_LAST_FRAME: list[_Frame] = []


def release_references() -> None:
    """Forget the references kept for the last features frame (:func:`_frame`): the caller
    is done with it, and its matrix is as large as the frame."""
    _LAST_FRAME.clear()


def _frame(features: pl.DataFrame, host_facts: pl.DataFrame | None, cols: list[str], sample: int,
           given: frozenset[str] | None) -> _Frame:
    key = (features.height, tuple(cols), id(host_facts), None if host_facts is None else host_facts.height, sample,
           given)
    if _LAST_FRAME and _LAST_FRAME[0].features is features and _LAST_FRAME[0].key == key:
        return _LAST_FRAME[0]
    _LAST_FRAME.clear()  # (its matrix is freed before the next one is built)
    feats = features.select(HOST, pl.col(WS).cast(TS), pl.col(WE).cast(TS), *cols).with_row_index("_r")

    def choose(present: list[str]) -> list[str]:
        return cohort_sample(present, sample) if given is None else [m for m in present if m in given]

    fr = _Frame(features, key, feats, feats[WS].dt.epoch("us").to_numpy(),
                _peers(feats, cols, hardware_cohorts(features, host_facts), choose))
    _LAST_FRAME[:] = [fr]
    return fr


def _references(findings: pl.DataFrame, features: pl.DataFrame, host_facts: pl.DataFrame | None,
                families: frozenset[str], cfg: MatchConfig, watched: frozenset[str] = frozenset()) -> _Refs:
    cols = reference_columns(features.columns, families)
    n, p = findings.height, len(cols)
    out = _Refs.empty(cols, n)
    if not p or not n:
        return out
    if cfg.peers is not None and cfg.peers.cols != tuple(cols):
        raise ValueError("match: the step's cohort references (MatchConfig.peers) were read with other feature "
                         f"columns than the frame's ({len(cfg.peers.cols)} against {len(cols)})")
    fr = _frame(features, host_facts, cols, cfg.cohort_sample, cfg.sampled)
    feats, starts = fr.feats, fr.starts
    before = cfg.reference_before
    if before is not None and before.tzinfo is None:
        before = before.replace(tzinfo=UTC)
    before_us = 0 if before is None else (before - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    keyed = findings.select(HOST, pl.col(WS).cast(TS)).with_row_index("_f").join(
        feats.select(HOST, pl.col(WS).cast(TS), "_r"), on=[HOST, WS], how="left")
    fidx = keyed["_f"].to_numpy()
    ridx = keyed["_r"].to_numpy()
    has = ~np.isnan(ridx.astype(np.float64)) if keyed["_r"].null_count() else np.ones(len(ridx), bool)
    ridx_i = np.where(has, np.nan_to_num(ridx.astype(np.float64)), 0).astype(np.int64)
    out.value[fidx[has]] = fr.rows.gather(ridx_i[has])
    fhosts = findings[HOST].to_numpy()
    limit = cfg.max_reference_rows
    none = np.zeros(0, np.intp)
    pr = fr.rows if cfg.peers is None else cfg.peers  # (the cohort references' rows)
    for h in sorted(set(fhosts.tolist())):
        target = np.flatnonzero(fhosts == h)
        own = fr.rows.rows_of.get(h, none)
        if cfg.reference_before is not None:
            # the past only; too little of it (a host's first seconds) is no reference at all
            own = own[starts[own] < before_us]
            if own.size < cfg.min_pre_windows:
                own = own[:0]
        if own.size:
            c, s = fr.rows.ref(("self", h, before_us if cfg.reference_before is not None else None), own, limit)
            out.c_self[target], out.s_self[target] = c, s
        members = pr.cohort_of.get(h, [])
        if len(members) >= cfg.min_cohort:
            if h in pr.sampled:  # the other sampled hosts
                peers = np.setdiff1d(pr.cohort_rows[h], pr.rows_of.get(h, none), assume_unique=True)
                key: tuple[str, ...] = ("cohort", h)
            else:  # the whole sample: one reference for every host outside it (members[0] names the cohort)
                peers, key = pr.cohort_rows[h], ("sample", members[0])
            if peers.size:
                c, s = pr.ref(key, peers, limit)
                out.c_coh[target], out.s_coh[target] = c, s
    for fact in sorted(watched):
        _pre_change(out, findings, fr, host_facts, fact, cfg)
    return out


def _pre_change(out: _Refs, findings: pl.DataFrame, fr: _Frame, host_facts: pl.DataFrame | None, fact: str,
                cfg: MatchConfig) -> None:
    """The ``before`` reference of a watched fact (one a signature reads, e.g. THP
    switched to ``never``): for a window after a change of that fact, the host's windows
    between the previous change and that one. A single host whose history is mostly after
    the change (no cohort, self-reference contaminated) still sees the change's effect."""
    changes = fact_changes(host_facts, frozenset({fact}))
    if not changes:
        return
    n, p = out.value.shape
    c_pre, s_pre = np.full((n, p), np.nan), np.full((n, p), np.nan)
    out.pre[fact] = (c_pre, s_pre)
    feats = fr.feats
    wstart = feats[WS].to_numpy()
    wend = feats[WE].to_numpy()
    fhosts = findings[HOST].to_numpy()
    fstart = findings[WS].cast(TS).to_numpy()
    for h, times in changes.items():
        target_h = np.flatnonzero(fhosts == h)
        own = fr.rows.rows_of.get(h, np.zeros(0, np.int64))
        if not target_h.size or not own.size:
            continue
        bounds = [np.datetime64(t.replace(tzinfo=None), "us") for t in times]
        for k, t in enumerate(bounds):
            nxt = bounds[k + 1] if k + 1 < len(bounds) else None
            tgt = target_h[(fstart[target_h] >= t) & ((fstart[target_h] < nxt) if nxt is not None else True)]
            if not tgt.size:
                continue
            lo = bounds[k - 1] if k else None
            before = own[(wend[own] <= t) & ((wstart[own] >= lo) if lo is not None else True)]
            if before.size < cfg.min_pre_windows:
                continue
            c, s = fr.rows.ref(("pre", h, lo, t), before, cfg.max_reference_rows)
            c_pre[tgt], s_pre[tgt] = c, s


def _references_from_factors(findings: pl.DataFrame, families: frozenset[str]) -> _Refs:
    """Degraded mode without a features frame: the findings' top factors only (value and
    reference median; the scale is the catalog floor), no cohort reference."""
    rows = findings.select(pl.col("top_factors")).with_row_index("_f").explode("top_factors").unnest("top_factors")
    rows = rows.filter(pl.col("family").is_in(sorted(families)))
    cols = sorted(set(rows["feature"].to_list())) if rows.height else []
    n = findings.height
    out = _Refs.empty(cols, n)
    pos = {c: j for j, c in enumerate(cols)}
    for f, feat, v, ref in rows.select("_f", "feature", "value", "reference").iter_rows():
        j = pos[feat]
        out.value[f, j] = np.nan if v is None else v
        out.c_self[f, j] = np.nan if ref is None else ref
        out.s_self[f, j] = max(lookup(feat).floor, 1e-9)
    return out


# --------------------------------------------------------------------------- signals
@dataclass
class _SigEval:
    signal: Signal
    matched: np.ndarray  # (n,) bool
    contradicted: np.ndarray  # (n,) bool
    available: np.ndarray  # (n,) bool
    strength: np.ndarray  # (n,) 0..1 best evidence in the expected direction
    best_z: np.ndarray  # (n,) best directional z (nan when unavailable)
    best_dev: list[str]  # (n,) device of the best column
    sat: np.ndarray  # (n, k) matched per column
    devs: list[str]  # (k,) device of each column

    def devices(self, i: int) -> list[str]:
        """Devices on which the signal matched in window ``i``."""
        return [self.devs[k] for k in np.flatnonzero(self.sat[i]) if self.devs[k]]


def _eval_signal(sig: Signal, refs: _Refs, col_family: list[str], col_device: list[str],
                 facts: Sequence[str] = ()) -> _SigEval:
    """``facts``: the facts the signal's entry reads; their "before the change" references
    count as the host's own history."""
    n = refs.value.shape[0]
    fam, dev = sig.family, sig.device
    idx = [j for j, (f, d) in enumerate(zip(col_family, col_device, strict=True)) if f == fam and (not dev or d == dev)]
    if not idx:
        z = np.zeros(n, bool)
        return _SigEval(sig, z, z.copy(), z.copy(), np.zeros(n), np.full(n, np.nan), [""] * n, np.zeros((n, 0), bool), [])
    d = 1.0 if sig.direction == "up" else -1.0
    V = refs.value[:, idx]
    if sig.absolute:
        return _eval_absolute(sig, idx, V, refs, col_family, col_device)
    with np.errstate(invalid="ignore", divide="ignore"):
        ch_s = d * (V - refs.c_self[:, idx])
        ch_c = d * (V - refs.c_coh[:, idx])
        z_s = ch_s / refs.s_self[:, idx]
        z_c = ch_c / refs.s_coh[:, idx]
        ok_s = (z_s >= sig.min_z) & (ch_s >= sig.min_change)
        ok_c = (z_c >= sig.min_z) & (ch_c >= sig.min_change)
        for fact in facts:
            if fact not in refs.pre:
                continue
            # the windows before the entry's fact changed are the host's own history too
            c_p, s_p = refs.pre[fact]
            ch_p = d * (V - c_p[:, idx])
            z_p = ch_p / s_p[:, idx]
            ok_s = ok_s | ((z_p >= sig.min_z) & (ch_p >= sig.min_change))
            z_s = np.fmax(z_s, z_p)  # shown in explanations
        opp_s = (z_s <= -sig.min_z) & (-ch_s >= sig.min_change)
        opp_c = (z_c <= -sig.min_z) & (-ch_c >= sig.min_change)
        # self-only evidence is vetoed where the cohort sees the value as normal: the host's
        # own history is then the odd one out (an inefficiency covering most of it)
        veto = np.isfinite(z_c) & (z_c < COHORT_VETO_Z)
        sat = ok_c | (ok_s & ~veto)
        if sig.value_below is not None:
            sat &= V < sig.value_below
        if sig.value_above is not None:
            sat &= V > sig.value_above
        if sig.gate is not None and sig.gate.feature:
            sat &= _gate_mask(sig, idx, refs, col_family, col_device)
        finite = np.isfinite(V)
        zbest = np.fmax(z_s, z_c)  # nan only when both are nan
        zb = np.where(np.isfinite(zbest), zbest, -np.inf)
        best_j = np.argmax(zb, axis=1)
        best_z = zb[np.arange(n), best_j]
        best_z = np.where(np.isfinite(best_z), best_z, np.nan)
    available = finite.any(axis=1)
    matched = sat.any(axis=1)
    # contradicted: on every device with data, every reference says it moved the other way
    has_s, has_c = np.isfinite(z_s), np.isfinite(z_c)
    has_ref = has_s | has_c
    opp = (opp_s | ~has_s) & (opp_c | ~has_c) & has_ref
    contradicted = ~matched & has_ref.any(axis=1) & np.where(has_ref, opp, True).all(axis=1)
    strength = np.clip(np.nan_to_num(best_z, nan=0.0) / max(sig.min_z, 1e-9), 0.0, 1.0)
    strength = np.where(matched, 1.0, np.minimum(strength, 0.99))
    devs = [col_device[j] for j in idx]
    best_dev = [devs[int(j)] for j in best_j]
    return _SigEval(sig, matched, contradicted, available, strength, best_z, best_dev, sat, devs)


def _eval_absolute(sig: Signal, idx: list[int], V: np.ndarray, refs: _Refs, col_family: list[str],
                   col_device: list[str]) -> _SigEval:
    """An absolute signal: the value alone, against its bound (no reference, no z). It is
    never "contradicted": a value inside the bound is simply no evidence. ``best_z`` holds
    the most extreme value in the signal's direction among the devices that satisfy it
    (gate included; where none does, among all): the explanation names the device matched,
    not a gated-off one with a larger value."""
    n = V.shape[0]
    finite = np.isfinite(V)
    with np.errstate(invalid="ignore"):
        sat = finite.copy()
        if sig.value_below is not None:
            sat &= V < sig.value_below
        if sig.value_above is not None:
            sat &= V > sig.value_above
    if sig.gate is not None and sig.gate.feature:
        sat &= _gate_mask(sig, idx, refs, col_family, col_device)
    d = 1.0 if sig.direction == "up" else -1.0
    matched = sat.any(axis=1)
    key = np.where(np.where(matched[:, None], sat, finite), d * V, -np.inf)
    best_j = np.argmax(key, axis=1)
    best = V[np.arange(n), best_j]
    devs = [col_device[j] for j in idx]
    return _SigEval(sig, matched, np.zeros(n, bool), finite.any(axis=1), matched.astype(np.float64),
                    np.where(finite.any(axis=1), best, np.nan), [devs[int(j)] for j in best_j], sat, devs)


def _gate_mask(sig: Signal, idx: list[int], refs: _Refs, col_family: list[str], col_device: list[str]) -> np.ndarray:
    """(n, k) True where the gate feature of the column's device is within bounds; where it
    has no data, the gate's ``if_missing`` ("pass": True)."""
    assert sig.gate is not None and sig.gate.feature is not None
    g, gf = sig.gate, sig.gate.feature
    missing = g.if_missing == "pass"
    where = {(f, d): j for j, (f, d) in enumerate(zip(col_family, col_device, strict=True))}
    out = np.ones((refs.value.shape[0], len(idx)), bool)
    for k, j in enumerate(idx):
        gj = where.get((gf, col_device[j]), where.get((gf, "")))
        if gj is None:
            out[:, k] = missing
            continue
        v = refs.value[:, gj]
        ok = np.ones(v.shape, bool)
        with np.errstate(invalid="ignore"):
            if g.above is not None:
                ok &= v > g.above
            if g.below is not None:
                ok &= v < g.below
        out[:, k] = ok | (~np.isfinite(v) & missing)
    return out


def _fmt_sig(e: _SigEval, i: int) -> str:
    if e.signal.fact is not None:
        return f"{e.signal.key} ({'holds' if e.matched[i] else 'unknown' if not e.available[i] else 'does not hold'})"
    z = e.best_z[i]
    where = f" on {e.best_dev[i]}" if e.best_dev[i] else ""
    if e.signal.absolute:
        return f"{e.signal.key} (value={z:.3g}{where})" if np.isfinite(z) else f"{e.signal.key} (no data)"
    return f"{e.signal.key} (z={z:.1f}{where})" if np.isfinite(z) else f"{e.signal.key} (no data)"


@dataclass
class _Cand:
    entry: Entry
    valid: np.ndarray
    confidence: np.ndarray
    evidence: np.ndarray  # any signal present (worth listing)
    evals: list[_SigEval]
    failed_pre: list[list[str]]


def _attribution(findings: pl.DataFrame, entry: Entry) -> tuple[np.ndarray, np.ndarray]:
    """How much of each window's attribution points at this entry (0..1), and whether the
    window has any attribution at all."""
    n = findings.height
    prof = np.zeros(n)
    total = np.zeros(n)
    for col in SHARE_COLUMNS:
        if col in findings.columns:
            v = findings[col].fill_null(0.0).to_numpy()
            total += v
            if col.removeprefix("share_") in entry.subsystems:
                prof += v
    fam = np.zeros(n)
    if "top_factors" in findings.columns and n:
        fams = sorted(entry.families)
        tf = (findings.select(pl.col("top_factors")).with_row_index("_f").explode("top_factors")
              .unnest("top_factors").drop_nulls("contribution")
              .group_by("_f").agg(pl.col("contribution").filter(pl.col("family").is_in(fams)).sum().alias("hit"),
                                  pl.col("contribution").sum().alias("all")))
        f = tf["_f"].to_numpy()
        hit, tot = tf["hit"].to_numpy(), tf["all"].to_numpy()
        fam[f] = np.divide(hit, tot, out=np.zeros_like(hit, dtype=np.float64), where=tot > 0)
    return np.clip(np.maximum(prof, fam), 0.0, 1.0), total > 0


def _eval_fact_signal(sig: Signal, facts: Sequence[HostFacts]) -> _SigEval:
    """A fact signal per window: matched when the fact (at the window's time) passes the test."""
    n = len(facts)
    matched = np.zeros(n, bool)
    available = np.zeros(n, bool)
    memo: dict[int, tuple[bool, bool]] = {}
    assert sig.fact is not None
    for i, hf in enumerate(facts):
        k = id(hf)
        if k not in memo:
            values = hf.lookup(sig.fact)
            memo[k] = (bool(values), any(_compare(sig.op, v, sig.value) for v in values))
        available[i], matched[i] = memo[k]
    z = np.where(matched, np.inf, np.nan)
    return _SigEval(sig, matched, np.zeros(n, bool), available, matched.astype(np.float64), z, [""] * n,
                    np.zeros((n, 0), bool), [])


def _fact_gate(e: _SigEval, holds: np.ndarray) -> None:
    """Restrict a signal to the windows where its gate's fact holds: elsewhere it is no
    evidence either way (neither matched nor contradicted, no credit for its strength)."""
    e.matched &= holds
    e.sat &= holds[:, None]
    e.contradicted &= holds
    e.strength = np.where(holds, e.strength, 0.0)


def _evaluate_entry(entry: Entry, findings: pl.DataFrame, refs: _Refs, col_family: list[str],
                    col_device: list[str], pre_ok: np.ndarray, pre_msgs: list[list[str]],
                    cfg: MatchConfig, facts: Sequence[HostFacts]) -> _Cand:
    n = findings.height
    reads = tuple(s.fact for s in entry.signals if s.fact is not None)
    evals = [_eval_fact_signal(s, facts) if s.fact is not None
             else _eval_signal(s, refs, col_family, col_device, reads) for s in entry.signals]
    for e in evals:
        if e.signal.gate is not None and e.signal.gate.fact is not None:
            _fact_gate(e, _eval_fact_signal(e.signal.gate.fact, facts).matched)
    # required signals grouped: a group is satisfied when any alternative matches
    groups: dict[str, list[_SigEval]] = {}
    units: list[list[_SigEval]] = []
    for e in evals:
        if e.signal.role == "required" and e.signal.group:
            if e.signal.group not in groups:
                groups[e.signal.group] = []
                units.append(groups[e.signal.group])
            groups[e.signal.group].append(e)
        elif e.signal.role != "excludes":
            units.append([e])
    req_ok = np.ones(n, bool)
    num = {"required": np.zeros(n), "supporting": np.zeros(n)}
    den = {"required": np.zeros(n), "supporting": np.zeros(n)}
    for unit in units:
        role = unit[0].signal.role
        m = np.any([e.matched for e in unit], axis=0)
        if role == "required":
            req_ok &= m
        avail = np.any([e.available for e in unit], axis=0)
        contra = np.all([e.contradicted for e in unit], axis=0)
        strength = np.max([e.strength for e in unit], axis=0)
        credit = np.where(m, 1.0, np.where(contra, -0.5, 0.5 * strength))
        w = max(e.signal.weight for e in unit)
        # a required unit always counts; a supporting one only where it has data
        wt = np.where(avail | (role == "required"), w, 0.0)
        num[role] += wt * credit
        den[role] += wt
    req = np.divide(num["required"], den["required"], out=np.zeros(n), where=den["required"] > 0)
    # supporting evidence raises confidence; none available is neutral-low, not zero
    sup = np.divide(num["supporting"], den["supporting"], out=np.full(n, 0.25), where=den["supporting"] > 0)
    signature = np.clip(REQUIRED_SHARE * req + (1 - REQUIRED_SHARE) * sup, 0.0, 1.0)
    excluded = np.zeros(n, bool)
    for e in evals:
        if e.signal.role == "excludes":
            excluded |= e.matched
    attr, has_attr = _attribution(findings, entry)
    # windows without attribution (matched on their own, see match_windows) are judged on
    # the signature alone
    a = np.where(has_attr, cfg.attribution_weight, 0.0)
    conf = (1 - a) * signature + a * attr
    conf = np.where(excluded, conf * cfg.excludes_penalty, conf)
    valid = req_ok & pre_ok & ~excluded
    evidence = np.any([e.matched for e in evals if e.signal.role != "excludes"], axis=0) if evals else np.zeros(n, bool)
    return _Cand(entry, valid, np.round(conf, 6), evidence, evals, pre_msgs)


def _explain(c: _Cand, i: int) -> tuple[list[str], list[str], list[str], list[str], str]:
    matched, missing, contra = [], [], []
    devices: list[str] = []
    excl = []
    for e in c.evals:
        if e.signal.role == "excludes":
            if e.matched[i]:
                excl.append(_fmt_sig(e, i))
            continue
        tag = "" if e.signal.role == "required" else " [supporting]"
        if e.matched[i]:
            matched.append(_fmt_sig(e, i) + tag)
            devices += e.devices(i)
        elif e.contradicted[i]:
            contra.append(_fmt_sig(e, i) + tag)
        else:
            missing.append(_fmt_sig(e, i) + tag)
    parts = [f"{c.entry.title}: matched {', '.join(matched) or 'nothing'}"]
    if missing:
        parts.append(f"missing {', '.join(missing)}")
    if contra:
        parts.append(f"contradicted {', '.join(contra)}")
    if excl:
        parts.append(f"excluded by {', '.join(excl)}")
        contra += [f"{x} [excludes]" for x in excl]
    if c.failed_pre[i]:
        parts.append("preconditions failed: " + "; ".join(c.failed_pre[i]))
    return sorted(set(devices)), matched, missing, contra, "; ".join(parts)


# --------------------------------------------------------------------------- public API
def match_findings(
    findings: pl.DataFrame,
    features: pl.DataFrame | None,
    host_facts: pl.DataFrame | None,
    kb: KnowledgeBase | None = None,
    config: MatchConfig | None = None,
    *,
    only_matched: bool = False,
) -> pl.DataFrame:
    """Ranked knowledge-base candidates per anomalous window (schema :data:`MATCH_SCHEMA`).

    ``findings``: the analytics' findings (host, window_start, window_end, top_factors,
    share_*); ``features``: the wide features frame the findings came from (self and cohort
    references are computed from it; None = degraded mode on the findings' top factors);
    ``host_facts``: the lake's host_facts rows (None = no preconditions can be checked:
    they are assumed to hold). Windows with no candidate showing any evidence get no row;
    with ``only_matched`` only matched candidates are listed."""
    kb = kb or load_kb()
    cfg = config or MatchConfig()
    if findings is None or findings.is_empty():
        return pl.DataFrame(schema=MATCH_SCHEMA)
    findings = findings.with_columns(pl.col(WS).cast(TS), pl.col(WE).cast(TS)).sort(HOST, WS)
    families = signature_families(kb)
    watched = frozenset(s.fact for e in kb for s in e.signals if s.fact is not None)
    refs = (_references(findings, features, host_facts, families, cfg, watched) if features is not None
            else _references_from_factors(findings, families))
    col_family = [split_feature(c)[0] for c in refs.cols]
    col_device = [split_feature(c)[1] for c in refs.cols]
    n = findings.height
    hosts = findings[HOST].to_list()
    starts = findings[WS].to_list()
    # facts per (host, window): preconditions at the window's time (facts can change)
    index = FactsIndex.of(host_facts)

    win_facts = [index.at(h, t) for h, t in zip(hosts, starts, strict=True)]
    # windows sharing a facts snapshot share their precondition verdicts
    snap_ids = np.array([id(hf) for hf in win_facts], dtype=np.int64)
    snaps = {id(hf): hf for hf in win_facts}
    cands: list[_Cand] = []
    for entry in kb:
        pre_ok = np.ones(n, bool)
        none: list[str] = []
        pre_msgs: list[list[str]] = [none] * n  # replaced per window below, never mutated
        if entry.preconditions:
            for k, hf in snaps.items():
                ok, msgs = index.preconditions(entry, hf)
                rows = np.flatnonzero(snap_ids == k)
                pre_ok[rows] = ok
                for i in rows.tolist():
                    pre_msgs[i] = msgs
        cands.append(_evaluate_entry(entry, findings, refs, col_family, col_device, pre_ok, pre_msgs, cfg, win_facts))

    recs: list[dict[str, Any]] = []
    ends = findings[WE].to_list()
    is_match = np.array([c.valid & (c.confidence >= c.entry.min_confidence) for c in cands]).reshape(len(cands), n)
    listed = is_match if only_matched else is_match | np.array(
        [c.valid | c.evidence for c in cands]).reshape(len(cands), n)
    for i in np.flatnonzero(listed.any(axis=0)).tolist():
        shown = [c for c in cands if (c.valid[i] and c.confidence[i] >= c.entry.min_confidence)
                 or (not only_matched and (c.valid[i] or c.evidence[i]))]
        shown.sort(key=lambda c: (not (c.valid[i] and c.confidence[i] >= c.entry.min_confidence),
                                  not c.valid[i], -c.confidence[i], c.entry.id))
        for rank, c in enumerate(shown[: cfg.top_n], start=1):
            devices, m, miss, contra, text = _explain(c, i)
            recs.append({
                HOST: hosts[i], WS: starts[i], WE: ends[i], "rank": rank, "entry_id": c.entry.id,
                "label_type": c.entry.label_type, "confidence": float(c.confidence[i]),
                "matched": bool(c.valid[i] and c.confidence[i] >= c.entry.min_confidence),
                "devices": devices, "matched_signals": m, "missing_signals": miss,
                "contradicted_signals": contra, "explanation": text,
            })
    if not recs:
        return pl.DataFrame(schema=MATCH_SCHEMA)
    return pl.DataFrame(recs, schema=MATCH_SCHEMA)


def match_windows(features: pl.DataFrame, host_facts: pl.DataFrame | None, kb: KnowledgeBase | None = None,
                  config: MatchConfig | None = None) -> pl.DataFrame:
    """The knowledge base as a *signature detector*: match every window of ``features``
    (no detector flag, no attribution needed) and return only the matched candidates.
    A window matching a known inefficiency's full signature is anomalous whatever the
    statistical detectors said — e.g. a host misconfigured since boot, or a footprint
    too small among hundreds of features for the unsupervised scores."""
    keys = features.select(HOST, pl.col(WS).cast(TS), pl.col(WE).cast(TS))
    return match_findings(keys, features, host_facts, kb, config, only_matched=True)


def best_matches(matches: pl.DataFrame) -> pl.DataFrame:
    """The rank-1 *matched* candidate per window: host, window_start, match_type (the
    entry's label type), confidence — the evaluation's matches frame."""
    if matches.is_empty():
        return pl.DataFrame(schema=EVAL_SCHEMA)
    return (matches.filter(pl.col("matched") & (pl.col("rank") == 1))
            .select(HOST, WS, pl.col("label_type").alias("match_type"), "confidence")
            .sort(HOST, WS))


EvalMatcher = Callable[..., pl.DataFrame]


def as_eval_matcher(kb: KnowledgeBase | None = None, features: pl.DataFrame | None = None,
                    config: MatchConfig | None = None) -> EvalMatcher:
    """A matcher for :mod:`analytics.evaluation`: ``(findings, host_facts, features=None)
    -> DataFrame(host, window_start, match_type, confidence)``. Pass the features frame
    (bound here or per call) for full matching; without it the matcher falls back on the
    findings' top factors only."""
    bound_kb = kb or load_kb()

    def matcher(findings: pl.DataFrame, host_facts: pl.DataFrame | None,
                features: pl.DataFrame | None = features) -> pl.DataFrame:
        return best_matches(match_findings(findings, features, host_facts, bound_kb, config))

    return matcher


def eval_matcher(findings: pl.DataFrame, host_facts: pl.DataFrame | None,
                 features: pl.DataFrame | None = None) -> pl.DataFrame:
    """``--matcher knowledge_base.matcher:eval_matcher``: the shipped knowledge base."""
    return as_eval_matcher()(findings, host_facts, features=features)

