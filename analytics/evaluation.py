"""Evaluation of detection and fingerprinting against labels (docs/evaluation.md).

Everything here is a pure function of frames, so the same definitions serve ``unveil eval``,
the tests (hand-built cases) and the benchmarks:

* ``windows``: one row per scored window — ``host``, ``window_start``, ``window_end``,
  ``flagged`` (the detector combination under evaluation). Intervals are half-open
  ``[window_start, window_end)``.
* ``labels``: the lake's ``labels`` table — ``time`` (start), ``end`` (exclusive; null =
  still running), ``host``, ``type`` (and optionally ``label_id``).
* ``matches``: per flagged window, the knowledge-base entry type it was matched to, or null
  — ``host``, ``window_start``, ``match_type``, ``confidence``. It comes from a pluggable
  :data:`Matcher`; with no matcher the four fingerprint figures are ``None`` ("n/a").

A window is *positive* when it overlaps (``start < label.end and end > label.start``) at
least one label of its host; its *true types* are the types of all those labels.
Undefined ratios (0/0) are ``None``, never 0 or 1.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

if TYPE_CHECKING:
    from analytics.pipeline import AnalyticsConfig

log = logging.getLogger(__name__)

#: (findings, host_facts or None) -> DataFrame(host, window_start, match_type, confidence).
#: A matcher that also takes a ``features`` keyword gets the window features too.
Matcher = Callable[..., pl.DataFrame]

WINDOW_KEYS = ("host", "window_start")
MATCH_SCHEMA: dict[str, pl.DataType] = {
    "host": pl.String(),
    "window_start": pl.Datetime("us", "UTC"),
    "match_type": pl.String(),
    "confidence": pl.Float64(),
}


# ------------------------------------------------------------------- small metrics


def ratio(num: int, den: int) -> float | None:
    """num/den, or None when den is 0 (undefined, not zero)."""
    return num / den if den else None


def f1(precision: float | None, recall: float | None) -> float | None:
    """Harmonic mean; None if either is undefined; 0 when both are 0."""
    if precision is None or recall is None:
        return None
    if precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class PRF:
    """Counts and the derived precision, recall and F1 (None where undefined)."""

    tp: int
    fp: int
    fn: int
    precision: float | None
    recall: float | None
    f1: float | None

    @classmethod
    def from_counts(cls, tp: int, fp: int, fn: int) -> PRF:
        p, r = ratio(tp, tp + fp), ratio(tp, tp + fn)
        return cls(tp, fp, fn, p, r, f1(p, r))


def _quantile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation quantile (numpy's default); None for no values."""
    if not values:
        return None
    return float(pl.Series(values, dtype=pl.Float64).quantile(q, interpolation="linear") or 0.0)


# ------------------------------------------------------------------- frame helpers


def _norm_labels(labels: pl.DataFrame | None) -> pl.DataFrame:
    cols = {"host": pl.String(), "label_start": pl.Datetime("us", "UTC"), "label_end": pl.Datetime("us", "UTC"),
            "type": pl.String(), "label_id": pl.String(), "label_row": pl.UInt32()}
    if labels is None or labels.height == 0:
        return pl.DataFrame(schema=cols)
    lab = labels.with_row_index("__i")
    lid = pl.col("label_id").cast(pl.String) if "label_id" in lab.columns else pl.lit(None, pl.String)
    lid = pl.coalesce(lid, pl.concat_str(pl.lit("label-"), pl.col("__i").cast(pl.String)))
    far = pl.lit(datetime(9999, 1, 1), dtype=pl.Datetime("us")).dt.replace_time_zone("UTC")
    return lab.select(
        pl.col("host").cast(pl.String),
        _utc(pl.col("time")).alias("label_start"),
        pl.coalesce(_utc(pl.col("end")), far).alias("label_end"),
        pl.col("type").cast(pl.String).fill_null("unknown"),
        lid.alias("label_id"),
        pl.col("__i").alias("label_row"),  # unique even when label ids repeat
    )


def _utc(e: pl.Expr) -> pl.Expr:
    return e.cast(pl.Datetime("us", "UTC"))


