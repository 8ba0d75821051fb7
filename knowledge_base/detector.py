"""The knowledge base as a *signature detector*, and the sweep's final verdict per window.

The statistical detectors (Z, IF, Maha and their combination) say "this window is unusual";
a knowledge-base signature says "this window shows inefficiency E". Either makes a window a
**finding**:

* **statistical**: the combined detector flags it under the judging reference (the
  analytics' findings), unless the host is in **warm-up** — its first ``warmup_s`` seconds
  of data (a new host, or telemetry back after a gap), when there is no history yet and a
  workload's start-up (model load) looks anomalous — and its cohort does not cover it
  (enough peers of its cohort out of warm-up at that time);
* **signature**: a knowledge-base entry's full signature matches it
  (:func:`knowledge_base.matcher.match_findings` on every window, no attribution needed)
  with confidence >= max(the entry's ``min_confidence``, ``DetectionConfig.min_confidence``).
  Warm-up does not apply: a host misconfigured from boot must be caught.

A statistical finding that only the **cohort** flagged, that the host's **own history**
finds normal (its ``self`` verdict, the detectors' vote, does not flag the window) and that
**no entry** matches is
dropped (``DetectionConfig.peer_only = False``, the default): the host differs from its
peers as it always has, and nothing names a cause — benign diversity (a warmer GPU slot, a
bigger quota), not an inefficiency. On a healthy 8-host mixed fleet these windows were the
long unmatched incidents, and they began on analysis-step edges: each step refits the
cohort reference, and a host that sits at its edge flips in and out a whole step at a time.
A fault that starts on a running host moves the host against its own past too, and a
fault present from boot is kept when an entry names it.

:func:`detect` returns the scores table with one extra row per window (``detector = "kb"``,
``reference = "signature"``, ``score`` = the best matched confidence or 0, ``threshold`` =
the entry's minimum confidence, ``flagged``) and the findings table with the match columns;
``detectors`` lists the statistical detectors that flagged the window plus
``kb:<entry id>`` when the signature detector did. A signature-only finding has
``reference = "signature"``, ``score`` = the window's combined score (largest over
references; below 1 or warm-up suppressed), and no attribution (empty ``top_factors``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import numpy as np
import polars as pl

from analytics.pipeline import (
    FINDINGS_SCHEMA,
    SCORES_SCHEMA,
    AnalysisResult,
    cohort_members,
    hardware_cohorts,
    matcher_sample,
)
from knowledge_base.loader import KnowledgeBase
from knowledge_base.matcher import MATCH_SCHEMA, MatchConfig, match_findings, release_references

log = logging.getLogger(__name__)

HOST, WS, WE = "host", "window_start", "window_end"
TS = pl.Datetime("us", "UTC")
SIGNATURE_DETECTOR = "kb"
SIGNATURE_REFERENCE = "signature"
#: the other entries whose full signature matched the window too (lower ranks): incidents
#: keep an entry's windows where another outranked it, so two causes on one host that
#: overlap in time are two incidents (:func:`knowledge_base.incidents.build_incidents`)
ALSO_MATCHED = pl.List(pl.Struct({"entry_id": pl.String(), "confidence": pl.Float64()}))
#: the rank-1 knowledge-base match stored on each finding, and the lower-ranked matches
MATCH_COLUMNS: dict[str, pl.DataType] = {
    "entry_id": pl.String(), "match_confidence": pl.Float64(), "match_devices": pl.List(pl.String()),
    "match_explanation": pl.String(), "also_matched": ALSO_MATCHED,
}
FINDINGS_OUT_SCHEMA: dict[str, pl.DataType] = {**FINDINGS_SCHEMA, **MATCH_COLUMNS}


@dataclass(frozen=True)
class DetectionConfig:
    """How the final verdict combines the statistical and the signature detectors.

    ``signature``: use the knowledge base as a detector (else findings are the statistical
    ones only, still matched); ``min_confidence``: a floor over every entry's own
    ``min_confidence`` for signature detections; ``warmup_s``: statistical flags of a
    host's first seconds of data are suppressed (0 = off); ``restart_gap_s``: telemetry
    resuming after a gap longer than this starts a new warm-up."""

    signature: bool = True
    min_confidence: float = 0.0
    warmup_s: float = 120.0
    restart_gap_s: float = 300.0
    peer_only: bool = False  # keep unmatched findings only the cohort flags (module doc)

    def __post_init__(self) -> None:
        if not isinstance(self.signature, bool):
            raise ValueError(f"detection.signature must be true or false, not {self.signature!r}")
        if not isinstance(self.peer_only, bool):
            raise ValueError(f"detection.peer_only must be true or false, not {self.peer_only!r}")
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ValueError(f"detection.min_confidence must be in [0, 1], not {self.min_confidence!r}")
        if not self.warmup_s >= 0:
            raise ValueError(f"detection.warmup must be >= 0 s, not {self.warmup_s!r}")
        if not self.restart_gap_s > 0:
            raise ValueError(f"detection.restart_gap must be > 0 s, not {self.restart_gap_s!r}")


@dataclass
class Detection:
    features: pl.DataFrame
    scores: pl.DataFrame  # the analytics' scores plus one "kb" row per window
    findings: pl.DataFrame  # FINDINGS_OUT_SCHEMA
    signature: pl.DataFrame  # the signature detector's matches (MATCH_SCHEMA; its verdict is rank 1)
    suppressed: int = 0  # statistical findings dropped by the warm-up
    peer_only: int = 0  # unmatched findings only the cohort flagged, dropped (module doc)


# ------------------------------------------------------------------------ warm-up
def data_starts(features: pl.DataFrame, *, frame_start: datetime | None, history_known: Mapping[str, datetime] | None,
                restart_gap_s: float, slack: timedelta) -> pl.DataFrame:
    """Per host, the starts of its data runs in the frame (host, run_start, run_end): a run
    begins at the host's first window, or after a gap > ``restart_gap_s``. The first run's
    start is the host's true start only when the frame shows it: no ``frame_start`` (the
    whole history is in memory), or the data begins later than the frame's read start
    (+ ``slack``). Otherwise it is the host's first data time from ``history_known`` (the
    lake's earliest telemetry), or, unknown, None: no warm-up for that run."""
    if features.is_empty():
        return pl.DataFrame(schema={HOST: pl.String(), "run_start": TS, "run_end": TS})
    gap = pl.duration(microseconds=round(restart_gap_s * 1e6))
    w = features.select(HOST, pl.col(WS).cast(TS), pl.col(WE).cast(TS)).sort(HOST, WS)
    prev = pl.col(WE).shift(1).over(HOST)
    runs = (w.with_columns((prev.is_null() | (pl.col(WS) > prev + gap)).cast(pl.Int64).cum_sum().over(HOST).alias("_r"))
            .group_by(HOST, "_r").agg(pl.col(WS).min().alias("run_start"), pl.col(WE).max().alias("run_end"))
            .sort(HOST, "_r"))
    out = []
    known = dict(history_known or {})
    for h, r, start, end in runs.iter_rows():
        if r == 1 and frame_start is not None and start <= frame_start + slack:
            # the frame was cut at its read start: the host may have data before it
            # (a warm-up that ended before the frame suppresses nothing)
            start = known.get(h)
        out.append((h, start, end))
    return pl.DataFrame(out, schema={HOST: pl.String(), "run_start": TS, "run_end": TS}, orient="row")


