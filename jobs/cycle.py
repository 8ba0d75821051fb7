"""One scheduler cycle: under the lake's scheduler lock it recovers an interrupted sweep,
then walks every host from its watermark to ``now - lag`` (rounded down to the stride
grid) in chunks of at most ``chunk``, and commits each chunk through
:mod:`jobs.watermarks`' staged protocol, so every window is processed exactly once.

Per chunk ``[s, e)`` of a group of hosts sharing the watermark ``s``:

* each host's features are computed as if alone (:func:`jobs.telemetry.batch_features`,
  batches of hosts run by the ``engine``): from its raw telemetry ``[s - L + 1us, e)``
  only, its ``history`` read back from the lake's ``features`` table (raw telemetry only
  where that lacks it), so memory holds a batch's raw rows at a time (at most an hour of
  one host's: a live one-minute chunk reads 60 hosts together); they go to a file of the host's own in the
  staging directory, and its judged windows to the staged ``features`` table; corrupt
  files are skipped and returned to the caller, who warns once per file. The windows
  ending in ``(s, e]`` are judged by the sweep step (:func:`jobs.step.sweep_step`; ``L`` =
  window length: a window straddling ``s`` was incomplete in the previous chunk and is
  judged now), which reads the hosts' files a batch of hosts at a time (the cohorts are
  formed over all of them): scores, findings (statistical outside warm-up, or a
  knowledge-base signature), their rank-1 matches;
* findings are grouped into incidents (gap <= ``incident_gap_s``, at most
  ``max_incident`` long, raised once they span ``min_incident_s``); a matched incident is
  written with ``state = 'open'`` as soon as it has persisted and again each chunk it
  changes (same ``incident_id``, ``updated`` = the chunk's end), and with ``state =
  'closed'`` once no later window can join it (unmatched ones only then); the start of a
  still-open segment is carried in the host's state (``open_since``) and its findings are
  read back from the lake by the next chunk;
* matched incidents whose KB entry names a script, open ones included, are queued for
  remediation (dry-run proposals, one per cause: later rows and fragments attach;
  :mod:`jobs.remediations`);
* features, scores, findings, incidents and remediations go to the lake; findings,
  incidents and remediations also to InfluxDB (:mod:`jobs.writeback`).

After the chunks: auto-remediation (when enabled), due verifications, and the
``remediations`` table brought up to the queue. :func:`maintain` compacts the lake and
applies retention (the scheduler runs it on its own period).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from ingest import lake as lake_mod
from ingest import objstore, schema
from jobs import watermarks as wm
from jobs.config import SweepConfig
from jobs.engine import Engine, SerialEngine
from jobs.grid import US, floor_grid, stamp, utc
from jobs.progress import Progress
from jobs.remediations import (
    auto_remediate,
    conclude_due_verifications,
    export_remediations,
    new_remediation_rows,
    queue_remediations,
)
from jobs.step import TS, sweep_step, with_time
from jobs.telemetry import (
    Corrupt,
    HostChunk,
    HostFeatures,
    Loaded,
    Part,
    batch_features,
    batches,
    first_times,
    fleet_hosts,
    has_data,
    joined,
    merge_corrupt,
    next_data,
)
from jobs.writeback import WriteBack
from knowledge_base import INCIDENT_SCHEMA, latest_incidents, load_kb
from knowledge_base.detector import empty_findings
from knowledge_base.loader import KnowledgeBase

log = logging.getLogger(__name__)

HOST = schema.HOST


@dataclass
class ChunkSummary:
    sweep_id: str
    start: datetime
    end: datetime
    hosts: list[str]
    windows: int = 0
    findings: int = 0
    remediations: int = 0
    incident_ids: frozenset[str] = frozenset()  # incidents the chunk opened or updated (not superseded ones)

    @property
    def incidents(self) -> int:
        return len(self.incident_ids)


@dataclass
class CycleSummary:
    horizon: datetime | None = None
    chunks: list[ChunkSummary] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    corrupt: list[Corrupt] = field(default_factory=list)  # files skipped this cycle, one entry each
    caught_up: bool = True
    influx_points: int = 0
    verifications: dict[str, int] = field(default_factory=dict)  # concluded this cycle: state -> count
    remediation_rows: int = 0  # action snapshots appended to the remediations table at the cycle's end

    @property
    def windows(self) -> int:
        return sum(c.windows for c in self.chunks)

    @property
    def findings(self) -> int:
        return sum(c.findings for c in self.chunks)

    @property
    def incidents(self) -> int:
        """Incidents the cycle opened or updated, each once: an incident that spans chunks
        is updated by each of them."""
        return len(frozenset().union(*(c.incident_ids for c in self.chunks)))


def sweep_id(start: datetime, end: datetime, hosts: Sequence[str]) -> str:
    """Deterministic: a retry of the same chunk reuses (and first clears) its staging dir."""
    h = hashlib.sha1(",".join(sorted(hosts)).encode()).hexdigest()[:8]
    return f"sw-{stamp(start)}-{stamp(end)}-{h}"


def _read_open_findings(lake: str | os.PathLike[str], marks: Mapping[str, wm.HostMark], hosts: Sequence[str],
                        before: datetime, corrupt: list[Corrupt]) -> pl.DataFrame:
    parts = []
    if "findings" not in lake_mod.tables(lake):
        return empty_findings()
    for h in hosts:
        since = marks[h].open_since if h in marks else None
        if since is None:
            continue
        df = lake_mod.read(lake, "findings", start=since, end=before, hosts=[h], on_corrupt="skip", report=corrupt)
        if df.height:
            parts.append(df.drop(schema.TIME))
    if not parts:
        return empty_findings()
    return pl.concat(parts, how="diagonal_relaxed")


def _changed_incidents(lake: str | os.PathLike[str], marks: Mapping[str, wm.HostMark], hosts: Sequence[str],
                       incidents: pl.DataFrame, corrupt: list[Corrupt], horizon: datetime) -> pl.DataFrame:
    """``incidents`` without the rows that repeat the latest stored row of the same incident
    (an open incident no window joined since the last sweep): the table gets a row per change.
    A stored open incident of a carried segment that the step no longer raises (its windows
    joined an earlier incident) gets a ``superseded`` row, so it does not stay open."""
    if "incidents" not in lake_mod.tables(lake):
        return incidents
    parts = []
    for h in hosts:
        since = marks[h].open_since if h in marks else None
        if since is not None:  # only incidents of a carried (open) segment can have rows already
            parts.append(lake_mod.read(lake, "incidents", start=since, hosts=[h], on_corrupt="skip", report=corrupt))
    have = pl.concat([p for p in parts if p.height], how="diagonal_relaxed") if any(p.height for p in parts) else None
    if have is None:
        return incidents
    latest = latest_incidents(have)
    gone = latest.filter(pl.col("state") == "open").join(incidents.select("incident_id"), on="incident_id",
                                                         how="anti")
    key = ["incident_id", "state", "end", "n_windows"]
    out = incidents.join(latest.select(*key).with_columns(pl.col("end").cast(TS)), on=key, how="anti",
                         nulls_equal=True)
    if gone.height:
        gone = gone.select([c for c in INCIDENT_SCHEMA if c in gone.columns]).with_columns(
            pl.lit("superseded").alias("state"), pl.lit(horizon).cast(TS).alias("updated"))
        out = (pl.concat([out, gone], how="diagonal_relaxed").select(list(INCIDENT_SCHEMA))
               .cast(pl.Schema(INCIDENT_SCHEMA)))
    return out


#: under the lake's state directory: each host's features files of the last chunk that
#: committed it (history and judged windows) and its facts changes file, and
#: ``manifest.json`` (host -> the chunk's end and its files; the window and history they
#: were computed with). The next chunk of a host reads its history there instead of
#: re-reading the ``features`` table (a live one-minute cycle otherwise re-read the hour of
#: every host), and only the facts written since (otherwise every snapshot the agent ever
#: wrote, ~540 rows a minute per host: a read that grew with the lake's age)
FEATURES_CACHE = "features-cache"


def _cache_key(cfg: SweepConfig) -> dict[str, Any]:
    a = cfg.analytics
    return {"window_s": a.window.length_s, "stride_s": a.window.stride_s, "history_s": a.history.total_seconds()}


def _parts(v: Any) -> list[Part] | None:
    """A manifest entry's features files: one name (a single file, as the cache kept before
    deltas), or ``[name, lo, hi]`` each (:data:`jobs.telemetry.Part`); None when malformed."""
    if isinstance(v, str):
        return [(v, None, None)]
    if not isinstance(v, list) or not v:
        return None
    out: list[Part] = []
    for p in v:
        if not (isinstance(p, list) and len(p) == 3 and isinstance(p[0], str)
                and all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in p[1:])):
            return None
        out.append((p[0], p[1], p[2]))
    return out


def _cache_entries(d: Path, cfg: SweepConfig) -> dict[str, tuple[datetime, list[Part], str | None]]:
    """The cache manifest's host entries (chunk end, features files, facts file or None)
    when it was kept with ``cfg``'s window and history, else none (unreadable, another
    configuration); a malformed entry is left out."""
    try:
        doc = json.loads((d / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("key") != _cache_key(cfg) or not isinstance(doc.get("hosts"), dict):
        return {}
    out: dict[str, tuple[datetime, list[Part], str | None]] = {}
    for h, v in doc["hosts"].items():
        if isinstance(v, list) and len(v) in (2, 3) and isinstance(v[0], str) and (parts := _parts(v[1])) is not None:
            try:
                end = utc(datetime.fromisoformat(v[0]))
            except ValueError:
                continue
            out[h] = (end, parts, v[2] if len(v) == 3 and isinstance(v[2], str) else None)
    return out


def _cached_history(lake: str | os.PathLike[str], cfg: SweepConfig, s: datetime
                    ) -> dict[str, tuple[tuple[Part, ...], str | None]]:
    """host -> its features files, and facts changes file (None: none kept), of the
    committed chunk that ended at ``s`` (this chunk's start), when they were kept with the
    same window and history; nothing else is trusted."""
    d = wm.state_dir(lake) / FEATURES_CACHE
    out: dict[str, tuple[tuple[Part, ...], str | None]] = {}
    for h, (end, parts, facts) in _cache_entries(d, cfg).items():
        if end == utc(s) and all((d / name).is_file() for name, _, _ in parts):
            out[h] = (tuple((str(d / name), lo, hi) for name, lo, hi in parts),
                      str(d / facts) if facts is not None and (d / facts).is_file() else None)
    return out


def _keep_features(lake: str | os.PathLike[str], cfg: SweepConfig, kept: Path, e: datetime) -> None:
    """After the commit: the chunk's host files (moved to ``kept`` before the seal) become
    the hosts' cached history and facts. Files first, then the manifest: a crash between
    the two leaves entries whose end no chunk starts at (ignored).

    Entries that ended ``history`` or more before ``e`` (a host that left the fleet, or
    lags by more than its history) are dropped, and files no entry names are deleted
    after the manifest: the cache holds about the fleet's current hosts, not every host
    it ever saw (such a host's next chunk reads the ``features`` table)."""
    d = wm.state_dir(lake) / FEATURES_CACHE
    hosts: dict[str, list[Any]] = {h: [v[0].isoformat(), [list(p) for p in v[1]], v[2]]
                                   for h, v in _cache_entries(d, cfg).items() if v[0] > e - cfg.analytics.history}
    names = json.loads((kept / "hosts.json").read_text(encoding="utf-8"))
    for h, (feats, facts) in names.items():
        parts = _parts(feats) or []
        for name in (*(p[0] for p in parts), facts):
            if name is not None and (kept / name).is_file():  # (a kept base is here already)
                os.replace(kept / name, d / name)
        hosts[h] = [e.isoformat(), [list(p) for p in parts], facts]
    wm.write_json_atomic(d / "manifest.json", {"key": _cache_key(cfg), "hosts": hosts})
    shutil.rmtree(kept, ignore_errors=True)
    named = {name for v in hosts.values() for name in (*(p[0] for p in v[1]), v[2]) if name is not None}
    for f in d.glob("*.arrow"):
        if f.name not in named:
            f.unlink(missing_ok=True)


def process_chunk(lake: str | os.PathLike[str], cfg: SweepConfig, kb: KnowledgeBase, hosts: Sequence[str],
                  s: datetime, e: datetime, marks: Mapping[str, wm.HostMark], hook: wm.PublishHook | None,
                  queue_path: Path | None = None,
                  history_known: dict[str, datetime] | None = None, engine: Engine | None = None
                  ) -> tuple[ChunkSummary, dict[str, wm.HostMark], list[Corrupt]]:
    """Analyse, stage, seal and publish one chunk; returns its summary and the new marks.
    ``history_known`` caches each host's first telemetry time (warm-up); filled here.
    ``engine``: runs the per-host features and the blocks of analysis steps (None: here)."""
    # (one host's features are not worth a pickle round trip to a worker)
    per_host = engine if engine is not None and len(hosts) > 1 else SerialEngine()
    lake_p = lake_mod.as_root(lake)
    a = cfg.analytics
    sid = sweep_id(s, e, hosts)
    first = s - timedelta(seconds=a.window.length_s) + US  # the first window ending after s
    parts: list[HostFeatures] = []
    staged = wm.StagedSweep(lake, sid)
    scratch = staged.dir / "host-features"  # (not in the staged lake: never published)
    known = first_times(lake, hosts, history_known)
    if has_data(lake, first, e, hosts):  # nothing to score: skip the (history) read
        # map: each host's features alone (raw rows of one host at a time), written to a
        # file of its own and its judged windows to the staged features table; the steps
        # then read batches of hosts from those files: no process holds the fleet's windows
        lake_mod.makedirs(scratch, durable=False)
        cached = _cached_history(lake, cfg, s)
        jobs = [HostChunk(str(lake), h, first, e, a.history, a.window, scratch=str(scratch), stage=str(staged.root),
                          previous=cached[h][0] if h in cached else None,
                          previous_facts=(ff, s) if h in cached and (ff := cached[h][1]) is not None else None,
                          data_since=known.get(h))
                for h in hosts]
        parts = [p for got in per_host.map(batch_features, batches(jobs, per_host.workers)) for p in got]
        loaded = joined(parts)
        staged.files += [f for p in parts for f in p.staged]
    else:
        loaded = Loaded({}, None)
    found: list[Corrupt] = []
    prior = _read_open_findings(lake_p, marks, hosts, s, found)
    out = sweep_step(loaded, cfg, kb, since=first, until=e, hosts=hosts, history_known=known, horizon=e,
                     prior=prior, engine=engine, scratch=staged.dir, stage=staged.root)
    staged.files += out.staged
    windows = sum(p.windows for p in parts)
    corrupt = [*out.corrupt, *found]
    incidents, open_since = out.incidents, out.open_since
    incidents = _changed_incidents(lake_p, marks, hosts, incidents, corrupt, e)
    remediations = pl.DataFrame()
    raised = incidents.filter(pl.col("state") != "superseded")
    if cfg.queue_remediations and raised.height:
        # open incidents too: a proposal is due as soon as the fault has persisted
        remediations = new_remediation_rows(
            lake_p, queue_remediations(lake, raised, loaded.files.facts_of(raised[HOST].unique().to_list())
                                       if loaded.files is not None else loaded.facts, kb, queue_path, now=e), corrupt)
    if out.scores.height:  # (the features are staged: host_features wrote each host's own columns)
        staged.write("scores", with_time(out.scores))
    if out.findings.height:
        staged.write("findings", with_time(out.findings))
    if incidents.height:
        staged.write("incidents", incidents.select(pl.col("start").alias(schema.TIME), pl.all()))
    if remediations.height:
        staged.write("remediations", remediations)
    # the hosts' files become their cached history once the chunk commits (out of the
    # staging directory, which the commit removes; a crash leaves only a stray directory)
    cache = wm.state_dir(lake) / FEATURES_CACHE
    for stray in cache.glob("pending-*") if cache.is_dir() else ():
        shutil.rmtree(stray, ignore_errors=True)
    kept = None
    written = [p for p in parts if p.path is not None]
    if written:
        kept = cache / f"pending-{sid}"
        lake_mod.makedirs(kept, durable=False)
        for path in (Path(f) for p in written for f in (p.path, p.facts_path) if f is not None):
            os.replace(path, kept / path.name)
        # (a host's base stays in the cache, where the manifest names it)
        wm.write_json_atomic(kept / "hosts.json", {
            p.host: [[[Path(f).name, lo, hi] for f, lo, hi in p.parts],
                     None if p.facts_path is None else Path(p.facts_path).name] for p in written})
    shutil.rmtree(scratch, ignore_errors=True)  # (the proposals read the hosts' facts files)
    wm.checkpoint("before_seal")
    new = {h: wm.HostMark(e, open_since.get(h), known.get(h)) for h in hosts}
    summary = ChunkSummary(sid, s, e, list(hosts), windows, out.findings.height, remediations.height,
                           frozenset(raised["incident_id"].to_list()))
    staged.seal(new, {"start": s.isoformat(), "end": e.isoformat(), "windows": summary.windows,
                      "findings": summary.findings, "incidents": summary.incidents})
    wm.checkpoint("after_seal")
    wm.publish(lake, sid, hook)
    if kept is not None:
        _keep_features(lake, cfg, kept, e)
    log.info("sweep %s: %s..%s %d host(s): %d windows, %d findings, %d incidents, %d remediations", sid,
             s.isoformat(), e.isoformat(), len(hosts), summary.windows, summary.findings, summary.incidents,
             summary.remediations)
    return summary, new, merge_corrupt([], corrupt)


def initial_marks(lake: str | os.PathLike[str], cfg: SweepConfig, hosts: Sequence[str],
                  marks: Mapping[str, wm.HostMark],
                  known: dict[str, datetime] | None = None) -> dict[str, wm.HostMark]:
    """Committed marks plus a starting mark for every host never swept. ``known``: the
    hosts' first telemetry times (:func:`first_times`' cache: filled here, not read twice)."""
    out = dict(marks)
    stride = cfg.analytics.window.stride_s
    for h in hosts:
        if h in out:
            continue
        t0 = cfg.start_at if cfg.start_at is not None else first_times(lake, [h], known).get(h)
        if t0 is not None:
            out[h] = wm.HostMark(floor_grid(t0, stride))
    return out


def _chunks_left(marks: Mapping[str, wm.HostMark], horizon: datetime, chunk: timedelta) -> int:
    behind = [m.watermark for m in marks.values() if m.watermark < horizon]
    if not behind:
        return 0
    return max(1, math.ceil((horizon - min(behind)) / chunk))


#: lake -> host -> its first telemetry time, kept between the cycles of one process (the
#: live scheduler's one-minute cycles would otherwise read every host's first files again)
_FIRST_TIMES: dict[str, dict[str, datetime]] = {}


def run_cycle(lake: str | os.PathLike[str], cfg: SweepConfig | None = None, *, now: datetime | None = None,
              until: datetime | None = None, hosts: Sequence[str] | None = None,
              progress: bool | None = None, queue_path: Path | None = None,
              should_stop: Callable[[], bool] | None = None, engine: Engine | None = None) -> CycleSummary | None:
    """One scheduler cycle (see the module doc). Returns None when another process holds the
    lake's scheduler lock (this cycle is skipped, with a log line). ``should_stop`` is asked
    between chunks (SIGTERM during a long catch-up stops after the current chunk).
    ``engine``: where each chunk's parallel work runs (:func:`process_chunk`)."""
    cfg = cfg or SweepConfig()
    lake_p = lake_mod.as_root(lake)
    if objstore.is_url(lake_p):  # (its state: a directory of this machine's, lake_mod.state_root)
        if not lake_mod.exists(lake_p):
            raise ValueError(f"lake {lake_p}: its bucket does not exist or is not reachable")
        lake_mod.makedirs(lake_mod.state_root(lake_p), durable=False)
    elif not Path(lake_p).is_dir():
        raise ValueError(f"lake {lake_p} does not exist or is not a directory")
    with wm.scheduler_lock(lake_p) as got:
        if not got:
            log.warning("another scheduler holds %s; skipping this cycle",
                        wm.state_dir(lake_p) / wm.LOCK)
            return None
        wm.checkpoint("after_lock")
        wm.claim(lake_p)
        kb = load_kb(cfg.kb_path) if cfg.kb_path else load_kb()
        hook = WriteBack(cfg.influx)
        summary = CycleSummary()
        try:
            summary.recovered = wm.recover(lake_p, hook)
            stride = cfg.analytics.window.stride_s
            wanted = list(hosts) if hosts is not None else fleet_hosts(lake_p)
            # (a host's first telemetry time never moves later: kept for the process's next
            # cycles, and with the hosts' marks for the next process)
            known_first = _FIRST_TIMES.setdefault(str(lake_p if isinstance(lake_p, str) else lake_p.resolve()), {})
            committed = wm.load(lake_p)
            for h, m in committed.items():
                if m.first is not None:
                    known_first.setdefault(h, m.first)
            marks = initial_marks(lake_p, cfg, wanted, committed, known_first)
            marks = {h: m for h, m in marks.items() if h in wanted}
            live = utc(now or datetime.now(UTC)) - cfg.lag
            horizon = floor_grid(live, stride)
            if cfg.analysis_step is not None:
                # whole analysis steps only, so each step is judged once on all its data (as a
                # backfill judges it). Except where every host started inside the current step
                # (a new fleet's first seconds, inside its warm-up): its data so far is processed.
                # Not wherever no host is behind the step's start: with steps longer than the
                # cadence, every cycle would then judge the step a cycle's piece at a time
                whole = floor_grid(live, cfg.analysis_step.total_seconds())
                firsts = first_times(lake_p, list(marks), known_first) if marks else {}
                if any(m.watermark < whole or firsts.get(h, m.watermark) < whole for h, m in marks.items()):
                    horizon = whole
            if until is not None:
                horizon = min(horizon, utc(until))
            horizon = floor_grid(horizon, stride)
            summary.horizon = horizon
            total = _chunks_left(marks, horizon, cfg.chunk)
            if cfg.max_chunks is not None:
                total = min(total, cfg.max_chunks)
            with Progress(total, "sweep", unit="chunks", enabled=progress) as bar:
                for group, s, e in _plan(marks, horizon, cfg.chunk):
                    if cfg.max_chunks is not None and len(summary.chunks) >= cfg.max_chunks:
                        summary.caught_up = False
                        log.info("max_chunks=%d reached: the rest of the backlog waits for the next cycle",
                                 cfg.max_chunks)
                        break
                    if should_stop is not None and should_stop():
                        summary.caught_up = False
                        break
                    e = _past_gap(lake_p, cfg, marks, group, s, e, horizon)
                    chunk, new, corrupt = process_chunk(lake_p, cfg, kb, group, s, e, marks, hook, queue_path,
                                                        known_first, engine)
                    marks.update(new)
                    summary.chunks.append(chunk)
                    merge_corrupt(summary.corrupt, corrupt)
                    bar.advance(detail=f"{e.isoformat()} {len(group)} host(s)")
            if cfg.auto_remediate:
                auto_remediate(lake_p, queue_path, cfg.remediation_root)
            summary.verifications = conclude_due_verifications(lake_p, queue_path, now or datetime.now(UTC),
                                                            cfg.remediation_root)
            try:
                summary.remediation_rows = export_remediations(
                    lake_p, queue_path, mirror=lambda df: hook.write_rows("remediations", df))
            except (lake_mod.LakeError, OSError) as exc:  # the next cycle exports what is still missing
                log.error("exporting the remediation queue to the lake failed: %s", exc)
            summary.influx_points = hook.points
        finally:
            hook.close()
        return summary


def _past_gap(lake: str | Path, cfg: SweepConfig, marks: Mapping[str, wm.HostMark], group: Sequence[str],
              s: datetime, e: datetime, horizon: datetime) -> datetime:
    """The end of the chunk ``[s, e)`` of ``group``: ``e``, or further when the hosts have no
    telemetry from ``s`` on and nothing open. A lake whose data is months old (a simulation,
    an import) would otherwise be caught up one empty chunk at a time, thousands of sweeps
    that each commit nothing but their watermarks; the gap is one chunk instead, up to their
    next partition with data, the horizon or another host's watermark (hosts at the same
    watermark stay together)."""
    if any(marks[h].open_since is not None for h in group):
        return e  # an open incident is judged chunk by chunk as it closes
    first = s - timedelta(seconds=cfg.analytics.window.length_s) + US
    if has_data(lake, first, e, group):
        return e
    nxt = next_data(lake, e, group)
    others = [m.watermark for h, m in marks.items() if h not in group and s < m.watermark < horizon]
    limit = min([horizon, *others])
    end = limit if nxt is None else min(limit, floor_grid(nxt, cfg.analytics.window.stride_s))
    return max(e, end)


def _plan(marks: dict[str, wm.HostMark], horizon: datetime,
          chunk: timedelta) -> Iterator[tuple[list[str], datetime, datetime]]:
    """Chunks in time order: the hosts furthest behind first, up to the next host's mark,
    so hosts at the same watermark are analysed together (cohort references need peers).
    ``marks`` is read afresh after each yield (the caller updates it)."""
    while True:
        behind = {h: m.watermark for h, m in marks.items() if m.watermark < horizon}
        if not behind:
            return
        s = min(behind.values())
        group = sorted(h for h, w in behind.items() if w == s)
        e = min([s + chunk, horizon, *[w for w in behind.values() if w > s]])
        yield group, s, e


#: the tables a sweep writes: on object storage, the ones its maintenance compacts
SWEEP_TABLES = ("features", "scores", "findings", "incidents", "remediations")


def maintain(lake: str | os.PathLike[str], cfg: SweepConfig) -> dict[str, Any]:
    """Compaction of every table, then retention per configured table.

    On object storage (no lock: each host partition has one writer) only the tables the
    sweep writes are compacted, for every host, and retention is left to the bucket's
    lifecycle rules (docs/lake.md): the agents compact their own telemetry."""
    out: dict[str, Any] = {}
    root = lake_mod.as_root(lake)
    remote = objstore.is_url(root)
    if remote:
        stats = lake_mod.CompactionStats()
        have = lake_mod.tables(root)
        for t in (t for t in SWEEP_TABLES if t in have):
            got = lake_mod.compact(root, t, hosts=lake_mod.hosts(root, t))
            stats.merges += got.merges
            stats.files_before += got.files_before
            stats.files_after += got.files_after
    else:
        stats = lake_mod.compact(root)
    out["compaction"] = {"merges": stats.merges, "files_before": stats.files_before, "files_after": stats.files_after}
    removed = {}
    for table, keep in cfg.retention.items():
        if remote:
            log.warning("retention of %s on %s: not applied on object storage (use a bucket lifecycle rule)",
                        table, root)
        elif table in lake_mod.tables(root):
            removed[table] = lake_mod.retention(root, table, keep=keep)
    out["retention"] = removed
    log.info("maintenance: %s", out)
    return out