def _norm_windows(windows: pl.DataFrame) -> pl.DataFrame:
    missing = [c for c in ("host", "window_start", "window_end", "flagged") if c not in windows.columns]
    if missing:
        raise ValueError(f"windows frame lacks columns {missing} (has {windows.columns})")
    return (
        windows.select(
            pl.col("host").cast(pl.String),
            _utc(pl.col("window_start")),
            _utc(pl.col("window_end")),
            pl.col("flagged").cast(pl.Boolean).fill_null(False),
        )
        # one row per window: a window is flagged if any of its rows is (e.g. per reference)
        .group_by(WINDOW_KEYS)
        .agg(pl.col("window_end").max(), pl.col("flagged").any())
        .sort(WINDOW_KEYS)
    )


def _overlaps(a_start: str, a_end: str, b_start: str, b_end: str) -> pl.Expr:
    return (pl.col(a_start) < pl.col(b_end)) & (pl.col(a_end) > pl.col(b_start))


def label_windows(windows: pl.DataFrame, labels: pl.DataFrame | None) -> pl.DataFrame:
    """``windows`` (one row per window) plus ``positive`` and ``true_types`` (sorted list)."""
    w = _norm_windows(windows)
    lab = _norm_labels(labels)
    pairs = (
        w.select(WINDOW_KEYS + ("window_end",))
        .join(lab, on="host", how="inner")
        .filter(_overlaps("window_start", "window_end", "label_start", "label_end"))
        .group_by(WINDOW_KEYS)
        .agg(pl.col("type").unique().sort().alias("true_types"))
    )
    return (
        w.join(pairs, on=list(WINDOW_KEYS), how="left")
        .with_columns(
            pl.col("true_types").fill_null(pl.lit([], dtype=pl.List(pl.String))),
        )
        .with_columns((pl.col("true_types").list.len() > 0).alias("positive"))
        .sort(WINDOW_KEYS)
    )


def predicted_events(windows: pl.DataFrame) -> pl.DataFrame:
    """Maximal runs of consecutive flagged windows per host: host, event_start, event_end, n_windows.

    Consecutive = adjacent in the host's window sequence with no unflagged window between
    them and no gap in time (the next window starts no later than the previous one ends)."""
    w = _norm_windows(windows)
    if w.height == 0:
        return pl.DataFrame(schema={"host": pl.String(), "event_start": pl.Datetime("us", "UTC"),
                                    "event_end": pl.Datetime("us", "UTC"), "n_windows": pl.UInt32()})
    prev_flag = pl.col("flagged").shift(1).over("host").fill_null(False)
    prev_end = pl.col("window_end").shift(1).over("host")
    new_run = pl.col("flagged") & (~prev_flag | prev_end.is_null() | (pl.col("window_start") > prev_end))
    return (
        w.with_columns(new_run.cast(pl.UInt32).cum_sum().over("host").alias("__run"))
        .filter(pl.col("flagged"))
        .group_by("host", "__run")
        .agg(
            pl.col("window_start").min().alias("event_start"),
            pl.col("window_end").max().alias("event_end"),
            pl.len().alias("n_windows"),
        )
        .drop("__run")
        .sort("host", "event_start")
    )


# ------------------------------------------------------------------------ results


@dataclass
class Metrics:
    """All figures for one detector combination (or one label type)."""

    windows: int = 0
    flagged: int = 0
    positive_windows: int = 0
    healthy_windows: int = 0
    labels: int = 0
    window: PRF | None = None
    event: PRF | None = None  # tp = predicted events overlapping a label; fn = labels missed
    event_recall: float | None = None  # detected labels / labels
    event_precision: float | None = None  # predicted events overlapping a label / predicted events
    event_f1: float | None = None
    predicted_events: int = 0
    detected_labels: int = 0
    ttd_median_s: float | None = None
    ttd_p90_s: float | None = None
    signature_hit_rate: float | None = None
    signature_coverage: float | None = None
    detection_signature_agreement: float | None = None
    healthy_contamination: float | None = None
    # incident level (when the detection provides incidents)
    top1_identified: int | None = None  # labels whose dominant matched incident names their type
    top1_rate: float | None = None  # top1_identified / labels
    unmatched_incidents: int | None = None  # unmatched incidents overlapping no label
    false_identifications: int | None = None  # matched incidents overlapping no label
    healthy_host_hours: float | None = None  # healthy windows x stride
    unmatched_per_host_hour: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Evaluation:
    """One row per configuration plus a per-type breakdown per configuration."""

    rows: dict[str, Metrics] = field(default_factory=dict)
    per_type: dict[str, dict[str, Metrics]] = field(default_factory=dict)
    matcher: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    default_config: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start.isoformat() if self.start else None,
            "end": self.end.isoformat() if self.end else None,
            "matcher": self.matcher,
            "default_config": self.default_config,
            "configs": {k: v.to_dict() for k, v in self.rows.items()},
            "per_type": {k: {t: m.to_dict() for t, m in d.items()} for k, d in self.per_type.items()},
        }