def in_warmup(keys: pl.DataFrame, starts: pl.DataFrame, warmup_s: float) -> pl.Series:
    """Boolean per row of ``keys`` (host, window_start): the window starts less than
    ``warmup_s`` after the start of its host's data run."""
    if warmup_s <= 0 or keys.is_empty() or starts.is_empty():
        return pl.Series("warmup", [False] * keys.height, dtype=pl.Boolean)
    wu = pl.duration(microseconds=round(warmup_s * 1e6))
    k = keys.select(HOST, pl.col(WS).cast(TS)).with_row_index("_i")
    hit = (k.join(starts.drop_nulls("run_start"), on=HOST, how="inner")
           .filter((pl.col(WS) >= pl.col("run_start")) & (pl.col(WS) < pl.col("run_start") + wu)
                   & (pl.col(WS) <= pl.col("run_end")))
           .select("_i").unique())
    return k.select(pl.col("_i").is_in(hit["_i"].implode()).alias("warmup"))["warmup"]


def _cohort_covers(findings: pl.DataFrame, warm: np.ndarray, starts: pl.DataFrame, label_of: Mapping[str, str],
                   warmup_s: float, min_cohort: int) -> np.ndarray:
    """For warm-up findings judged against the cohort: at least ``min_cohort - 1`` peers of
    the host's cohort (``label_of``: host -> cohort, as analytics formed them) are out of
    their warm-up at the window's start (peers with history are a real reference; peers
    starting together with the host are not)."""
    out = np.zeros(findings.height, bool)
    idx = np.flatnonzero(warm & (findings["reference"] == "cohort").to_numpy())
    if not idx.size:
        return out
    members = cohort_members(label_of)
    wu = timedelta(seconds=warmup_s)
    run_starts: dict[str, list[tuple[datetime | None, datetime]]] = {}
    for h, s, e in starts.iter_rows():
        run_starts.setdefault(h, []).append((s, e))

    def ready(h: str, t: datetime) -> bool:
        # h has data at t and is past its run's warm-up
        for s, e in run_starts.get(h, []):
            lo = s if s is not None else datetime.min.replace(tzinfo=t.tzinfo)
            if lo <= t <= e:
                return s is None or t >= s + wu
        return False

    hosts, ws = findings[HOST].to_list(), findings[WS].to_list()
    for i in idx.tolist():
        peers = [p for p in members.get(label_of.get(hosts[i], ""), []) if p != hosts[i]]
        out[i] = sum(ready(p, ws[i]) for p in peers) >= min_cohort - 1
    return out


