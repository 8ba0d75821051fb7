"""Incidents: anomalous windows of one host grouped in time, with their knowledge-base match.

Windows whose best candidate matched entry E on host H form runs (a gap of at most
``max_gap_s`` between consecutive E windows; unmatched windows in between belong to the
run); an entry that is some window's best keeps the windows where it matched below
another (a second fault beside it outranks it there). **One cause, one incident**: overlapping runs of one host are one **matched**
incident unless their entries are separate causes (:func:`separate_causes`: both read host
facts, different ones; or their subsystems are disjoint and neither reads a fact, or the
symptom began over a minute before the fact-reading entry; and never when one entry
declares the other's subsystems as its ``consequences``). The incident
carries its best-ranked entry — a host fact that held (a ``fact`` signal, e.g.
``thp.enabled == 'never'``) outranks symptoms only; then a cause outranks the symptoms it
explains; then mean confidence x the share of the
incident's windows the entry matched — and lists the others in ``alternatives`` with the
evidence that ranked them lower. ``confidence`` = the mean confidence of the chosen entry
over its windows, ``match_share`` = its windows / all windows of the span. Windows outside
every matched incident form **unmatched** incidents, kept with their fingerprint (mean
subsystem shares and the features that carried most of the attribution) so ``unveil kb
draft`` can turn one into a new entry.

``incident_id`` is deterministic: a hash of host, start and the entry of the incident's
first run (stable while later runs join an open incident, even if one of them outranks
it), so re-running a sweep over the same data gives the same ids (the remediation queue's idempotency key relies on it).

The lake's ``incidents`` table is append-only: a sweep writes a row with ``state = 'open'``
while an incident may still grow (updated each sweep, same id) and one with ``state =
'closed'`` once no later window can join it, or ``'superseded'`` when a later sweep no
longer raises an open incident under its id (its windows joined an earlier one);
``updated`` is the data time (the sweep's horizon) of the row. Readers take each incident's latest row (:func:`latest_incidents`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import polars as pl

from analytics.attribution import FACTOR_DTYPE, SHARE_COLUMNS
from knowledge_base.loader import Entry, KnowledgeBase, load_kb
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
    "state": pl.String(),  # open (may still grow) | closed | superseded (see STATES)
    "updated": TS,  # data time of this row (the sweep's horizon; a post-mortem: the incident's end)
}
#: ``superseded``: an open incident that a later sweep no longer raises under its id (its
#: windows joined another incident: a cause took in its consequences); readers drop it
STATES = ("open", "closed", "superseded")


def latest_incidents(df: pl.DataFrame, *, superseded: bool = False) -> pl.DataFrame:
    """Each incident's latest row of an ``incidents`` table (its rows ordered by ``updated``,
    a closed row after an open one of the same time); incidents whose latest row is
    ``superseded`` are left out unless ``superseded``. Rows written before incidents had a
    state (no ``state``/``updated`` columns, or nulls) count as closed at their end."""
    if df.is_empty() or "incident_id" not in df.columns:
        return df
    return latest_incidents_lazy(df.lazy(), superseded=superseded).collect()


def latest_incidents_lazy(lf: pl.LazyFrame, *, superseded: bool = False) -> pl.LazyFrame:
    """:func:`latest_incidents` for a lazy scan (a SQL view over the table)."""
    cols = lf.collect_schema().names()
    if "incident_id" not in cols:
        return lf
    if "state" not in cols:
        lf = lf.with_columns(pl.lit("closed").alias("state"))
    if "updated" not in cols:
        lf = lf.with_columns(pl.col("end").cast(TS).alias("updated"))
    lf = lf.with_columns(pl.col("state").fill_null("closed"))
    out = (lf.with_columns(_k1=pl.col("updated").fill_null(pl.col("end")), _k2=pl.col("state") == "closed")
           .sort("_k1", "_k2").unique("incident_id", keep="last", maintain_order=True).drop("_k1", "_k2"))
    return out if superseded else out.filter(pl.col("state") != "superseded")


def episodes(df: pl.DataFrame, gap_s: float = 5.0) -> pl.DataFrame:
    """One row per lasting problem: the scheduler cuts an incident every ``max_incident``
    (its findings are re-read while it is open, so its length is bounded), and the parts of
    one host's one cause follow each other (the next part starts at most ``gap_s``, the
    scheduler's ``incident_gap_s``, after the previous ends; a longer gap is a new
    incident). ``df``: latest incident rows (:func:`latest_incidents`). The row of the
    first part is kept (its ``incident_id``, entry, explanation, fingerprint), with the
    episode's ``start``, ``end``, ``updated`` and ``state`` (the last part's), its windows
    summed, the highest ``peak_score``, ``confidence``, ``match_share`` and the subsystem
    shares weighted by each part's windows, the union of ``devices``, and ``parts`` (how
    many)."""
    return episodes_lazy(df.lazy(), gap_s).collect()


def episodes_lazy(lf: pl.LazyFrame, gap_s: float = 5.0) -> pl.LazyFrame:
    """:func:`episodes` for a lazy scan (the ``lasting_incidents`` view of ``unveil query``)."""
    cols = [c for c in lf.collect_schema().names() if c != "parts"]
    by = ["host", "_cause"]
    gap = pl.duration(microseconds=int(round(gap_s * 1e6)))
    s = (lf.with_columns(_cause=pl.col("entry_id").fill_null("") + "|" + pl.col("status").fill_null(""))
         .sort("host", "_cause", "start")
         .with_columns(_prev=pl.col("end").cum_max().shift(1).over(by)))
    s = s.with_columns(_ep=(pl.col("_prev").is_null() | (pl.col("start") > pl.col("_prev") + gap)).cum_sum().over(by))
    w = pl.col("n_windows").cast(pl.Float64)

    def weighted(c: str) -> pl.Expr:  # null where no part has a value (an unmatched incident's confidence)
        known = w.filter(pl.col(c).is_not_null()).sum()
        return pl.when(known > 0).then((pl.col(c) * w).sum() / known)

    merged = {
        "start": pl.col("start").min(), "end": pl.col("end").max(), "n_windows": pl.col("n_windows").sum(),
        "peak_score": pl.col("peak_score").max(),
        **{c: weighted(c) for c in ("confidence", "match_share", *SHARE_COLUMNS) if c in cols},
        "devices": pl.col("devices").explode().drop_nulls().unique(maintain_order=True),
        "state": pl.col("state").last(), "updated": pl.col("updated").max(),
    }
    aggs = [merged[c].alias(c) if c in merged else pl.col(c).first() for c in cols if c != "host"]
    out = s.group_by([*by, "_ep"], maintain_order=True).agg(*aggs, pl.len().cast(pl.Int64).alias("parts"))
    return out.select(*cols, "parts").sort("host", "start")


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


def _fact_keys(entry: Entry | None) -> tuple[frozenset[str], tuple[str, ...]]:
    """The host facts an entry reads as evidence of its cause (its ``fact`` signals; not its
    preconditions, which say whether the entry can apply at all, e.g. ``numa.nodes >= 1``),
    and how the matcher writes each such signal when it held (``<key> (holds)``)."""
    if entry is None:
        return frozenset(), ()
    sigs = [s for s in entry.signals if s.fact is not None and s.role != "excludes"]
    return frozenset(str(s.fact) for s in sigs), tuple(f"{s.key} (holds)" for s in sigs)


def _cause_keys(entry: Entry | None) -> frozenset[str]:
    """What an entry reads as its cause itself: its host facts, and the telemetry signals
    marked ``cause`` (a setting or device state sampled as a series — the GPU power limit
    against its default, the PCIe link against its maximum, a cgroup throttled by its CFS
    quota). Another fault does not produce them, so such a match is never read as another
    entry's consequence."""
    if entry is None:
        return frozenset()
    return _fact_keys(entry)[0] | frozenset(s.family for s in entry.signals if s.cause)  # (required only: loader)