def _ttd(detect: pl.DataFrame) -> list[float]:
    return [float(x) for x in detect["ttd_s"].drop_nulls().to_list()]


def evaluate(
    windows: pl.DataFrame,
    labels: pl.DataFrame | None,
    matches: pl.DataFrame | None = None,
    incidents: pl.DataFrame | None = None,
) -> tuple[Metrics, dict[str, Metrics]]:
    """Every metric of docs/evaluation.md for one detector combination.

    ``matches`` None means "no knowledge base": the four fingerprint figures stay None.
    ``incidents`` (host, start, end, status, label_type or match_type) adds the incident
    figures: top-1 identification and unmatched incidents per healthy host-hour.
    Returns (overall metrics, metrics per label type)."""
    lw = label_windows(windows, labels)
    lab = _norm_labels(labels)
    # labels of hosts with no scored window cannot be detected but still count as missed
    n_labels = lab.height

    # window level
    tp = int((lw["flagged"] & lw["positive"]).sum())
    fp = int((lw["flagged"] & ~lw["positive"]).sum())
    fn = int((~lw["flagged"] & lw["positive"]).sum())
    m = Metrics(
        windows=lw.height,
        flagged=int(lw["flagged"].sum()),
        positive_windows=int(lw["positive"].sum()),
        healthy_windows=int((~lw["positive"]).sum()),
        labels=n_labels,
        window=PRF.from_counts(tp, fp, fn),
    )

    # event level: per label, the first flagged window that overlaps it
    flagged = lw.filter(pl.col("flagged")).select(WINDOW_KEYS + ("window_end",))
    detect = (
        lab.join(flagged, on="host", how="left")
        .with_columns(
            pl.when(_overlaps("window_start", "window_end", "label_start", "label_end"))
            .then(pl.col("window_start"))
            .otherwise(None)
            .alias("hit_start")
        )
        .group_by("label_row", "label_id", "host", "type", "label_start")
        .agg(pl.col("hit_start").min())
        .with_columns(
            # a window that starts before the label but overlaps it detects it at once
            ((pl.col("hit_start") - pl.col("label_start")).dt.total_microseconds() / 1e6)
            .clip(lower_bound=0.0)
            .alias("ttd_s")
        )
    )
    events = predicted_events(lw)
    ev_hit = (
        events.with_row_index("__e")
        .join(lab, on="host", how="left")
        .with_columns(_overlaps("event_start", "event_end", "label_start", "label_end").fill_null(False).alias("hit"))
        .group_by("__e")
        .agg(pl.col("hit").any())
    )
    ev_tp = int(ev_hit["hit"].sum()) if ev_hit.height else 0
    detected = int(detect["hit_start"].is_not_null().sum())
    m.predicted_events = events.height
    m.detected_labels = detected
    m.event_recall = ratio(detected, n_labels)
    m.event_precision = ratio(ev_tp, events.height)
    m.event_f1 = f1(m.event_precision, m.event_recall)
    m.event = PRF(ev_tp, events.height - ev_tp, n_labels - detected, m.event_precision, m.event_recall, m.event_f1)
    ttd = _ttd(detect)
    m.ttd_median_s, m.ttd_p90_s = _quantile(ttd, 0.5), _quantile(ttd, 0.9)

    # the four fingerprint figures
    mw = _attach_matches(lw, matches)
    if mw is not None:
        _fingerprint_figures(m, mw)

    # per label type: windows of that type are the positive windows carrying it
    per_type: dict[str, Metrics] = {}
    for t in sorted(lab["type"].unique().to_list()):
        pos_t = lw.filter(pl.col("true_types").list.contains(t))
        d_t = detect.filter(pl.col("type") == t)
        mt = Metrics(
            windows=pos_t.height,
            flagged=int(pos_t["flagged"].sum()),
            positive_windows=pos_t.height,
            labels=d_t.height,
            detected_labels=int(d_t["hit_start"].is_not_null().sum()),
        )
        mt.window = PRF.from_counts(mt.flagged, 0, pos_t.height - mt.flagged)
        mt.window = replace(mt.window, precision=None, f1=None)  # false positives have no type
        mt.event_recall = ratio(mt.detected_labels, mt.labels)
        t_ttd = _ttd(d_t)
        mt.ttd_median_s, mt.ttd_p90_s = _quantile(t_ttd, 0.5), _quantile(t_ttd, 0.9)
        if mw is not None:
            sub = mw.filter(pl.col("true_types").list.contains(t))
            fl = sub.filter(pl.col("flagged"))
            mt.signature_hit_rate = ratio(int(fl["correct"].sum()), fl.height)
            mt.signature_coverage = ratio(int(sub["correct"].sum()), sub.height)
        per_type[t] = mt
    if incidents is not None:
        _incident_figures(m, per_type, lw, lab, incidents)
    return m, per_type