# ------------------------------------------------------------------------ verdict
def signature_matches(keys: pl.DataFrame, features: pl.DataFrame, host_facts: pl.DataFrame | None,
                      kb: KnowledgeBase, config: DetectionConfig, match_config: MatchConfig | None = None) -> pl.DataFrame:
    """The signature detector: the matched candidates (MATCH_SCHEMA, ranked among the
    matched ones) of every window in ``keys`` (host, window_start, window_end) whose
    confidence clears the thresholds; references come from the whole ``features`` frame.
    Its verdict on a window is the rank-1 row."""
    if keys.is_empty():
        return pl.DataFrame(schema=MATCH_SCHEMA)
    m = match_findings(keys.select(HOST, pl.col(WS).cast(TS), pl.col(WE).cast(TS)), features, host_facts, kb,
                       match_config, only_matched=True)
    if config.min_confidence > 0:
        m = m.filter(pl.col("confidence") >= config.min_confidence)
    return m


def _threshold(kb: KnowledgeBase, config: DetectionConfig) -> dict[str, float]:
    return {e.id: max(e.min_confidence, config.min_confidence) for e in kb}


def signature_scores(keys: pl.DataFrame, sig: pl.DataFrame, kb: KnowledgeBase, config: DetectionConfig) -> pl.DataFrame:
    """One ``kb`` scores row per window of ``keys``."""
    thr = _threshold(kb, config)
    default = max(config.min_confidence, min(thr.values(), default=0.5))
    s = sig.select(HOST, pl.col(WS).cast(TS), "entry_id", "confidence")
    rows = (keys.select(HOST, pl.col(WS).cast(TS), pl.col(WE).cast(TS)).join(s, on=[HOST, WS], how="left")
            .with_columns(pl.col("entry_id").replace_strict(thr, default=default, return_dtype=pl.Float64).alias("threshold")))
    return rows.select(
        HOST, WS, WE, pl.lit(SIGNATURE_DETECTOR).alias("detector"), pl.lit(SIGNATURE_REFERENCE).alias("reference"),
        pl.col("confidence").fill_null(0.0).alias("score"), "threshold",
        pl.col("confidence").is_not_null().alias("flagged"),
    ).cast(SCORES_SCHEMA)  # type: ignore[arg-type]


def attach_matches(findings: pl.DataFrame, matches: pl.DataFrame, fallback: pl.DataFrame | None = None) -> pl.DataFrame:
    """``findings`` with MATCH_COLUMNS from the rank-1 matched rows of ``matches``; windows
    with no match there take ``fallback``'s (the signature detector: a full signature match
    stands even when the window's attribution points elsewhere). ``also_matched``: every
    other entry matched in either (its best confidence), best first."""

    def best(m: pl.DataFrame) -> pl.DataFrame:
        return (m.filter(pl.col("matched") & (pl.col("rank") == 1))
                .select(HOST, pl.col(WS).cast(TS), "entry_id", pl.col("confidence").alias("match_confidence"),
                        pl.col("devices").alias("match_devices"), pl.col("explanation").alias("match_explanation")))

    b = best(matches)
    every = matches.filter(pl.col("matched")).select(HOST, pl.col(WS).cast(TS), "entry_id", "confidence")
    if fallback is not None and fallback.height:
        b = pl.concat([b, best(fallback).join(b.select(HOST, WS), on=[HOST, WS], how="anti")])
        every = pl.concat([every, fallback.filter(pl.col("matched")).select(
            HOST, pl.col(WS).cast(TS), "entry_id", "confidence")])
    others = (every.join(b.select(HOST, WS, pl.col("entry_id").alias("_best")), on=[HOST, WS], how="inner")
              .filter(pl.col("entry_id") != pl.col("_best"))
              .group_by(HOST, WS, "entry_id").agg(pl.col("confidence").max())
              .sort([HOST, WS, "confidence", "entry_id"], descending=[False, False, True, False])
              .group_by(HOST, WS, maintain_order=True)
              .agg(pl.struct("entry_id", "confidence").alias("also_matched")))
    base = findings.with_columns(pl.col(WS).cast(TS)).drop([c for c in MATCH_COLUMNS if c in findings.columns])
    return (base.join(b, on=[HOST, WS], how="left").join(others, on=[HOST, WS], how="left")
            .with_columns(pl.col("also_matched").cast(ALSO_MATCHED).fill_null(pl.lit([], ALSO_MATCHED))))