#: a symptom that began at most this long before a fact-reading entry's first window can
#: still be the fact's consequence: host facts are re-read once a minute (the agent's fact
#: poll), so a configuration change can be seen up to a minute after its effects
CONSEQUENCE_LAG_S = 60.0


def separate_causes(first: Entry | None, later: Entry | None, lead_s: float = 0.0) -> bool:
    """Whether matches of ``first`` and ``later`` (whose run began ``lead_s`` seconds after
    ``first``'s) overlapping on one host are two causes (two incidents) rather than one
    cause with alternative readings (one incident). Separate when:

    * both read their cause (:func:`_cause_keys`: host facts, or telemetry marked
      ``cause``), and not the same: two faults, each with its own fix (THP ``never`` and a
      governor; a governor and a CFS quota);
    * neither reads a host fact and their subsystems are disjoint: independent evidence
      (storage contention beside NIC drops, or beside a GPU power cap);
    * a symptom-only entry began more than :data:`CONSEQUENCE_LAG_S` before a fact-reading
      one with disjoint subsystems: it was there before the configuration changed, so it
      is not its consequence.

    Otherwise one cause: a symptom-only entry after a fact-reading one is read as its
    consequence whatever its subsystem (THP off raises page-fault CPU time and memory
    traffic; the fact is the stronger evidence), a symptom-only entry whose subsystems are
    all among another's declared ``consequences`` likewise (:func:`explains`: memory
    pressure's reclaim and page zeroing take CPU), and entries sharing a subsystem are
    competing readings of the same evidence. Depends on entry definitions and the order of
    first windows only, so later windows cannot regroup an open incident."""
    if first is None or later is None or first.id == later.id:
        return False
    if explains(first, later, lead_s) or explains(later, first, -lead_s):
        return False
    ca, cb = _cause_keys(first), _cause_keys(later)
    if ca and cb:
        return ca.isdisjoint(cb)
    disjoint = set(first.subsystems).isdisjoint(later.subsystems)
    if not _fact_keys(first)[0] and not _fact_keys(later)[0]:
        return disjoint
    return disjoint and not ca and lead_s > CONSEQUENCE_LAG_S