def _stride_s(lw: pl.DataFrame) -> float:
    """The windows' stride: median step between consecutive window starts of a host."""
    d = (lw.select("host", "window_start").sort(WINDOW_KEYS)
         .select((pl.col("window_start").diff().over("host").dt.total_microseconds() / 1e6).alias("d"))["d"]
         .drop_nulls())
    d = d.filter(d > 0)
    return float(d.median()) if d.len() else 0.0  # type: ignore[arg-type]


def top1_identification(incidents: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    """Per label (the ``labels`` table, or its normalised form): ``identified`` = the matched
    incident overlapping it the longest (ties: earliest start) names its type; ``got`` =
    that incident's type (null: no matched incident overlaps it)."""
    inc = _norm_incidents(incidents)
    if "label_row" not in labels.columns:
        labels = _norm_labels(labels)
    lab = labels.select("label_row", "host", "type", "label_start", "label_end")
    ov = (lab.join(inc.filter(pl.col("status") == "matched"), on="host", how="inner")
          .filter(_overlaps("start", "end", "label_start", "label_end"))
          .with_columns((pl.min_horizontal("end", "label_end") - pl.max_horizontal("start", "label_start"))
                        .dt.total_microseconds().alias("overlap"))
          .sort(["label_row", "overlap", "start"], descending=[False, True, False])
          .group_by("label_row", maintain_order=True).agg(pl.col("match_type").first().alias("got")))
    return (lab.join(ov, on="label_row", how="left")
            .with_columns((pl.col("got") == pl.col("type")).fill_null(False).alias("identified")))


def _norm_incidents(incidents: pl.DataFrame) -> pl.DataFrame:
    kind = "label_type" if "label_type" in incidents.columns else "match_type"
    missing = [c for c in ("host", "start", "end", "status", kind) if c not in incidents.columns]
    if missing:
        raise ValueError(f"incidents frame lacks columns {missing} (has {incidents.columns})")
    return incidents.select(pl.col("host").cast(pl.String), _utc(pl.col("start")), _utc(pl.col("end")),
                            pl.col("status").cast(pl.String), pl.col(kind).cast(pl.String).alias("match_type"))


def _incident_figures(m: Metrics, per_type: dict[str, Metrics], lw: pl.DataFrame, lab: pl.DataFrame,
                      incidents: pl.DataFrame) -> None:
    inc = _norm_incidents(incidents).with_row_index("__n")
    top = top1_identification(incidents, lab)
    m.top1_identified = int(top["identified"].sum())
    m.top1_rate = ratio(m.top1_identified, lab.height)
    for t, mt in per_type.items():
        sub = top.filter(pl.col("type") == t)
        mt.top1_identified = int(sub["identified"].sum())
        mt.top1_rate = ratio(mt.top1_identified, sub.height)
    touching = (inc.join(lab.select("host", "label_start", "label_end"), on="host", how="inner")
                .filter(_overlaps("start", "end", "label_start", "label_end"))["__n"].unique())
    outside = inc.filter(~pl.col("__n").is_in(touching.implode()))
    m.unmatched_incidents = int((outside["status"] != "matched").sum())
    m.false_identifications = int((outside["status"] == "matched").sum())
    m.healthy_host_hours = m.healthy_windows * _stride_s(lw) / 3600.0
    m.unmatched_per_host_hour = (m.unmatched_incidents / m.healthy_host_hours) if m.healthy_host_hours else None


def _attach_matches(lw: pl.DataFrame, matches: pl.DataFrame | None) -> pl.DataFrame | None:
    if matches is None:
        return None
    missing = [c for c in ("host", "window_start", "match_type") if c not in matches.columns]
    if missing:
        raise ValueError(f"matches frame lacks columns {missing} (has {matches.columns})")
    mt = (
        matches.select(pl.col("host").cast(pl.String), _utc(pl.col("window_start")), pl.col("match_type").cast(pl.String))
        .drop_nulls("match_type")
        .unique(subset=list(WINDOW_KEYS), keep="first", maintain_order=True)
    )
    out = lw.join(mt, on=list(WINDOW_KEYS), how="left")
    # only flagged windows can carry a fingerprint: a match on an unflagged window is ignored
    matched = pl.col("flagged") & pl.col("match_type").is_not_null()
    correct = matched & pl.col("true_types").list.contains(pl.col("match_type"))
    return out.with_columns(matched.alias("matched"), correct.fill_null(False).alias("correct"))


def _fingerprint_figures(m: Metrics, mw: pl.DataFrame) -> None:
    pos = mw.filter(pl.col("positive"))
    pos_flagged = pos.filter(pl.col("flagged"))
    healthy = mw.filter(~pl.col("positive"))
    m.signature_hit_rate = ratio(int(pos_flagged["correct"].sum()), pos_flagged.height)
    m.signature_coverage = ratio(int(pos["correct"].sum()), pos.height)
    m.detection_signature_agreement = ratio(int(mw["matched"].sum()), int(mw["flagged"].sum()))
    m.healthy_contamination = ratio(int(healthy["matched"].sum()), healthy.height)


# -------------------------------------------------------------- configurations

DETECTOR_ALIASES: dict[str, str] = {
    "z": "zscore",
    "zscore": "zscore",
    "if": "iforest",
    "iforest": "iforest",
    "maha": "mahalanobis",
    "mahalanobis": "mahalanobis",
}
SHORT = {"zscore": "Z", "iforest": "IF", "mahalanobis": "Maha"}
#: names of the knowledge base used as a signature detector in --configs
SIGNATURE_ALIASES = ("kb", "sig", "signature")
#: the research's statistical ablation rows, then our statistical default (vote 2 of 3)
RESEARCH_CONFIGS: tuple[str, ...] = ("Z∨IF∨Maha", "IF∨Maha", "Z", "IF", "Maha", "vote2")
#: ... then the rows with the knowledge base as a signature detector; "vote2∨KB" is what
#: the sweep runs by default
SIGNATURE_CONFIGS: tuple[str, ...] = ("KB", "Z∨IF∨Maha∨KB", "vote2∨KB")
DEFAULT_CONFIGS: tuple[str, ...] = RESEARCH_CONFIGS + SIGNATURE_CONFIGS


@dataclass(frozen=True)
class ComboSpec:
    """A detector combination: which detectors and how their flags combine; ``signature``:
    OR'ed with the knowledge base used as a signature detector; ``statistical`` False: the
    signature detector alone (``KB``)."""

    name: str
    detectors: tuple[str, ...]
    combine: Literal["any", "all", "vote"]
    vote_k: int = 2
    signature: bool = False
    statistical: bool = True


def parse_configs(text: str | None) -> list[ComboSpec]:
    """``"Z|IF|Maha|Z∨IF∨Maha|IF∨Maha|vote2|vote2∨KB"`` -> specs. Items are separated by
    ``|`` or ``,``; inside an item ``∨`` or ``+`` means "any of"; ``&`` means "all of";
    ``voteK`` means "at least K of Z, IF, Maha"; ``KB`` (or ``sig``) is the knowledge base as
    a signature detector, always OR'ed with the rest (``vote2∨KB``, ``Z∨IF∨Maha∨KB``, or
    ``KB`` alone). Detector names: Z/zscore, IF/iforest, Maha/mahalanobis."""
    items = DEFAULT_CONFIGS if not text else tuple(x.strip() for x in text.replace(",", "|").split("|") if x.strip())
    if not items:
        raise ValueError(f"--configs {text!r}: no configuration")
    out: list[ComboSpec] = []
    for item in items:
        low = item.lower().replace(" ", "")
        parts = [p for p in low.replace("∨", "+").replace("&", "+").split("+") if p]
        sig = any(p in SIGNATURE_ALIASES for p in parts)
        if sig and "&" in low:
            raise ValueError(f"--configs: bad item {item!r}: the signature detector (KB) can only be OR'ed (∨)")
        rest = [p for p in parts if p not in SIGNATURE_ALIASES]
        suffix = "∨KB" if sig else ""
        if not rest:
            if not sig:
                raise ValueError(f"--configs: empty item {item!r}")
            out.append(ComboSpec("KB", ("zscore", "iforest", "mahalanobis"), "vote", 2, True, False))
            continue
        if len(rest) == 1 and rest[0].startswith("vote"):
            try:
                k = int(rest[0][4:] or 2)
            except ValueError:
                raise ValueError(f"--configs: bad item {item!r}: expected voteK, e.g. vote2") from None
            if not 1 <= k <= 3:
                raise ValueError(f"--configs: bad item {item!r}: K must be 1..3")
            out.append(ComboSpec(f"vote{k}{suffix}", ("zscore", "iforest", "mahalanobis"), "vote", k, sig))
            continue
        combine: Literal["any", "all"] = "all" if "&" in low else "any"
        try:
            dets = tuple(dict.fromkeys(DETECTOR_ALIASES[p] for p in rest))
        except KeyError as exc:
            raise ValueError(
                f"--configs: unknown detector {exc.args[0]!r} in {item!r}; use Z, IF, Maha (or zscore, iforest, "
                "mahalanobis), voteK, KB"
            ) from None
        sep = "∧" if combine == "all" else "∨"
        out.append(ComboSpec(sep.join(SHORT[d] for d in dets) + suffix, dets, combine, 2, sig))
    return out


@dataclass
class Detected:
    """What a detection hook returns for one combination: the flagged windows (host,
    window_start: the findings), their matches (host, window_start, match_type,
    confidence; None = no knowledge base) and incidents (host, start, end, status,
    label_type; None = not built)."""

    flagged: pl.DataFrame
    matches: pl.DataFrame | None = None
    incidents: pl.DataFrame | None = None


#: ``(analysis result, host_facts, spec, *, frame_start, score_since) -> Detected``: the production
#: verdict (warm-up, signature detector, matching, incidents), given by the caller so the
#: evaluation measures exactly what a sweep reports (jobs.step.eval_detector).
DetectHook = Callable[..., Detected]


# ---------------------------------------------------------------- lake driver


def combined_windows(scores: pl.DataFrame) -> pl.DataFrame:
    """The ``combined`` detector's verdict per window from an analysis' scores table."""
    det = scores.filter(pl.col("detector") == "combined") if "detector" in scores.columns else scores
    return det.select("host", "window_start", "window_end", "flagged")


def evaluate_lake(
    lake_root: str | Path,
    start: datetime,
    end: datetime,
    *,
    configs: Sequence[ComboSpec] | None = None,
    hosts: Sequence[str] | None = None,
    matcher: Matcher | None = None,
    matcher_name: str | None = None,
    base_config: AnalyticsConfig | None = None,
    detect: DetectHook | None = None,
    default_signature: bool = True,
) -> Evaluation:
    """Analyse ``[start, end)`` once per detector combination and score it against the
    lake's labels. Features are computed once (``base_config.window``, with
    ``base_config.history`` before ``start`` as reference, like a sweep); only
    detectors/combine/vote_k change per row. ``base_config`` is an AnalyticsConfig.

    With ``detect`` (the sweep's verdict) a window is flagged when it is a finding, and
    ``detect`` gives the matches and incidents (``matcher`` is then unused); without it a
    window is flagged when the combined detector flags it under any reference and
    ``matcher`` matches the analytics' findings. Combinations with the signature detector
    need ``detect``. The default row is the base configuration with (``default_signature``)
    or without the signature detector."""
    from analytics.features import compute_features  # heavy; only here
    from analytics.pipeline import AnalyticsConfig as _Config
    from analytics.pipeline import analyze, load_frames
    from ingest.lake import scan, tables

    specs = list(configs) if configs is not None else parse_configs(None)
    need = [sp.name for sp in specs if sp.signature]
    if need and detect is None:
        raise ValueError(f"configuration(s) {', '.join(need)} use the knowledge base as a signature detector: "
                         "they need the knowledge base (not --matcher none)")
    base = base_config if base_config is not None else _Config()
    if "labels" not in tables(lake_root):
        raise ValueError(f"lake {lake_root}: no labels table, nothing to evaluate against")
    labels = scan(lake_root, "labels", hosts=hosts).collect()
    # labels overlapping the interval (one may start before it)
    labels = labels.filter((pl.col("time") < end) & (pl.col("end").is_null() | (pl.col("end") > start)))
    frames = load_frames(lake_root, start - base.history, end, hosts)
    facts_lf = frames.pop("host_facts", None)
    host_facts = facts_lf.collect() if facts_lf is not None else None
    feats = compute_features(frames, base.window, host_facts=host_facts)
    ev = Evaluation(matcher=matcher_name, start=start, end=end)
    results: dict[tuple[tuple[str, ...], str, int], Any] = {}
    for spec in specs:
        cfg = replace(base, detectors=spec.detectors, combine=spec.combine, vote_k=spec.vote_k)
        if cfg == base and spec.statistical and spec.signature == (default_signature and detect is not None):
            ev.default_config = spec.name
        log.info("evaluating %s", spec.name)
        key = (spec.detectors, spec.combine, spec.vote_k)
        if key not in results:  # "vote2" and "vote2∨KB" share the analysis
            results[key] = analyze({}, cfg, host_facts=host_facts, score_since=start, features=feats)
        result = results[key]
        windows = combined_windows(result.scores)
        incidents = None
        if detect is not None:
            det = detect(result, host_facts, spec, frame_start=start - base.history, score_since=start)
            # every window of the interval, scored by the statistical detectors or not
            windows = flag_windows(feats.filter(_utc(pl.col("window_start")) >= start), det.flagged)
            matches, incidents = det.matches, det.incidents
        else:
            matches = _call_matcher(matcher, result.findings, host_facts, feats) if matcher is not None else None
        ev.rows[spec.name], ev.per_type[spec.name] = evaluate(windows, labels, matches, incidents)
    return ev


def flag_windows(features: pl.DataFrame, flagged: pl.DataFrame) -> pl.DataFrame:
    """The windows frame of a detection: every window (host, window_start, window_end) of
    ``features``, flagged when it is among ``flagged`` (host, window_start)."""
    f = flagged.select(pl.col("host").cast(pl.String), _utc(pl.col("window_start"))).unique()
    return (features.select(pl.col("host").cast(pl.String), _utc(pl.col("window_start")), _utc(pl.col("window_end")))
            .unique(list(WINDOW_KEYS))
            .join(f.with_columns(pl.lit(True).alias("flagged")), on=list(WINDOW_KEYS), how="left")
            .with_columns(pl.col("flagged").fill_null(False)))


def _call_matcher(matcher: Matcher, findings: pl.DataFrame, host_facts: pl.DataFrame | None,
                  features: pl.DataFrame) -> pl.DataFrame:
    import inspect

    try:
        takes_features = "features" in inspect.signature(matcher).parameters
    except (TypeError, ValueError):  # builtins and some callables have no signature
        takes_features = False
    if takes_features:
        return matcher(findings, host_facts, features=features)
    return matcher(findings, host_facts)


def load_matcher(spec: str) -> Matcher:
    """``"package.module:function"`` -> the matcher function (for ``--matcher``)."""
    import importlib

    mod, _, fn = spec.partition(":")
    if not mod or not fn:
        raise ValueError(f"--matcher {spec!r}: expected MODULE:FUNCTION")
    try:
        obj = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--matcher {spec!r}: {exc}") from None
    if not callable(obj):
        raise ValueError(f"--matcher {spec!r} is not callable")
    return obj


# ------------------------------------------------------------------ rendering


def _pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _top1(m: Metrics) -> str:
    return "n/a" if m.top1_identified is None else f"{m.top1_identified}/{m.labels}"


def _sec(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def render_table(ev: Evaluation) -> str:
    """The ablation table (rows = combinations) and a per-type table per combination."""
    head = ["config", "win P", "win R", "win F1", "evt P", "evt R", "evt F1", "TTD med s", "TTD p90 s",
            "hit rate", "coverage", "agreement", "healthy contam.", "top-1", "unmatched/h"]
    rows = []
    for name, m in ev.rows.items():
        w = m.window or PRF(0, 0, 0, None, None, None)
        label = f"{name} (default)" if name == ev.default_config else name
        rows.append([label, _pct(w.precision), _pct(w.recall), _pct(w.f1), _pct(m.event_precision),
                     _pct(m.event_recall), _pct(m.event_f1), _sec(m.ttd_median_s), _sec(m.ttd_p90_s),
                     _pct(m.signature_hit_rate), _pct(m.signature_coverage),
                     _pct(m.detection_signature_agreement), _pct(m.healthy_contamination),
                     _top1(m), _num(m.unmatched_per_host_hour)])
    out = [_grid(head, rows)]
    dm = ev.rows.get(ev.default_config or "")
    if dm is not None and dm.top1_identified is not None:
        out.append(f"{ev.default_config}: top-1 identification of injected incidents {_top1(dm)} "
                   f"({_pct(dm.top1_rate)}); unmatched incidents outside labels {dm.unmatched_incidents} in "
                   f"{_num(dm.healthy_host_hours)} healthy host-hours = {_num(dm.unmatched_per_host_hour)} per "
                   f"host-hour; matched incidents outside labels (false identifications) {dm.false_identifications}")
    any_m = next(iter(ev.rows.values()), None)
    if any_m is not None:
        out.insert(0, f"windows: {any_m.windows}  positive: {any_m.positive_windows}  labels: {any_m.labels}  "
                      f"matcher: {ev.matcher or 'none (fingerprint figures n/a)'}")
    # per type: the full breakdown for the default (or first) combination, then event
    # recall of every combination side by side; all of it is in the JSON
    focus = ev.default_config if ev.default_config in ev.per_type else next(iter(ev.per_type), None)
    per = ev.per_type.get(focus, {}) if focus is not None else {}
    if per:
        th = ["type", "labels", "detected", "evt R", "win R", "TTD med s", "TTD p90 s", "hit rate", "coverage",
              "top-1"]
        tr = [[t, str(m.labels), str(m.detected_labels), _pct(m.event_recall),
               _pct(m.window.recall if m.window else None), _sec(m.ttd_median_s), _sec(m.ttd_p90_s),
               _pct(m.signature_hit_rate), _pct(m.signature_coverage), _top1(m)] for t, m in per.items()]
        out += ["", f"per type — {focus}", _grid(th, tr)]
        names = list(ev.per_type)
        types = sorted({t for d in ev.per_type.values() for t in d})
        mr = [[t, *(_pct(ev.per_type[n][t].event_recall) if t in ev.per_type[n] else "n/a" for n in names)]
              for t in types]
        out += ["", "event recall per type and combination", _grid(["type", *names], mr)]
    return "\n".join(out)


def _grid(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))  # noqa: E731
    return "\n".join([line(head), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])