def empty_findings() -> pl.DataFrame:
    return pl.DataFrame(schema=FINDINGS_OUT_SCHEMA)


def detect(result: AnalysisResult, host_facts: pl.DataFrame | None, kb: KnowledgeBase,
           config: DetectionConfig | None = None, *, keep: pl.Expr | None = None,
           frame_start: datetime | None = None, history_known: Mapping[str, datetime] | None = None,
           match_config: MatchConfig | None = None, signature: pl.DataFrame | None = None,
           runs: pl.DataFrame | None = None) -> Detection:
    """The final verdict over ``result`` (see the module doc). ``keep`` selects the windows
    to report (e.g. a chunk's windows, or those after the history; default: all); every window of
    ``result.features`` (history included) serves as matching reference. ``frame_start``
    is when the analysed telemetry was read from (None: the hosts' whole data is in the
    frame); ``history_known``: host -> its first telemetry time (the lake's), for hosts
    whose data starts before the frame. ``signature``: the signature detector's matches
    when already computed over these windows (see :func:`signature_matches`). The window
    length, ``min_cohort`` and the cohorts are those analytics used (``result``).
    ``runs``: the data runs (:func:`data_starts`) of every host of the cohorts, when
    ``result.features`` holds a batch of them (the warm-up of peers outside the batch;
    ``match_config.sampled`` is then the matcher's sample of the whole fleet)."""
    cfg = config or DetectionConfig()
    feats_all = result.features
    if feats_all.is_empty():
        return Detection(feats_all, result.scores, empty_findings(), pl.DataFrame(schema=MATCH_SCHEMA))
    if result.cohorts and (match_config is None or match_config.sampled is None):
        # the matcher's (hardware) cohort samples keep the shares of analytics' cohorts
        mc = match_config or MatchConfig()
        match_config = replace(mc, sampled=frozenset(matcher_sample(hardware_cohorts(feats_all, host_facts),
                                                                    result.cohorts, mc.cohort_sample)))
    feats = feats_all if keep is None else feats_all.filter(keep)
    scores = result.scores.join(feats.select(HOST, pl.col(WS).cast(TS)), on=[HOST, WS], how="semi") \
        if result.scores.height else result.scores
    stat = result.findings.with_columns(pl.col(WS).cast(TS)).join(feats.select(HOST, pl.col(WS).cast(TS)),
                                                                   on=[HOST, WS], how="semi")
    keys = feats.select(HOST, pl.col(WS).cast(TS), pl.col(WE).cast(TS))

    # warm-up: statistical flags of a host's first seconds of data are dropped, unless its
    # cohort (peers with history) judged the window
    starts = runs if runs is not None else data_starts(
        feats_all, frame_start=frame_start, history_known=history_known, restart_gap_s=cfg.restart_gap_s,
        slack=timedelta(seconds=2 * result.window.length_s))
    warm = in_warmup(stat, starts, cfg.warmup_s).to_numpy() if stat.height else np.zeros(0, bool)
    if warm.any():
        warm &= ~_cohort_covers(stat, warm, starts, result.cohorts, cfg.warmup_s, result.config.min_cohort)
    suppressed_rows = stat.filter(pl.Series(warm)) if warm.any() else stat.clear()
    kept = stat.filter(pl.Series(~warm)) if warm.any() else stat

    if not cfg.signature:
        sig = pl.DataFrame(schema=MATCH_SCHEMA)
    elif signature is not None:
        sig = signature.join(keys.select(HOST, WS), on=[HOST, WS], how="semi")
    else:
        sig = signature_matches(keys, feats_all, host_facts, kb, cfg, match_config)
    verdict = sig.filter(pl.col("rank") == 1)  # the signature detector's, one row per window
    if cfg.signature:
        scores = pl.concat([scores, signature_scores(keys, verdict, kb, cfg)]) if scores.height else \
            signature_scores(keys, verdict, kb, cfg)
    tag = verdict.select(HOST, pl.col(WS).cast(TS), pl.concat_str(pl.lit("kb:"), pl.col("entry_id")).alias("_kb"))
    # signature windows that are not statistical findings: suppressed ones keep their
    # attribution (the detectors list says only the signature flagged them), the rest are bare
    extra_sup = suppressed_rows.join(tag, on=[HOST, WS], how="semi").with_columns(
        pl.lit([], dtype=pl.List(pl.String)).alias("detectors"))
    bare_keys = tag.join(kept.select(HOST, WS), on=[HOST, WS], how="anti").join(
        extra_sup.select(HOST, WS), on=[HOST, WS], how="anti")
    bare = _bare_findings(bare_keys, keys, scores)
    findings = pl.concat([kept.select(list(FINDINGS_SCHEMA)), extra_sup.select(list(FINDINGS_SCHEMA)), bare], how="vertical_relaxed")
    findings = (findings.join(tag, on=[HOST, WS], how="left")
                .with_columns(pl.when(pl.col("_kb").is_not_null())
                              .then(pl.concat_list(pl.col("detectors"), pl.col("_kb").cast(pl.String)))
                              .otherwise(pl.col("detectors")).alias("detectors"))
                .drop("_kb").sort(HOST, WS))
    if findings.height:
        matches = match_findings(findings, feats_all, host_facts, kb, match_config)
        findings = attach_matches(findings, matches, sig)
    else:
        findings = empty_findings()
    n_peer = 0
    if findings.height and not cfg.peer_only:
        drop = peer_only(findings, result.scores)
        n_peer = int(drop.sum())
        findings = findings.filter(~drop)
    findings = findings.select([pl.col(c).cast(t) for c, t in FINDINGS_OUT_SCHEMA.items()])
    release_references()  # (both matchings of these windows are done)
    return Detection(feats, scores, findings, sig, int(warm.sum()), n_peer)