def explains(cause: Entry | None, effect: Entry | None, lead_s: float = 0.0) -> bool:
    """Whether ``cause`` accounts for an overlapping match of ``effect`` that began ``lead_s``
    seconds after it (negative: before it): ``effect`` reads no cause of its own
    (:func:`_cause_keys`), every subsystem
    of it is among ``cause``'s ``consequences``, and it began at most
    :data:`CONSEQUENCE_LAG_S` before ``cause`` (the consumer's first seconds: a memory hog
    zeroing the pages it takes shows as CPU time before MemAvailable is low)."""
    if cause is None or effect is None or cause.id == effect.id or not cause.consequences:
        return False
    if _cause_keys(effect) or lead_s < -CONSEQUENCE_LAG_S:
        return False
    return set(effect.subsystems) <= set(cause.consequences)


@dataclass
class _Run:
    """One run of windows of one host whose best candidate matched one entry."""

    host: str
    entry_id: str
    entry: Entry | None
    rows: pl.DataFrame  # the run's matched windows
    start: Any
    end: Any
    fact_windows: int  # windows in which one of the entry's fact signals held
    facts_held: list[str]

    @classmethod
    def of(cls, host: str, entry_id: str, entry: Entry | None, rows: pl.DataFrame) -> _Run:
        _, held = _fact_keys(entry)
        fw, facts_held = 0, []
        if held:
            hits = rows.select(pl.col("explanation").fill_null("").str.contains(k, literal=True).alias(f"_{i}")
                               for i, k in enumerate(held))
            fw = int(hits.select(pl.any_horizontal(pl.all())).to_series().sum())
            facts_held = [k.removesuffix(" (holds)") for k, c in zip(held, hits.columns, strict=True) if hits[c].any()]
        return cls(host, entry_id, entry, rows, rows[WS].min(), rows[WE].max(), fw, facts_held)

    @property
    def reads_facts(self) -> bool:
        return bool(_fact_keys(self.entry)[0])

    def confidence(self) -> float:
        return float(self.rows["confidence"].mean() or 0.0)  # type: ignore[arg-type]

    def rank_key(self, n: int, group: list[_Run] | None = None) -> tuple[int, int, float, str]:
        """Best first when sorted: a fact that held outranks symptoms only; then an entry that
        explains another of the ``group`` (:func:`explains`) outranks what it explains; then
        the mean confidence x the share of the incident's windows the entry matched; then
        entry id."""
        cause = any(explains(self.entry, o.entry, (o.start - self.start).total_seconds()) for o in group or ())
        return (-int(self.fact_windows > 0), -int(cause),
                -round(self.confidence() * self.rows.height / max(n, 1), 9), self.entry_id)

    def basis(self, n: int) -> str:
        """The evidence that sets this reading apart from the others of its incident."""
        k = self.rows.height
        head = f"{self.entry_id}: {k}/{n} windows, confidence {self.confidence():.2f}"
        if self.fact_windows:
            return f"{head}, {' and '.join(self.facts_held)} held in {self.fact_windows} of them"
        if self.reads_facts:
            return f"{head}, its fact did not hold (matched on symptoms only)"
        return f"{head}, symptoms only (no host fact)"


