"""The sweep step: telemetry, configuration and knowledge base in; features, scores,
findings (matched), matches and incidents out. The scheduler's cycle, ``unveil sweep``,
post-mortems and ``unveil eval`` all judge windows through :func:`sweep_step`, so they
report the same verdict on the same data.

The step reports the windows starting at or after ``since`` and ending at or before
``until`` (a scheduler chunk ``(s, e]`` of window ends is ``since = s - L + 1us``,
``until = e``); windows before ``since`` are reference only (history):

* analytics scores them (:func:`analytics.pipeline.analyze`: statistical detectors
  against the host's history and its cohort) — in clock-aligned analysis steps when
  ``SweepConfig.analysis_step`` is set: the windows ending in a step ``[b, b')`` are
  judged on the windows of ``[b - history, b')`` only, and the signature matcher judges
  each against the host's own past, so the verdict does not depend on how a sweep cuts
  time into chunks (features are computed once and cut per step);
* the knowledge base runs as a *signature detector* on every window and the final verdict
  is taken (:func:`knowledge_base.detector.detect`: statistical flags out of warm-up, or a
  signature match; findings carry the rank-1 match in ``MATCH_COLUMNS``);
* findings (with those of a still-open segment carried from earlier steps) are grouped
  into incidents (:func:`incidents_of`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from threadpoolctl import threadpool_limits

from analytics.catalog import lookup
from analytics.evaluation import DetectHook
from analytics.features import compute_features, feature_columns
from analytics.pipeline import (
    BEHAVIOUR_FAMILIES,
    AnalysisResult,
    AnalyticsConfig,
    CohortReference,
    Reference,
    analyze,
    batched_cohorts,
    cohort_inputs,
    cohort_members,
    cohort_references,
    cohort_samples,
    fit,
    frame_cohorts,
    gpu_names,
    matcher_sample,
    score,
)
from ingest import lake as lake_mod
from ingest import schema
from jobs.config import SweepConfig
from jobs.engine import Engine, SerialEngine
from jobs.grid import US, floor_grid, steps
from jobs.telemetry import Corrupt, HostFiles, Loaded, first_times
from knowledge_base import INCIDENT_SCHEMA, build_incidents
from knowledge_base.detector import MATCH_COLUMNS, Detection, data_starts, detect, empty_findings
from knowledge_base.loader import KnowledgeBase
from knowledge_base.matcher import MATCH_SCHEMA, MatchConfig, cohort_peers, reference_columns

log = logging.getLogger(__name__)

HOST, WS, WE = schema.HOST, "window_start", "window_end"
TS = schema.TIME_DTYPE


@dataclass
class StepResult:
    features: pl.DataFrame  # the reported windows (empty from ``Loaded.files``: the scheduler staged them)
    scores: pl.DataFrame  # with one detector="kb" row per window when the signature detector is on
    findings: pl.DataFrame  # knowledge_base.detector.FINDINGS_OUT_SCHEMA (the MATCH_COLUMNS included)
    corrupt: list[Corrupt] = field(default_factory=list)  # files skipped, one entry each
    suppressed: int = 0  # statistical findings dropped by the warm-up
    signature: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=MATCH_SCHEMA))
    incidents: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=INCIDENT_SCHEMA))
    open_since: dict[str, datetime] = field(default_factory=dict)  # host -> start of its still-open segment
    staged: list[str] = field(default_factory=list)  # scores files written under ``stage`` (relative to it)

    @property
    def matches(self) -> pl.DataFrame:
        """The matched rows (MATCH_SCHEMA) of the findings: rank 1 and the entries also matched."""
        return matches_of(self.findings)


def with_time(df: pl.DataFrame) -> pl.DataFrame:
    """A downstream table as the lake wants it: ``time`` (= window_start) first."""
    return df.select(pl.col(WS).alias(schema.TIME), pl.all())


def sweep_step(loaded: Loaded, cfg: SweepConfig, kb: KnowledgeBase, *, since: datetime | None,
               until: datetime | None = None, hosts: Sequence[str] | None = None,
               history_known: Mapping[str, datetime] | None = None, result: AnalysisResult | None = None,
               frame_start: datetime | None = None, signature: pl.DataFrame | None = None,
               incidents: bool = True, horizon: datetime | None = None,
               prior: pl.DataFrame | None = None, engine: Engine | None = None,
               scratch: Path | None = None, stage: Path | None = None) -> StepResult:
    """Judge the windows starting at or after ``since`` (None: all) and ending at or before
    ``until`` (None: no bound) of ``hosts`` (None: all); see the module doc.

    ``loaded`` must start at or before ``since - history`` (its ``frames``, or its
    precomputed ``features`` or their ``files``, are analysed, its ``facts`` serve the
    detectors and matcher). An analysis step judges its hosts in batches of
    ``cfg.batch_hosts`` (:func:`_one_step`). ``history_known``: host -> its first
    telemetry time in the lake (warm-up of hosts whose start is not loaded).

    ``result``: the analysis of these windows, already done (the evaluation analyses once
    per detector combination); ``loaded.frames`` is then not read and ``frame_start`` says
    when its telemetry was read from (None: the hosts' whole data). ``signature``: the
    signature detector's matches over these windows, when already computed.

    Incidents (unless ``incidents`` is False) are built from ``prior`` (findings of a
    segment still open from earlier steps) and the step's findings: with ``horizon=None``
    every incident is closed (a finished interval), else segments that may still grow
    are open (:func:`incidents_of`).

    ``engine``: runs the analysis steps in blocks, up to two per worker, a block every m-th
    step (the steps are independent: each reads its own history), when there are several steps and workers
    and no ``analytics.refit`` (whose epochs span steps); one step (the live scheduler's
    one-minute cycle) goes to the workers as slices of its hosts (:func:`_split_step`);
    None: here. The blocks read the
    features from one Arrow IPC file written to ``scratch`` (a directory every worker can
    read: the scheduler passes its staging directory in the lake; None: the system's temp
    directory), memory-mapped, and send back scores (unless ``stage``) and findings: the parent holds one
    copy of the features, not one per block and its pickle.

    ``stage``: a staged lake root (the scheduler's, jobs.watermarks.StagedSweep) where the
    analysis steps write their scores themselves, returning the files in ``staged`` and no
    score rows: a block's scores (~60 k rows per host-hour) are not pickled back and held
    by the command (at 256 hosts × 30 min: 3.8 M rows, ~1 GiB at the end of the sweep)."""
    # one BLAS thread: a step's matrices are small (a few hundred features), and BLAS
    # threads spinning on them cost more CPU than they save (measured: Mahalanobis scoring
    # 8.7 -> 0.2 CPU-s in a 30-step sweep of 8 hosts on the loaded 2-core VM); sweeps run
    # in parallel as processes instead
    with threadpool_limits(limits=1, user_api="blas"):
        return _sweep_step(loaded, cfg, kb, since=since, until=until, hosts=hosts, history_known=history_known,
                           result=result, frame_start=frame_start, signature=signature, incidents=incidents,
                           horizon=horizon, prior=prior, engine=engine, scratch=scratch, stage=stage)


def _sweep_step(loaded: Loaded, cfg: SweepConfig, kb: KnowledgeBase, *, since: datetime | None,
                until: datetime | None, hosts: Sequence[str] | None, history_known: Mapping[str, datetime] | None,
                result: AnalysisResult | None, frame_start: datetime | None, signature: pl.DataFrame | None,
                incidents: bool, horizon: datetime | None, prior: pl.DataFrame | None,
                engine: Engine | None, scratch: Path | None, stage: Path | None) -> StepResult:
    a = cfg.analytics
    step = None if result is not None else cfg.analysis_step
    keep = _keep(since, until, hosts)
    if result is not None:
        out = _judged(detect(result, loaded.facts, kb, cfg.detection, keep=keep, frame_start=frame_start,
                             history_known=history_known, signature=signature), loaded.corrupt)
    elif not loaded.frames and loaded.files is None and (loaded.features is None or loaded.features.is_empty()):
        out = StepResult(pl.DataFrame(), pl.DataFrame(), empty_findings(), loaded.corrupt)
    elif step is None or since is None or until is None:
        read = None if since is None else since - a.history
        # (per chunk, not in steps: every host's windows at once)
        facts = loaded.files.facts_of(None) if loaded.files is not None else loaded.facts
        res = analyze(loaded.frames, a, host_facts=facts, score_since=since,
                      features=loaded.files.rows(None) if loaded.files is not None else loaded.features)
        out = _judged(detect(res, facts, kb, cfg.detection, keep=keep, frame_start=read,
                             history_known=history_known), loaded.corrupt)
    else:
        out = _stepped(loaded, cfg, kb, since, until, hosts, step, history_known, engine, scratch, stage)
    if incidents:
        findings = out.findings
        if prior is not None and prior.height:
            findings = pl.concat([prior, findings], how="diagonal_relaxed")
        out.incidents, out.open_since = step_incidents(findings, kb, cfg, horizon=horizon)
    return out


def step_incidents(findings: pl.DataFrame, kb: KnowledgeBase, cfg: SweepConfig, *,
                   horizon: datetime | None) -> tuple[pl.DataFrame, dict[str, datetime]]:
    """:func:`incidents_of` with the sweep's settings (gap, longest incident, persistence,
    window length and stride)."""
    w = cfg.analytics.window
    return incidents_of(findings, kb, gap_s=cfg.incident_gap_s, max_len=cfg.max_incident, horizon=horizon,
                        window_length=timedelta(seconds=w.length_s), stride=timedelta(seconds=w.stride_s),
                        min_incident_s=cfg.min_incident_s, min_unmatched_s=cfg.min_unmatched_s)


def _keep(since: datetime | None, until: datetime | None, hosts: Sequence[str] | None) -> pl.Expr | None:
    parts = []
    if since is not None:
        parts.append(pl.col(WS) >= since)
    if until is not None:
        parts.append(pl.col(WE) <= until)
    if hosts is not None:
        parts.append(pl.col(HOST).is_in(list(hosts)))
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out & p
    return out


def features_of(loaded: Loaded, cfg: SweepConfig) -> pl.DataFrame:
    """The wide features of ``loaded``: precomputed (per host, the scheduler's chunks) or
    computed from its telemetry frames."""
    if loaded.features is not None:
        return loaded.features
    return compute_features(loaded.frames, cfg.analytics.window, host_facts=loaded.facts)


def _judged(det: Detection, corrupt: list[Corrupt]) -> StepResult:
    return StepResult(det.features, det.scores, det.findings, corrupt, det.suppressed, det.signature)


def _stepped(loaded: Loaded, cfg: SweepConfig, kb: KnowledgeBase, since: datetime, until: datetime,
             hosts: Sequence[str] | None, step: timedelta, history_known: Mapping[str, datetime] | None,
             engine: Engine | None, scratch: Path | None, stage: Path | None) -> StepResult:
    """The windows ending in ``(since + L - 1us, until]``, analysed step by step (module doc)."""
    a = cfg.analytics
    feats: pl.DataFrame | None = None
    src: pl.DataFrame | HostFiles
    if loaded.files is not None:  # one file per host: this process reads their keys only
        src = loaded.files
        keys = src.keys()
    else:
        feats = features_of(loaded, cfg)
        feats = src = keys = feats.with_columns(pl.col(WS).cast(TS), pl.col(WE).cast(TS))
    if keys.is_empty():
        return StepResult(pl.DataFrame(), pl.DataFrame(), empty_findings(), loaded.corrupt)
    length = timedelta(seconds=a.window.length_s)
    bounds = list(steps(since + length - US, until, step))
    workers = 1 if engine is None or a.refit is not None else engine.workers
    n = max(1, min(workers, len(bounds)))
    starts = _host_starts(keys)
    # two blocks per worker, the heaviest (most windows read) handed out first: a worker that
    # is done takes the next one. Steps read more history as a sweep moves away from the
    # start of the data, by an amount no fixed split predicts, so a block takes every m-th
    # step (not a contiguous run): its cost is then near the mean whatever the growth.
    # Contiguous blocks of 32 hosts x 30 min from their first minute cost 6.7 to 12.3 CPU-s
    # and left a worker 2.2 s idle of 21.6 (one block per worker: ~20 s of 58)
    m = min(len(bounds), 2 * n) if n > 1 else 1
    blocks = [list(range(j, len(bounds), m)) for j in range(m)]  # step indices
    keep = None if hosts is None else list(hosts)
    known = None if history_known is None else dict(history_known)
    to = None if stage is None else str(stage)
    whole = StepBlock(src, loaded.facts, kb, cfg, bounds, keep, known, starts, to)
    # a step's slices of hosts: at least half a batch each (a slice gets the keys and facts
    # of every host and reads the matcher's sample: many small slices would repeat that)
    slices = min(workers, -(-2 * keys[HOST].n_unique() // cfg.batch_hosts))
    if engine is None or workers == 1 or (len(bounds) == 1 and slices < 2):
        done = run_steps(whole)
    else:
        with contextlib.ExitStack() as stack:
            source: pl.DataFrame | str | HostFiles = src  # (the hosts' files: every worker reads them)
            if feats is not None:  # one Arrow file the workers map, not a pickled copy each
                d = stack.enter_context(tempfile.TemporaryDirectory(prefix="step-features-", dir=scratch))
                source = str(Path(d) / "features.arrow")
                feats.write_ipc(source)
            if len(bounds) == 1:  # one step (a live cycle): its batches of hosts over the workers
                done = [_split_step(whole, replace(whole, features=source), keys, engine, slices)]
            else:
                windows = _step_windows(bounds, starts, a)
                heavy = sorted(blocks, key=lambda block: -int(windows[block].sum()))
                got = engine.map(run_steps, [replace(whole, features=source, bounds=[bounds[i] for i in block])
                                             for block in heavy])
                by_step: dict[int, StepResult] = {}
                for block, rs in zip(heavy, got, strict=True):
                    by_step.update(zip(block, rs, strict=True))
                done = [by_step[i] for i in range(len(bounds))]  # (in step order)
    # the reported windows: the steps' windows together (the blocks do not send them back)
    reported = _keep(since, until, hosts)
    assert reported is not None  # (since and until are set)
    findings = _concat([o.findings for o in done])
    # (from files, the windows were written where the caller wanted them: jobs.telemetry.HostChunk.stage)
    return StepResult(feats.filter(reported) if feats is not None else pl.DataFrame(), _concat([o.scores for o in done]),
                      findings if findings.height else empty_findings(), loaded.corrupt,
                      sum(o.suppressed for o in done), staged=[f for o in done for f in o.staged])


@dataclass
class StepBlock:
    """Contiguous analysis steps of a sweep and the windows they read (plain data: a
    block runs in a worker process as well as here)."""

    features: pl.DataFrame | str | HostFiles  # the sweep's windows, an Arrow IPC file of them, or a file per host
    facts: pl.DataFrame | None
    kb: KnowledgeBase
    cfg: SweepConfig
    bounds: list[tuple[datetime, datetime]]
    hosts: list[str] | None
    history_known: dict[str, datetime] | None
    starts: dict[str, np.ndarray]  # host -> its window starts in the whole sweep (warm-up)
    stage: str | None = None  # a staged lake root: the block writes its scores there (see sweep_step)


def _step_windows(bounds: Sequence[tuple[datetime, datetime]], starts: Mapping[str, np.ndarray],
                  a: AnalyticsConfig) -> np.ndarray:
    """Per step, the windows its frame reads (its own and its history's, every host): what
    its cost grows with."""
    every = np.sort(np.concatenate(list(starts.values()))) if starts else np.zeros(0, np.int64)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    lo = [(floor_grid(b - a.history, a.window.stride_s) - epoch) // US for b, _ in bounds]
    hi = [(b2 - epoch) // US for _, b2 in bounds]
    return np.searchsorted(every, hi) - np.searchsorted(every, lo)


def _opened(job: StepBlock) -> tuple[pl.DataFrame | HostFiles, pl.DataFrame, pl.DataFrame | None]:
    """The block's windows (:func:`_features`), their keys and the hosts' facts."""
    feats = _features(job.features)
    every = feats.select(HOST, WS, WE) if isinstance(feats, pl.DataFrame) else feats.keys()
    facts = feats.facts_of(None) if isinstance(feats, HostFiles) else job.facts
    return feats, every, facts


def _features(features: pl.DataFrame | str | HostFiles) -> pl.DataFrame | HostFiles:
    """A block's windows (:attr:`StepBlock.features`): its frame, mapped when a file, or the
    hosts' files."""
    return _mapped(features) if isinstance(features, str) else features


def _stage_scores(job: StepBlock, outs: list[StepResult]) -> list[StepResult]:
    """With ``job.stage``, the results' scores written there, one write (a file per host
    and hour, not per step), the files named in the last result."""
    if job.stage is not None:
        scores = _concat([o.scores for o in outs])
        for o in outs:
            o.scores = pl.DataFrame()
        if scores.height and outs:
            root = Path(job.stage)
            outs[-1].staged = [str(Path(f).relative_to(root))
                               for f in lake_mod.write_table(root, "scores", with_time(scores))]
    return outs


def run_steps(job: StepBlock) -> list[StepResult]:
    """The block's steps, one after the other (see :func:`sweep_step`); their results carry
    no features (the caller has them)."""
    feats, every, facts = _opened(job)
    epochs: dict[datetime, Reference] = {}
    with threadpool_limits(limits=1, user_api="blas"):  # (a worker process too: see sweep_step)
        # one step at a time: a step's frames are freed before the next one's are cut
        outs = [_one_step(job, feats, every, facts, b, b2, epochs) for b, b2 in job.bounds]
    return _stage_scores(job, outs)


@dataclass
class _StepFrame:
    """One analysis step ``[b, b2)`` over the sweep's windows: what every batch of its hosts
    agrees on."""

    b: datetime
    b2: datetime
    first: datetime  # the history's first window start
    b_since: datetime  # the first window judged
    since: datetime  # the first window scored (the running medians reach back from b_since)
    keys: pl.DataFrame  # the windows of [first, b2), every host
    first_of: dict[str, int]  # host -> its first window start in the history (warm-up), µs
    hosts: list[str]  # in the order of the keys

    @property
    def in_step(self) -> pl.Expr:
        return _between(self.first, self.b2)


def _between(first: datetime, end: datetime) -> pl.Expr:
    """The windows starting at or after ``first`` and ending at or before ``end``."""
    return (pl.col(WS) >= first) & (pl.col(WE) <= end)


def _step_frame(job: StepBlock, every: pl.DataFrame, b: datetime, b2: datetime) -> _StepFrame | None:
    a = job.cfg.analytics
    length = timedelta(seconds=a.window.length_s)
    # the running medians of a step's windows reach back half of `smooth` (more at the
    # start of a host's data): the frame a step is scored on starts this far before it
    lead = 2 * max(a.smooth, timedelta(seconds=a.window.stride_s)) + length
    first = floor_grid(b - a.history, a.window.stride_s)
    keys = every.filter((pl.col(WS) >= first) & (pl.col(WE) <= b2))
    if keys.is_empty():
        return None
    b_since = b - length + US
    # first window start of each host in the history (its warm-up), as analyze sees it
    first_us = (first - datetime(1970, 1, 1, tzinfo=UTC)) // US
    first_of = {h: int(s[i]) for h, s in job.starts.items() if (i := int(np.searchsorted(s, first_us))) < s.size}
    return _StepFrame(b, b2, first, b_since, max(first, b_since - lead), keys, first_of,
                      keys[HOST].unique(maintain_order=True).to_list())


@dataclass
class StepShared:
    """What the batches of one analysis step share, formed once over all its hosts (plain
    data: the workers that judge a step's batches get it)."""

    cohort_of: dict[str, str]  # host -> behaviour cohort
    refs: dict[str, CohortReference]  # the cohorts' references (fitted on their sampled hosts' windows of the step)
    hardware: dict[str, str]  # host -> hardware cohort (the matcher's)
    matched: set[str]  # the matcher's sample
    runs: pl.DataFrame  # the hosts' data runs (warm-up)


@dataclass
class CohortBlock:
    """Some cohorts' references of an analysis step (:func:`cohort_reference`), fitted in a
    worker on their sampled hosts' windows of ``[since, b2)`` (plain data)."""

    features: pl.DataFrame | str | HostFiles  # as :attr:`StepBlock.features`
    config: AnalyticsConfig
    cohort_of: dict[str, str]  # host -> cohort, every member of the block's cohorts
    sampled: list[str]
    since: datetime  # (the windows read: [since, b2))
    b2: datetime
    b_since: datetime  # the first window judged
    first_of: dict[str, int]  # sampled host -> its first window start (warm-up), µs


def cohort_reference(job: CohortBlock) -> dict[str, CohortReference]:
    """The cohorts' references (:func:`analytics.pipeline.cohort_references` on their
    members alone: a cohort's reference reads its own sample only, and draws from its own
    generator, so it is the same fitted with any other cohorts or alone)."""
    rows = _rows(_features(job.features), job.sampled, _between(job.since, job.b2))
    with threadpool_limits(limits=1, user_api="blas"):
        return cohort_references(rows, job.config, job.cohort_of, score_since=job.b_since, first_us=job.first_of)


@dataclass
class ProfileBlock:
    """Some hosts' cohort inputs of an analysis step (:func:`profiles_of`): their windows of
    ``[first, b2)`` on ``columns`` (plain data)."""

    features: pl.DataFrame | str | HostFiles  # as :attr:`StepBlock.features`
    gpus: pl.DataFrame | None  # the facts' GPU names (:func:`analytics.pipeline.gpu_names`)
    config: AnalyticsConfig
    hosts: list[str]
    columns: list[str]
    first: datetime
    b2: datetime
    n_hosts: int  # the step's


def profiles_of(job: ProfileBlock) -> tuple[dict[str, str], pl.DataFrame | None]:
    """The hosts' hardware cohorts and behaviour profiles (:func:`analytics.pipeline.cohort_inputs`)."""
    rows = _rows(_features(job.features), job.hosts, _between(job.first, job.b2), job.columns)
    return cohort_inputs(job.config, rows, job.gpus, job.n_hosts)


def _step_shared(job: StepBlock, feats: pl.DataFrame | HostFiles, facts: pl.DataFrame | None, fr: _StepFrame,
                 batches: Sequence[Sequence[str]],
                 on: tuple[Engine, pl.DataFrame | str | HostFiles] | None = None) -> StepShared:
    """The step's shared part (:class:`StepShared`): the hosts' profiles a batch an item,
    then the cohorts' references, mapped on ``on`` (an engine and the step's windows as its
    workers read them, :attr:`StepBlock.features`; None: in this process, on ``feats``); the
    clustering, the samples and the data runs are formed here."""
    a = job.cfg.analytics
    engine, source = on if on is not None else (SerialEngine(), feats)
    # cohorts from per-host profiles, a batch at a time, on the columns they read
    cols = [c for c in (feature_columns(feats) if isinstance(feats, pl.DataFrame) else feats.columns)
            if lookup(c).family in BEHAVIOUR_FAMILIES or (lookup(c).family.startswith("gpu.") and "@" in c)]
    n = len(fr.hosts)
    gpus = gpu_names(facts)  # (what the hardware cohorts read of the facts)
    cohort_of, hardware = batched_cohorts(a, engine.map(profiles_of, [
        ProfileBlock(source, gpus, a, list(batch), cols, fr.first, fr.b2, n) for batch in batches]), n)
    # the cohorts' references, from their sampled hosts' windows of the step
    sampled = cohort_samples(fr.keys.filter(pl.col(WS) >= fr.since), a, cohort_of, score_since=fr.b_since,
                             first_us=fr.first_of)
    # a cohort an item on several workers (the largest samples first), every cohort one
    # item on one worker (one call, one read)
    groups = sorted(((hs, mine) for hs in cohort_members(cohort_of).values() if (mine := sorted(sampled.intersection(hs)))),
                    key=lambda g: -len(g[1]))  # (members, sampled members)
    if engine.workers == 1 and groups:
        groups = [([h for hs, _ in groups for h in hs], sorted(h for _, mine in groups for h in mine))]
    items = [CohortBlock(source, a, {h: cohort_of[h] for h in hs}, mine, fr.since, fr.b2, fr.b_since,
                         {h: fr.first_of[h] for h in mine if h in fr.first_of})
             for hs, mine in groups]
    refs: dict[str, CohortReference] = {}
    for got in engine.map(cohort_reference, items):
        refs.update(got)
    have = set(fr.hosts)
    hardware = {h: lab for h, lab in hardware.items() if h in have}
    runs = data_starts(fr.keys, frame_start=fr.first, history_known=job.history_known,
                       restart_gap_s=job.cfg.detection.restart_gap_s, slack=timedelta(seconds=2 * a.window.length_s))
    return StepShared(dict(cohort_of), dict(refs), hardware,
                      set(matcher_sample(hardware, cohort_of, a.cohort_sample)), runs)


def _verdicts(job: StepBlock, facts: pl.DataFrame | None, fr: _StepFrame, res: AnalysisResult,
            batch: Sequence[str] | None, runs: pl.DataFrame | None, match: MatchConfig) -> StepResult:
    # the signature matcher judges a window against the host's own past only (the
    # block's one facts frame: the matcher's facts index is built once per frame object)
    mine = job.hosts if batch is None else [h for h in batch if job.hosts is None or h in job.hosts]
    det = detect(res, facts, job.kb, job.cfg.detection, keep=_keep(fr.b_since, fr.b2, mine), frame_start=fr.first,
                 history_known=job.history_known, match_config=match, runs=runs)
    return StepResult(pl.DataFrame(), det.scores, det.findings, [], det.suppressed)


def _one_step(job: StepBlock, feats: pl.DataFrame | HostFiles, every: pl.DataFrame, facts: pl.DataFrame | None,
              b: datetime, b2: datetime, epochs: dict[datetime, Reference]) -> StepResult:
    """One analysis step. Its hosts are judged in batches of ``batch_hosts``: a batch's
    frame holds its hosts' windows of the step and its history. The cohorts, their
    samples and references (a sampled host's fitted on the other sampled hosts, once),
    and the hosts' data runs (warm-up) are formed once per step over every host
    (:func:`_step_shared`), the matcher's cohort peers once per step too, so a host's
    verdict does not depend on the batch it falls in."""
    fr = _step_frame(job, every, b, b2)
    if fr is None:
        return StepResult(pl.DataFrame(), pl.DataFrame(), empty_findings())
    a = job.cfg.analytics
    batches = _batches(fr.hosts, job.cfg.batch_hosts)
    if len(batches) == 1:
        part = _rows(feats, None, fr.in_step)
        res = _analysed(feats, part, a, fr, epochs, frame_cohorts(a, part, facts), None, fr.hosts)
        return _verdicts(job, facts, fr, res, None, None, MatchConfig(reference_before=fr.b_since,
                                                                     cohort_sample=a.cohort_sample))
    return _judge_batches(job, feats, facts, fr, _step_shared(job, feats, facts, fr, batches), batches, epochs)


def _batches(hosts: Sequence[str], size: int) -> list[list[str]]:
    return [list(hosts[i:i + size]) for i in range(0, len(hosts), size)]


def _judge_batches(job: StepBlock, feats: pl.DataFrame | HostFiles, facts: pl.DataFrame | None, fr: _StepFrame,
                   shared: StepShared, batches: Sequence[Sequence[str]],
                   epochs: dict[datetime, Reference]) -> StepResult:
    """The step's ``batches`` of hosts, one after the other, judged with the step's shared
    part."""
    a = job.cfg.analytics
    # the matcher's cohort references, from its sample's history, once for the step: a
    # batch's frame then holds its own hosts (and the cohorts' recent windows), not the
    # sample's history again (256 hosts: 16 of every batch's 48 hosts with history)
    ref_cols = reference_columns(feats.columns, job.kb)
    matched = shared.matched
    match = MatchConfig(reference_before=fr.b_since, cohort_sample=a.cohort_sample, sampled=frozenset(matched),
                        peers=cohort_peers(_rows(feats, sorted(matched), fr.in_step, ref_cols), shared.hardware,
                                           job.kb) if matched else None)
    outs = []
    for batch in batches:
        # (the sampled hosts' references come fitted with the shared part: a batch reads
        # its own hosts only)
        part = _rows(feats, sorted(batch), fr.in_step)
        res = _analysed(feats, part, a, fr, epochs, shared.cohort_of, shared.refs, batch)
        # a batch's frame goes before the next one is read (a name keeps it until rebound)
        del part
        outs.append(_verdicts(job, facts, fr, res, batch, shared.runs, match))
        del res
    return _merged(outs)


def _merged(outs: Sequence[StepResult]) -> StepResult:
    """Results of parts of one step (batches, slices) as one: scores, findings, suppressed
    counts and staged files together."""
    return StepResult(pl.DataFrame(), _concat([o.scores for o in outs]),
                      _concat([o.findings for o in outs]) if any(o.findings.height for o in outs) else empty_findings(),
                      [], sum(o.suppressed for o in outs), staged=[f for o in outs for f in o.staged])


@dataclass
class BatchBlock:
    """Some of the batches of one analysis step (``step.bounds``: that one step), judged
    with the step's shared part and frame as the caller formed them (``step.facts``: every
    host's facts; plain data: it runs in a worker, which then reads only its own hosts'
    files)."""

    step: StepBlock
    shared: StepShared
    frame: _StepFrame
    batches: list[list[str]]


def run_batches(job: BatchBlock) -> StepResult:
    """The block's batches (:func:`_judge_batches`), its scores staged as :func:`run_steps`
    stages a block's."""
    feats = _features(job.step.features)
    with threadpool_limits(limits=1, user_api="blas"):
        out = _judge_batches(job.step, feats, job.step.facts, job.frame, job.shared, job.batches, {})
    return _stage_scores(job.step, [out])[0]


def _split_step(here: StepBlock, there: StepBlock, every: pl.DataFrame, engine: Engine, slices: int) -> StepResult:
    """One analysis step judged by several workers: its shared part (cohorts, their
    references, samples, data runs: :func:`_step_shared`, its profiles and cohort references
    on the workers too), then its hosts in up to ``slices`` contiguous slices, one an item,
    each in batches of at most ``batch_hosts`` (:class:`BatchBlock`). A live cycle is one
    step: without this its batches ran here one after the other while the pool idled. ``here``: the step as this process reads it; ``there``: as the workers do;
    ``every``: the keys of its windows, as the caller read them."""
    feats = here.features
    assert not isinstance(feats, str)  # (this process holds the frame or the hosts' files)
    facts = feats.facts_of(None) if isinstance(feats, HostFiles) else here.facts
    (b, b2), = here.bounds
    fr = _step_frame(here, every, b, b2)
    if fr is None:
        return StepResult(pl.DataFrame(), pl.DataFrame(), empty_findings())
    shared = _step_shared(here, feats, facts, fr, _batches(fr.hosts, here.cfg.batch_hosts),
                          (engine, there.features))
    k = min(slices, len(fr.hosts))
    per = -(-len(fr.hosts) // k)
    parts = [fr.hosts[i:i + per] for i in range(0, len(fr.hosts), per)]
    sent = replace(there, facts=facts)  # (the files' facts read once, here)
    got = engine.map(run_batches, [BatchBlock(sent, _for_hosts(shared, p), fr, _batches(p, here.cfg.batch_hosts))
                                   for p in parts])
    return _merged(got)


def _for_hosts(shared: StepShared, hosts: Sequence[str]) -> StepShared:
    """The step's shared part as a worker judging ``hosts`` needs it: the cohorts'
    references with those hosts' fits only."""
    mine = set(hosts)
    return replace(shared, refs={c: r.only(mine) for c, r in shared.refs.items()})


def _mapped(path: str) -> pl.DataFrame:
    """The frame of an Arrow IPC file, memory-mapped (zero copy): the workers of one machine
    share its pages, and each step copies only its own windows."""
    with pa.memory_map(path) as src:
        table = pa.ipc.open_file(src).read_all()
    out = pl.from_arrow(table, rechunk=False)
    assert isinstance(out, pl.DataFrame)
    return out


def _rows(feats: pl.DataFrame | HostFiles, hosts: Sequence[str] | None, where: pl.Expr,
          columns: Sequence[str] | None = None) -> pl.DataFrame:
    """The windows of ``hosts`` (None: all) matching ``where`` (``columns``: only these
    feature columns), from a frame or from the hosts' files."""
    if isinstance(feats, HostFiles):
        return feats.rows(hosts, where, columns)
    if columns is not None:
        feats = feats.select(HOST, WS, WE, *[c for c in columns if c in feats.columns])
    return feats.filter(where if hosts is None else where & pl.col(HOST).is_in(list(hosts)))


def _host_starts(feats: pl.DataFrame) -> dict[str, np.ndarray]:
    """host -> its window starts (µs since the epoch), sorted."""
    ws = feats.select(HOST, pl.col(WS).dt.epoch("us").alias("_us")).sort(HOST, "_us")
    return {str(h): g["_us"].to_numpy() for (h,), g in ws.group_by([HOST], maintain_order=True)}


def _analysed(feats: pl.DataFrame | HostFiles, part: pl.DataFrame, a: AnalyticsConfig, fr: _StepFrame,
              epochs: dict[datetime, Reference], cohort_of: Mapping[str, str],
              cohort_refs: Mapping[str, CohortReference] | None, hosts: Sequence[str]) -> AnalysisResult:
    """The analysis of the windows of ``hosts`` in the step ``fr`` (they start at or after
    ``fr.b_since``; ``part`` holds the step's windows with their history and is scored from
    ``fr.since`` on; ``fr.first_of``: host -> its first window start, the warm-up): fit
    once, score many. A host's own reference (``self``)
    is that of the refit epoch ``e`` (``fr.b`` floored to ``analytics.refit`` on the clock),
    fitted on its windows of ``[e + refit - history, e)`` (the part of the history that
    every step of the epoch has loaded) and reused by every step of the epoch; a
    host with less than its warm-up (at least ``min_windows``) of windows there (a new
    host, a fleet's first epoch) is judged against ``[b - history, b2)`` instead, refitted
    every step as when ``refit`` is off. The cohort reference stays contemporaneous (the
    peers' windows of the step, :func:`analytics.pipeline.score`; ``cohort_refs``: formed
    for the step when ``part`` holds a batch of its hosts). All of it depends on the
    clock only, not on how a sweep cuts time."""
    mine = set(hosts)
    step_hosts = [h for h in part.filter(pl.col(WS) >= fr.b_since)[HOST].unique().to_list() if h in mine]
    refs: dict[str, Reference] = {}
    if "self" in a.references:
        if a.refit is not None and a.refit < a.history:  # (else no history is loaded by every step of an epoch)
            e = floor_grid(fr.b, a.refit.total_seconds())
            epoch = _epoch_reference(feats, floor_grid(e + a.refit - a.history, a.window.stride_s), e, a, epochs)
            need = max(a.min_windows, round(a.warmup.total_seconds() / a.window.stride_s))
            refs = {h: epoch for h in step_hosts if epoch.windows.get(h, 0) >= need}
        cold = [h for h in step_hosts if h not in refs]
        if cold:
            whole = len(cold) == part[HOST].n_unique()  # (every host: no copy of the history)
            now = fit(part if whole else part.filter(pl.col(HOST).is_in(cold)), a)
            refs.update({h: now for h in cold})
    frame = part.filter(pl.col(WS) >= fr.since)
    res = score(frame, a, refs, score_since=fr.b_since, first_us=fr.first_of, cohort_of=cohort_of, host_facts=None,
                cohort_refs=cohort_refs, judge=mine if cohort_refs is not None else None)
    # downstream (warm-up runs, the matcher's references) reads the whole history
    return replace(res, features=part)


#: the references of the latest refit epochs, kept between the sweeps of one process (the
#: scheduler's cycles: an epoch's references are fitted once, not at every cycle)
_FITS: OrderedDict[tuple[Any, ...], Reference] = OrderedDict()
_FITS_KEPT = 2


def _epoch_reference(feats: pl.DataFrame | HostFiles, start: datetime, e: datetime, a: AnalyticsConfig,
                     done: dict[datetime, Reference]) -> Reference:
    """The hosts' own references fitted on their windows of ``[start, e)``: from ``done``
    (this sweep's), else from :data:`_FITS` when a sweep of this process fitted the same
    windows (same epoch, config, hosts, window counts and column sums to 6 digits: a
    sweep loading from another time may differ in the last bits), else fitted."""
    if e in done:
        return done[e]
    ref = _rows(feats, None, (pl.col(WS) >= start) & (pl.col(WE) <= e))
    counts = ref.group_by(HOST).len().sort(HOST).rows()
    cols = [c for c in ref.columns if c not in (HOST, WS, WE)]
    sums = ref.select(pl.col(cols).cast(pl.Float64).sum()).row(0) if ref.height else ()
    key = (e, repr(a), tuple(ref.columns), tuple(counts), tuple(float(f"{v:.6g}") for v in sums))
    got = _FITS.get(key)
    if got is None:
        got = fit(ref, a)
        _FITS[key] = got
        while len(_FITS) > _FITS_KEPT:
            _FITS.popitem(last=False)
    else:
        _FITS.move_to_end(key)
    done[e] = got
    return got


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame()
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")


def matches_of(findings: pl.DataFrame) -> pl.DataFrame:
    """The matcher's matched rows back from findings carrying MATCH_COLUMNS: the rank-1
    match, and the entries also matched (ranks 2, 3, ... in ``also_matched``'s order;
    findings written before that column existed have none)."""
    if findings.is_empty() or "entry_id" not in findings.columns:
        return pl.DataFrame(schema=MATCH_SCHEMA)
    m = findings.filter(pl.col("entry_id").is_not_null()).with_columns(pl.col(WS).cast(TS), pl.col(WE).cast(TS))
    empty = pl.lit([], pl.List(pl.String))

    def rows(df: pl.DataFrame, rank: pl.Expr, confidence: str, devices: pl.Expr, explanation: pl.Expr) -> pl.DataFrame:
        return df.select(
            HOST, WS, WE, rank.alias("rank"), "entry_id", pl.lit(None, pl.String).alias("label_type"),
            pl.col(confidence).alias("confidence"), pl.lit(True).alias("matched"), devices.alias("devices"),
            empty.alias("matched_signals"), empty.alias("missing_signals"), empty.alias("contradicted_signals"),
            explanation.alias("explanation"),
        ).cast(MATCH_SCHEMA)  # type: ignore[arg-type]

    first = rows(m, pl.lit(1, pl.Int32), "match_confidence", pl.col("match_devices"), pl.col("match_explanation"))
    if "also_matched" not in m.columns:
        return first
    also = (m.select(HOST, WS, WE, "also_matched").filter(pl.col("also_matched").list.len() > 0)
            .with_columns(pl.int_ranges(2, pl.col("also_matched").list.len() + 2, dtype=pl.Int32).alias("rank"))
            .explode("also_matched", "rank").unnest("also_matched"))
    if also.is_empty():
        return first
    rest = rows(also, pl.col("rank"), "confidence", empty, pl.lit(None, pl.String))
    return pl.concat([first, rest]).sort(HOST, WS, "rank")


# -------------------------------------------------------------------- incidents


def segment(findings: pl.DataFrame, gap_s: float, max_len: timedelta) -> list[pl.DataFrame]:
    """Findings cut into incidents: a new one starts after a gap > ``gap_s`` or once the
    current one is ``max_len`` long (so a permanent problem is reported every max_len).
    Deterministic: the same findings always give the same cuts."""
    out: list[pl.DataFrame] = []
    gap = timedelta(seconds=gap_s)
    for _, rows in findings.sort(HOST, WS).group_by(HOST, maintain_order=True):
        starts, ends = rows[WS].to_list(), rows[WE].to_list()
        cut = 0
        seg_start, prev_end = starts[0], ends[0]
        for i in range(1, rows.height):
            if starts[i] > prev_end + gap or starts[i] - seg_start >= max_len:
                out.append(rows.slice(cut, i - cut))
                cut, seg_start = i, starts[i]
            prev_end = max(prev_end, ends[i])
        out.append(rows.slice(cut))
    return out


def incidents_of(findings: pl.DataFrame, kb: KnowledgeBase, *, gap_s: float, max_len: timedelta,
                 horizon: datetime | None, window_length: timedelta,
                 stride: timedelta, min_incident_s: float = 0.0, min_unmatched_s: float | None = None
                 ) -> tuple[pl.DataFrame, dict[str, datetime]]:
    """(incidents, host -> start of its still-open segment). With ``horizon=None`` every
    incident is closed (a post-mortem over a finished interval).

    A segment that may still grow (a later window can join it) is *open*: its matched
    incidents that have persisted are returned with ``state = 'open'`` (updated = the
    horizon), so they are visible while they last; its unmatched windows wait for the close
    (a matched span may still absorb them). Closed segments give ``state = 'closed'`` rows.
    An incident persisted when it spans at least ``min_incident_s`` (first window's start to
    last window's end) or its entry's ``min_duration_s`` when longer, an unmatched one
    ``min_unmatched_s`` (None: the same); each at most ``max_len``. A shorter one is never
    raised, open or closed."""
    rows: list[pl.DataFrame] = []
    open_since: dict[str, datetime] = {}
    if findings.is_empty():
        return pl.DataFrame(schema=INCIDENT_SCHEMA), open_since
    findings = findings.with_columns(pl.col(WS).cast(TS), pl.col(WE).cast(TS))
    gap = timedelta(seconds=gap_s)
    # (a segment is cut at max_len: one that long has persisted whatever the setting)
    unmatched_s = min_incident_s if min_unmatched_s is None else min(min_unmatched_s, max_len.total_seconds())
    # an entry may ask for longer (its own min_duration_s: symptoms healthy workloads show in bursts)
    longer = {e.id: min(e.min_duration_s, max_len.total_seconds()) for e in kb.entries
              if e.min_duration_s is not None and e.min_duration_s > min_incident_s}
    matched_s = (pl.col("entry_id").replace_strict(longer, default=min_incident_s, return_dtype=pl.Float64)
                 if longer else pl.lit(min_incident_s))
    persisted = (pl.col("end") - pl.col("start")).dt.total_microseconds() >= pl.when(
        pl.col("status") == "matched").then(matched_s * 1e6).otherwise(pl.lit(unmatched_s * 1e6))
    for seg in segment(findings, gap_s, max_len):
        host = str(seg[HOST][0])
        start, end = seg[WS].min(), seg[WE].max()
        assert isinstance(start, datetime) and isinstance(end, datetime)
        # the next window not yet scored starts at horizon - L + stride: can it still join?
        may_grow = (horizon is not None and end + gap >= horizon - window_length + stride
                    and horizon - start < max_len)
        inc = build_incidents(matches_of(seg), seg.drop([c for c in MATCH_COLUMNS if c in seg.columns]), kb,
                              max_gap_s=1e9)  # segment() already cut it: one incident per entry
        inc = inc.filter(persisted)
        if may_grow:
            open_since[host] = min(open_since.get(host, start), start)
            inc = inc.filter(pl.col("status") == "matched").with_columns(
                pl.lit("open").alias("state"), pl.lit(horizon).cast(TS).alias("updated"))
        elif horizon is not None:
            inc = inc.with_columns(pl.lit(horizon).cast(TS).alias("updated"))
        rows.append(inc)
    out = pl.concat(rows) if rows else pl.DataFrame(schema=INCIDENT_SCHEMA)
    return out.sort(HOST, "start", "incident_id"), open_since



# ------------------------------------------------------------------ evaluation


def eval_detector(kb: KnowledgeBase, cfg: SweepConfig | None = None,
                  lake: str | os.PathLike[str] | None = None) -> DetectHook:
    """The sweep step as an :data:`analytics.evaluation.DetectHook`: warm-up, the
    signature detector when the combination has it (``KB`` alone: statistical findings
    dropped), matching, and incidents as a post-mortem builds them, so ``unveil eval``
    measures what sweeps report: windows starting at or after ``score_since`` (None: all of
    ``result.features``). ``lake``: read each host's first telemetry time there."""
    from analytics.evaluation import Detected

    cfg = cfg or SweepConfig()
    label_of = {e.id: e.label_type for e in kb}
    known = first_times(lake, None) if lake is not None else None
    cache: dict[int, pl.DataFrame] = {}

    def hook(result: AnalysisResult, host_facts: pl.DataFrame | None, spec: Any, *,
             frame_start: datetime | None = None, score_since: datetime | None = None) -> Detected:
        step_cfg = replace(cfg, detection=replace(cfg.detection, signature=bool(spec.signature)))
        if not spec.statistical:
            result = replace(result, findings=result.findings.clear())
        out = sweep_step(Loaded({}, host_facts), step_cfg, kb, since=score_since, history_known=known,
                         result=result, frame_start=frame_start, signature=cache.get(id(result.features)),
                         horizon=None)
        if step_cfg.detection.signature:
            cache.clear()
            cache[id(result.features)] = out.signature
        f = out.findings
        matches = f.filter(pl.col("entry_id").is_not_null()).select(
            HOST, pl.col(WS).cast(TS),
            pl.col("entry_id").replace_strict(label_of, default=pl.col("entry_id"), return_dtype=pl.String)
            .alias("match_type"), pl.col("match_confidence").alias("confidence"))
        return Detected(f.select(HOST, pl.col(WS).cast(TS)), matches, out.incidents)

    return hook
