"""Incidents: anomalous windows of one host grouped in time, with their knowledge-base match.

Windows whose best candidate matched entry E on host H form runs (a gap of at most
``max_gap_s`` between consecutive E windows; unmatched windows in between belong to the
run): each run is a **matched** incident with ``confidence`` = the mean confidence of E
over its windows and ``match_share`` = matched windows / all windows of the span. Two
entries may overlap in time (simultaneous inefficiencies). Windows outside every matched
incident form **unmatched** incidents, kept with their fingerprint (mean subsystem shares
and the features that carried most of the attribution) so ``unveil kb draft`` can turn one
into a new entry.

``incident_id`` is deterministic: a hash of host, start and entry, so re-running a sweep
over the same data gives the same ids (the remediation queue's idempotency key relies on it).

The lake's ``incidents`` table is append-only: a sweep writes a row with ``state = 'open'``
while an incident may still grow (updated each sweep, same id) and one with ``state =
'closed'`` once no later window can join it; ``updated`` is the data time (the sweep's
horizon) of the row. Readers take each incident's latest row (:func:`latest_incidents`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import polars as pl

from analytics.attribution import FACTOR_DTYPE, SHARE_COLUMNS
from knowledge_base.loader import KnowledgeBase, load_kb
from knowledge_base.matcher import HOST, MATCH_SCHEMA, TS, WE, WS

INCIDENT_SCHEMA: dict[str, pl.DataType] = {
    "incident_id": pl.String(),
    HOST: pl.String(),
    "start": TS,
    "end": TS,
    "n_windows": pl.Int64(),
    "status": pl.String(),  # matched | unmatched
    "entry_id": pl.String(),
    "label_type": pl.String(),
    "title": pl.String(),
    "confidence": pl.Float64(),
    "match_share": pl.Float64(),
    "peak_score": pl.Float64(),
    "devices": pl.List(pl.String()),
    "alternatives": pl.List(pl.String()),
    "explanation": pl.String(),
    "top_factors": pl.List(FACTOR_DTYPE),
    **{c: pl.Float64() for c in SHARE_COLUMNS},
    "state": pl.String(),  # open (may still grow) | closed
    "updated": TS,  # data time of this row (the sweep's horizon; a post-mortem: the incident's end)
}
STATES = ("open", "closed")


def latest_incidents(df: pl.DataFrame) -> pl.DataFrame:
    """Each incident's latest row of an ``incidents`` table (its rows ordered by ``updated``,
    a closed row after an open one of the same time). Rows written before incidents had a
    state (no ``state``/``updated`` columns, or nulls) count as closed at their end."""
    if df.is_empty() or "incident_id" not in df.columns:
        return df
    return latest_incidents_lazy(df.lazy()).collect()


def latest_incidents_lazy(lf: pl.LazyFrame) -> pl.LazyFrame:
    """:func:`latest_incidents` for a lazy scan (a SQL view over the table)."""
    cols = lf.collect_schema().names()
    if "incident_id" not in cols:
        return lf
    if "state" not in cols:
        lf = lf.with_columns(pl.lit("closed").alias("state"))
    if "updated" not in cols:
        lf = lf.with_columns(pl.col("end").cast(TS).alias("updated"))
    lf = lf.with_columns(pl.col("state").fill_null("closed"))
    return (lf.with_columns(_k1=pl.col("updated").fill_null(pl.col("end")), _k2=pl.col("state") == "closed")
            .sort("_k1", "_k2").unique("incident_id", keep="last", maintain_order=True).drop("_k1", "_k2"))


def incident_id(host: str, start: Any, entry_id: str = "") -> str:
    """``inc-`` + 12 hex digits of sha1(host|start ISO|entry id)."""
    iso = start.isoformat() if hasattr(start, "isoformat") else str(start)
    return "inc-" + hashlib.sha1(f"{host}|{iso}|{entry_id}".encode()).hexdigest()[:12]


def _runs(df: pl.DataFrame, by: list[str], max_gap_s: float) -> pl.DataFrame:
    """Add ``_seg``: windows of the same ``by`` group whose gap to the previous one is at
    most ``max_gap_s`` share a segment number."""
    gap = pl.duration(microseconds=round(max_gap_s * 1e6))
    prev_end = pl.col(WE).shift(1).over(by)
    new = prev_end.is_null() | (pl.col(WS) > prev_end + gap)
    return df.sort([*by, WS]).with_columns(new.cast(pl.Int64).cum_sum().over(by).alias("_seg"))


def _fingerprint(rows: pl.DataFrame, k: int = 5) -> tuple[list[dict[str, Any]], dict[str, float]]:
    shares = {c: float(rows[c].fill_null(0.0).mean() or 0.0) if c in rows.columns else 0.0  # type: ignore[arg-type]
              for c in SHARE_COLUMNS}
    if "top_factors" not in rows.columns or rows.is_empty():
        return [], shares
    tf = rows.select("top_factors").explode("top_factors").unnest("top_factors").drop_nulls("feature")
    if tf.is_empty():
        return [], shares
    n = rows.height
    agg = (tf.group_by("feature", "family", "device", "subsystem")
           .agg((pl.col("contribution").sum() / n).alias("contribution"),
                pl.col("direction").mode().sort().first().alias("direction"),
                pl.col("value").median().alias("value"), pl.col("reference").median().alias("reference"))
           .sort(["contribution", "feature"], descending=[True, False]).head(k))
    return agg.select(list(FACTOR_DTYPE.to_schema())).to_dicts(), shares


def build_incidents(matches: pl.DataFrame, findings: pl.DataFrame, kb: KnowledgeBase | None = None,
                    *, max_gap_s: float = 30.0) -> pl.DataFrame:
    """The ``incidents`` table (schema :data:`INCIDENT_SCHEMA`) from the matcher's candidates
    and the findings they came from.

    1. windows whose best candidate matched entry E form runs per (host, E), a gap of at most
       ``max_gap_s`` between consecutive E windows (unmatched windows in between belong to
       the run): each run is a *matched* incident. Two entries can overlap in time
       (simultaneous inefficiencies).
    2. the remaining windows — not inside any matched incident of their host — form runs
       per host the same way: *unmatched* incidents, with their fingerprint."""
    if findings is None or findings.is_empty():
        return pl.DataFrame(schema=INCIDENT_SCHEMA)
    kb = kb or load_kb()
    f = findings.with_columns(pl.col(WS).cast(TS), pl.col(WE).cast(TS)).sort(HOST, WS)
    cols = [HOST, WS, "entry_id", "confidence", "devices", "explanation"]
    if matches.is_empty():
        best = pl.DataFrame(schema={c: MATCH_SCHEMA[c] for c in cols})
    else:
        best = matches.filter(pl.col("matched") & (pl.col("rank") == 1)).select(
            HOST, pl.col(WS).cast(TS), *cols[2:])
    f = f.join(best, on=[HOST, WS], how="left")
    recs: list[dict[str, Any]] = []
    spans: dict[str, list[tuple[Any, Any]]] = {}
    matched = _runs(f.filter(pl.col("entry_id").is_not_null()), [HOST, "entry_id"], max_gap_s)
    for (host, entry_id, _seg), mine in matched.group_by([HOST, "entry_id", "_seg"], maintain_order=True):
        start, end = mine[WS].min(), mine[WE].max()
        spans.setdefault(str(host), []).append((start, end))
        # every finding of the host inside the span belongs to the incident
        rows = f.filter((pl.col(HOST) == host) & (pl.col(WS) >= start) & (pl.col(WE) <= end))
        n = rows.height
        entry = kb.by_id.get(str(entry_id))
        others = rows.filter(pl.col("entry_id").is_not_null() & (pl.col("entry_id") != entry_id))
        alt = others.group_by("entry_id").len().sort(["len", "entry_id"], descending=[True, False])
        devs = sorted({d for ds in mine["devices"].to_list() if ds for d in ds})
        peak_row = mine.sort(["confidence", WS], descending=[True, False]).row(0, named=True)
        top, shares = _fingerprint(rows)
        recs.append({
            "incident_id": incident_id(str(host), start, str(entry_id)), HOST: host, "start": start, "end": end,
            "n_windows": n, "status": "matched", "entry_id": entry_id,
            "label_type": entry.label_type if entry else entry_id, "title": entry.title if entry else entry_id,
            "confidence": round(float(mine["confidence"].mean() or 0.0), 6),  # type: ignore[arg-type]
            "match_share": mine.height / n, "peak_score": _peak(rows), "devices": devs,
            "alternatives": [f"{e} ({k}/{n} windows)" for e, k in alt.iter_rows()],
            "explanation": f"{mine.height}/{n} windows matched. {peak_row['explanation']}",
            "top_factors": top, **shares, "state": "closed", "updated": end,
        })
    rest = f.filter(pl.col("entry_id").is_null())
    if spans and rest.height:
        inside = pl.lit(False)
        for host, ss in spans.items():
            for a, b in ss:
                inside = inside | ((pl.col(HOST) == host) & (pl.col(WS) >= a) & (pl.col(WE) <= b))
        rest = rest.filter(~inside)
    for (host, _seg), rows in _runs(rest, [HOST], max_gap_s).group_by([HOST, "_seg"], maintain_order=True):
        start, end = rows[WS].min(), rows[WE].max()
        top, shares = _fingerprint(rows)
        fams = ", ".join(f"{t['feature']} {t['direction']}" for t in top[:3]) or "no attribution"
        recs.append({
            "incident_id": incident_id(str(host), start), HOST: host, "start": start, "end": end,
            "n_windows": rows.height, "status": "unmatched", "entry_id": None, "label_type": None, "title": None,
            "confidence": None, "match_share": 0.0, "peak_score": _peak(rows),
            "devices": sorted({t["device"] for t in top if t["device"]}), "alternatives": [],
            "explanation": f"no knowledge-base entry matched; fingerprint: {fams}", "top_factors": top, **shares,
            "state": "closed", "updated": end,
        })
    if not recs:
        return pl.DataFrame(schema=INCIDENT_SCHEMA)
    return pl.DataFrame(recs, schema=INCIDENT_SCHEMA).sort(HOST, "start", "incident_id")


def _peak(rows: pl.DataFrame) -> float | None:
    if "score" not in rows.columns:
        return None
    v = rows["score"].max()
    return float(v) if v is not None else None  # type: ignore[arg-type]