def _group_runs(runs: list[_Run], max_gap_s: float) -> list[list[_Run]]:
    """Runs of one host grouped into causes, in order of their first window: a run joins the
    earliest group that it overlaps (within ``max_gap_s``) and holds no separate cause of it
    (:func:`separate_causes`), else founds a new group. A run's group depends only on earlier
    runs, so the windows a later sweep adds cannot regroup an open incident (its id, from its
    founder, stays), with one exception: a run of a cause (:func:`explains`) takes in the
    later groups that hold only its consequences, the earlier founder naming the merged
    incident (the taken group's id is superseded)."""
    gap = timedelta(seconds=max_gap_s)
    groups: list[list[_Run]] = []
    ends: list[Any] = []
    for r in sorted(runs, key=lambda r: (r.start, r.entry_id)):
        for g, members in enumerate(groups):
            # a member explained by another (a consequence) does not speak for the group
            leaders = [m for m in members
                       if not any(explains(c.entry, m.entry, (m.start - c.start).total_seconds()) for c in members)]
            if r.start <= ends[g] + gap and not any(
                    separate_causes(m.entry, r.entry, (r.start - m.start).total_seconds()) for m in leaders):
                members.append(r)
                ends[g] = max(ends[g], r.end)
                # a cause joining takes in the later groups made only of its consequences
                # (storage windows of a memory hog that began between its CPU windows and
                # its MemAvailable ones); the earliest founder still names the incident
                for h in range(len(groups) - 1, g, -1):
                    if groups[h][0].start <= ends[g] + gap and all(
                            explains(r.entry, o.entry, (o.start - r.start).total_seconds()) for o in groups[h]):
                        members.extend(groups.pop(h))
                        ends[g] = max(ends[g], ends.pop(h))
                members.sort(key=lambda m: (m.start, m.entry_id))
                break
        else:
            groups.append([r])
            ends.append(r.end)
    return groups


def _by_entry(group: list[_Run]) -> list[_Run]:
    """The runs of a group with one run per entry (its runs' windows together), founder first."""
    out: dict[str, list[_Run]] = {}
    for r in group:
        out.setdefault(r.entry_id, []).append(r)
    return [rs[0] if len(rs) == 1 else _Run.of(rs[0].host, rs[0].entry_id, rs[0].entry,
                                                 pl.concat([x.rows for x in rs]).sort(WS))
            for rs in out.values()]