def peer_only(findings: pl.DataFrame, scores: pl.DataFrame) -> pl.Series:
    """Boolean per finding: judged against the cohort, no entry matched it, and its host's
    own history finds the window normal: the ``self`` verdict (the combined detector, the
    same vote as every verdict) does not flag it. One ``self`` detector alone is no verdict:
    Mahalanobis fitted in sample on a short history flags many healthy windows of a host
    that only differs from its peers (a busier serving host, a warmer slot). A window
    without ``self`` scores (a host with too few windows of its own) is not dropped."""
    cand = (pl.col("reference") == "cohort") & pl.col("entry_id").is_null()
    if scores.is_empty():
        return pl.Series("peer_only", [False] * findings.height, dtype=pl.Boolean)
    calm = (scores.filter((pl.col("reference") == "self") & (pl.col("detector") == "combined"))
            .group_by(HOST, pl.col(WS).cast(TS)).agg((~pl.col("flagged").any()).alias("_calm")))
    got = findings.select(HOST, pl.col(WS).cast(TS), cand.alias("_cand")).join(
        calm, on=[HOST, WS], how="left", maintain_order="left")
    return got.select((pl.col("_cand") & pl.col("_calm").fill_null(False)).alias("peer_only"))["peer_only"]


def _bare_findings(bare_keys: pl.DataFrame, keys: pl.DataFrame, scores: pl.DataFrame) -> pl.DataFrame:
    """Findings rows of signature-only windows: no attribution; score = the window's largest
    combined score over references (null when it has none)."""
    if bare_keys.is_empty():
        return pl.DataFrame(schema=FINDINGS_SCHEMA)
    comb = (scores.filter(pl.col("detector") == "combined").group_by(HOST, WS).agg(pl.col("score").max())
            if scores.height else pl.DataFrame(schema={HOST: pl.String(), WS: TS, "score": pl.Float64()}))
    rows = (bare_keys.select(HOST, WS).join(keys, on=[HOST, WS], how="left")
            .join(comb.with_columns(pl.col(WS).cast(TS)), on=[HOST, WS], how="left"))
    return rows.with_columns(
        pl.lit(SIGNATURE_REFERENCE).alias("reference"), pl.lit([], dtype=pl.List(pl.String)).alias("detectors"),
        pl.lit([], dtype=FINDINGS_SCHEMA["top_factors"]).alias("top_factors"),
        *[pl.lit(None, dtype=pl.Float64).alias(c) for c, t in FINDINGS_SCHEMA.items() if c.startswith("share_")],
    ).select([pl.col(c).cast(t) for c, t in FINDINGS_SCHEMA.items()])
