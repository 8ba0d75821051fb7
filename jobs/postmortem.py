"""Post-mortems: the sweep step re-run over a past interval of some hosts (from the lake,
or from InfluxDB when the lake lacks it) into a lake of its own under
``<lake>/_postmortem/<id>/`` (features, scores, findings, closed incidents, the facts and
labels of the interval), written atomically. For a lake on object storage that directory
is under the lake's state directory (:func:`ingest.lake.state_root`)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from ingest import lake as lake_mod
from ingest import schema
from ingest.influx import InfluxConfig
from jobs import watermarks as wm
from jobs.config import SweepConfig
from jobs.grid import US, floor_grid, stamp, utc
from jobs.progress import Progress
from jobs.step import step_incidents, sweep_step, with_time
from jobs.telemetry import Corrupt, first_times, has_data, load_influx, load_lake, merge_corrupt
from knowledge_base import INCIDENT_SCHEMA, load_kb
from knowledge_base.detector import empty_findings

HOST = schema.HOST

POSTMORTEM_DIR = "_postmortem"
_ID_RE = re.compile(r"[^A-Za-z0-9_.-]+")
# An id names one directory under <lake>/_postmortem/, never a path: ASCII letters, digits,
# '_', '.', '-', starting with a letter or digit (so no '/', '..', hidden '.tmp-'/'.old-'
# names or option-like '-x').
_PM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


@dataclass
class PostmortemResult:
    pm_id: str
    path: Path  # a lake of its own: features, scores, findings, incidents
    hosts: list[str]
    start: datetime
    end: datetime
    source: str  # "lake" | "influxdb"
    windows: int = 0
    findings: int = 0
    incidents: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=INCIDENT_SCHEMA))
    corrupt: list[Corrupt] = field(default_factory=list)  # files skipped, one entry each


def postmortem_id(hosts: Sequence[str], start: datetime, end: datetime, label: str | None = None) -> str:
    base = f"pm-{label}" if label else f"pm-{'+'.join(sorted(hosts))}-{stamp(start)}-{stamp(end)}"
    return _ID_RE.sub("_", base)[:200]


def postmortem_dir(lake: str | os.PathLike[str], pm_id: str) -> Path:
    """``<lake>/_postmortem/<pm_id>`` (``<state>/_postmortem/<pm_id>`` for a lake on object
    storage), after checking the id against a strict pattern and that the directory
    (symlinks resolved) lies inside the lake (its state directory). Touches nothing."""
    local = lake_mod.state_root(lake)
    if not isinstance(pm_id, str) or not _PM_ID.fullmatch(pm_id):
        raise ValueError(f"bad post-mortem id {pm_id!r}: 1-200 of A-Z a-z 0-9 _ . - starting with a letter or "
                         f"digit (it names a directory under {local / POSTMORTEM_DIR})")
    root = local.resolve()
    final = local / POSTMORTEM_DIR / pm_id
    for p in (final.parent, final):  # a symlinked _postmortem/ or <id> must not lead out
        real = p.resolve()
        if not real.is_relative_to(root):
            raise ValueError(f"post-mortem id {pm_id!r}: {p} resolves to {real}, outside the lake {root}")
    return final


def label_interval(lake: str | os.PathLike[str], label_id: str,
                   margin: timedelta) -> tuple[str, datetime, datetime]:
    """(host, start - margin, end + margin) of a row of the ``labels`` table."""
    if "labels" not in lake_mod.tables(lake):
        raise ValueError(f"lake {lake} has no labels table: use --host/--from/--to")
    df = lake_mod.read(lake, "labels").filter(pl.col("label_id") == label_id)
    if df.is_empty():
        known = lake_mod.read(lake, "labels", columns=["label_id"])["label_id"].unique().sort().head(10).to_list()
        raise ValueError(f"no label {label_id!r} in {lake}/labels (some ids: {', '.join(map(str, known))})")
    row = df.sort(schema.TIME).row(0, named=True)
    end = row["end"] or row[schema.TIME]
    return str(row[HOST]), utc(row[schema.TIME]) - margin, utc(end) + margin


def postmortem(lake: str | os.PathLike[str], hosts: Sequence[str], start: datetime, end: datetime,
               cfg: SweepConfig | None = None, *, pm_id: str | None = None, influx: InfluxConfig | None = None,
               peers: bool = True, progress: bool | None = None) -> PostmortemResult:
    """Re-run the analytics over [start, end) for ``hosts`` (with the other hosts of the lake
    as cohort peers when ``peers``), from the lake, or from InfluxDB when the lake holds no
    telemetry of those hosts there. Writes ``<lake>/_postmortem/<id>/`` (for a lake on
    object storage, under its state directory) atomically (replacing an earlier run of the
    same id)."""
    cfg = cfg or SweepConfig()
    lake_p = lake_mod.as_root(lake)
    start, end = utc(start), utc(end)
    if start >= end:
        raise ValueError(f"empty interval: {start.isoformat()} is not before {end.isoformat()}")
    if not hosts:
        raise ValueError("postmortem: give at least one host")
    pid = pm_id if pm_id is not None else postmortem_id(hosts, start, end)
    final = postmortem_dir(lake_p, pid)  # before any filesystem operation
    results = final.parent
    a = cfg.analytics
    length = timedelta(seconds=a.window.length_s)
    source = "lake"
    if not (lake_mod.exists(lake_p) and has_data(lake_p, start, end, hosts)):
        if influx is None:
            raise ValueError(f"the lake {lake_p} holds no telemetry of {', '.join(hosts)} in "
                             f"[{start.isoformat()}, {end.isoformat()}) and no InfluxDB URL was given (--influx-url)")
        source = "influxdb"
    kb = load_kb(cfg.kb_path) if cfg.kb_path else load_kb()
    load_hosts = None if peers and source == "lake" else list(hosts)
    # chunks take windows ending in (s, e]: the first full window starts on the first grid
    # point at or after `start` and ends L later, so the first s is one stride before that end
    stride = timedelta(seconds=a.window.stride_s)
    grid0 = floor_grid(start + stride - US, a.window.stride_s) + length - stride
    bounds = []
    t = grid0
    while t < end:
        bounds.append((t, min(t + cfg.chunk, end)))
        t += cfg.chunk
    tmp = results / f".tmp-{pid}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    # each chunk's features and scores go to disk at once (days of windows do not fit in
    # memory); only the findings are kept to build the incidents at the end
    finds: list[pl.DataFrame] = []
    corrupt: list[Corrupt] = []
    known = first_times(lake_p, load_hosts) if source == "lake" else {}
    windows = 0
    facts: pl.DataFrame | None = None
    with Progress(len(bounds), f"post-mortem {', '.join(hosts)}", unit="chunks", enabled=progress) as bar:
        for s, e in bounds:
            lo = s - length + US - a.history
            loaded = (load_lake(lake_p, lo, e, load_hosts) if source == "lake"
                      else load_influx(influx, lo, e, load_hosts))  # type: ignore[arg-type]
            out = sweep_step(loaded, cfg, kb, since=s - length + US, until=e, hosts=hosts,
                             history_known=known, incidents=False)
            if facts is None and loaded.facts is not None:
                facts = loaded.facts.filter(pl.col(HOST).is_in(list(hosts)))
            if out.features.height:
                lake_mod.write_table(tmp, "features", with_time(out.features))
                windows += out.features.height
            if out.scores.height:
                lake_mod.write_table(tmp, "scores", with_time(out.scores))
            if out.findings.height:
                finds.append(out.findings)
            merge_corrupt(corrupt, out.corrupt)
            bar.advance(detail=e.isoformat())
    findings = pl.concat(finds, how="diagonal_relaxed") if finds else empty_findings()
    incidents, _ = step_incidents(findings, kb, cfg, horizon=None)
    if findings.height:
        lake_mod.write_table(tmp, "findings", with_time(findings))
    if incidents.height:
        lake_mod.write_table(tmp, "incidents", incidents.select(pl.col("start").alias(schema.TIME), pl.all()))
    # facts and ground truth of the interval travel along: the post-mortem lake stands alone
    if facts is not None and facts.height:
        lake_mod.write_table(tmp, "host_facts", facts, partition_by_hour=False)
    if source == "lake" and "labels" in lake_mod.tables(lake_p):
        found: list[Corrupt] = []
        labels = lake_mod.read(lake_p, "labels", end=end, hosts=hosts, on_corrupt="skip", report=found)
        merge_corrupt(corrupt, found)
        labels = labels.filter(pl.col("end").is_null() | (pl.col("end") > start))
        if labels.height:
            lake_mod.write_table(tmp, "labels", labels, partition_by_hour=False)
    wm.write_json_atomic(tmp / "_postmortem.json", {
        "id": pid, "hosts": list(hosts), "start": start.isoformat(), "end": end.isoformat(), "source": source,
        "windows": windows, "findings": findings.height, "incidents": incidents.height,
        "corrupt": [{"path": str(e.path), "reason": e.reason} for e in corrupt], "created": datetime.now(UTC).isoformat(),
    })
    if final.exists():  # replace an earlier run: old moved aside, new renamed in, old removed
        old = results / f".old-{pid}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return PostmortemResult(pid, final, list(hosts), start, end, source, windows, findings.height,
                            incidents, corrupt)