def build_incidents(matches: pl.DataFrame, findings: pl.DataFrame, kb: KnowledgeBase | None = None,
                    *, max_gap_s: float = 30.0) -> pl.DataFrame:
    """The ``incidents`` table (schema :data:`INCIDENT_SCHEMA`) from the matcher's candidates
    and the findings they came from.

    1. windows whose best candidate matched entry E form runs per (host, E), a gap of at most
       ``max_gap_s`` between consecutive E windows (unmatched windows in between belong to
       the run), with the windows where E matched below another entry when E is the best
       of some window of the host;
    2. the runs of a host that overlap are one cause unless their entries are separate
       causes (:func:`separate_causes`; grouping: :func:`_group_runs`): each group is one
       *matched* incident carrying its best-ranked entry (:meth:`_Run.rank_key`: a host
       fact that held outranks symptoms only, then mean confidence x share of the
       incident's windows), the others listed in ``alternatives`` with their evidence;
    3. the remaining windows — not inside any matched incident of their host — form runs
       per host the same way: *unmatched* incidents, with their fingerprint."""
    if findings is None or findings.is_empty():
        return pl.DataFrame(schema=INCIDENT_SCHEMA)
    kb = kb or load_kb()
    f = findings.with_columns(pl.col(WS).cast(TS), pl.col(WE).cast(TS)).sort(HOST, WS)
    cols = [HOST, WS, "entry_id", "confidence", "devices", "explanation"]
    if matches.is_empty():
        matches = pl.DataFrame(schema=MATCH_SCHEMA)
    every = matches.filter(pl.col("matched")).select(HOST, pl.col(WS).cast(TS), "rank", *cols[2:])
    best = every.filter(pl.col("rank") == 1).drop("rank")
    # an entry that was a window's best reading somewhere on the host keeps the windows
    # where it still matched below another: a second cause starting beside it outranks it
    # there, and the first cause's incident must not stop where the second begins
    lower = every.filter(pl.col("rank") > 1).join(best.select(HOST, "entry_id").unique(), on=[HOST, "entry_id"],
                                                  how="semi").drop("rank")
    f = f.join(best, on=[HOST, WS], how="left")
    # the same findings rows, carrying that entry's own confidence in the window
    extra = f.drop(cols[2:]).join(lower, on=[HOST, WS], how="inner")
    recs: list[dict[str, Any]] = []
    spans: dict[str, list[tuple[Any, Any]]] = {}
    matched = _runs(pl.concat([f.filter(pl.col("entry_id").is_not_null()), extra]).sort(HOST, WS),
                    [HOST, "entry_id"], max_gap_s)
    runs: dict[str, list[_Run]] = {}
    for (host, entry_id, _seg), mine in matched.group_by([HOST, "entry_id", "_seg"], maintain_order=True):
        runs.setdefault(str(host), []).append(_Run.of(str(host), str(entry_id), kb.by_id.get(str(entry_id)), mine))
    for host, host_runs in runs.items():
        for group in _group_runs(host_runs, max_gap_s):
            start, end = min(r.start for r in group), max(r.end for r in group)
            spans.setdefault(host, []).append((start, end))
            # every finding of the host inside the span belongs to the incident
            rows = f.filter((pl.col(HOST) == host) & (pl.col(WS) >= start) & (pl.col(WE) <= end))
            n = rows.height
            group = _by_entry(group)
            ranked = sorted(group, key=lambda r: r.rank_key(n, group))
            chosen, others = ranked[0], ranked[1:]
            mine, entry = chosen.rows, chosen.entry
            devs = sorted({d for ds in mine["devices"].to_list() if ds for d in ds})
            # (windows where the entry only matched below another carry no explanation)
            peak_row = mine.sort([pl.col("explanation").is_null(), "confidence", WS],
                                 descending=[False, True, False]).row(0, named=True)
            top, shares = _fingerprint(rows)
            why = f"Chosen: {chosen.basis(n)}"
            if others:
                why += " (ranked over " + "; ".join(o.basis(n) for o in others) + ")"
            recs.append({
                # the founder (earliest run) names the incident: stable while later runs join it
                "incident_id": incident_id(host, start, group[0].entry_id), HOST: host, "start": start,
                "end": end, "n_windows": n, "status": "matched", "entry_id": chosen.entry_id,
                "label_type": entry.label_type if entry else chosen.entry_id,
                "title": entry.title if entry else chosen.entry_id,
                "confidence": round(chosen.confidence(), 6),
                "match_share": mine.height / n, "peak_score": _peak(rows), "devices": devs,
                "alternatives": [o.basis(n) for o in others],
                "explanation": f"{mine.height}/{n} windows matched. {why}. {peak_row['explanation']}",
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
