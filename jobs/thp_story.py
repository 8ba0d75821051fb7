"""The research's story, for real on this host: lose huge pages, detect, fix, verify, recover.

    sudo .venv/bin/python -m jobs.thp_story [--lake DIR] [--healthy 40] [--degraded 60] [--recovery 40]

1. A memory-heavy workload (random gathers over MADV_HUGEPAGE buffers it keeps recycling,
   :mod:`jobs.workloads`) runs and reports its throughput; the agent samples the host.
2. Injection: transparent huge pages are switched to ``never``.
3. Detection: the analytics re-run over the run so far (a post-mortem of this host) and the
   knowledge base matches the incident to ``thp_coverage_loss``.
4. Remediation: the entry's action is queued, approved and executed by the executor (the
   curated ``thp`` script, which records the previous state first).
5. Verification: the entry's verification features, before vs after, from the lake.
6. The workload's measured throughput before, during and after.

Every THP knob is restored at the end, whatever happened. A THP mode change only affects
new faults; this workload keeps allocating, so its memory regains huge pages within
``buffers x recycle`` seconds. (Measured here: khugepaged did not collapse memory that was
madvised while THP was off; ``process_madvise(MADV_COLLAPSE)`` — the thp script's
``collapse_pid`` — does, in seconds.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

log = logging.getLogger(__name__)

THP = Path("/sys/kernel/mm/transparent_hugepage")
KNOBS = ("enabled", "defrag")
HOST = "thp-story"


def _read_mode(name: str) -> str:
    text = (THP / name).read_text()
    return text[text.index("[") + 1 : text.index("]")]


@dataclass
class StoryResult:
    lake: Path
    original: dict[str, str]
    throughput: dict[str, float] = field(default_factory=dict)
    coverage: dict[str, float] = field(default_factory=dict)
    incident: dict[str, Any] | None = None
    action: dict[str, Any] | None = None
    effect: dict[str, Any] | None = None
    restored: bool = False
    steps: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(
            self.incident
            and self.incident.get("entry_id") == "thp_coverage_loss"
            and self.effect
            and self.effect.get("verdict") == "improved"
            and self.restored
        )

    def text(self) -> str:
        lines = [f"THP story on this host (lake {self.lake})"]
        lines += [f"  {s}" for s in self.steps]
        t = self.throughput
        if {"healthy", "degraded", "recovered"} <= t.keys():
            loss = 1 - t["degraded"] / t["healthy"]
            rec = t["recovered"] / t["healthy"]
            lines.append(
                f"  throughput (gathers/s): healthy {t['healthy']:.3g}, THP off {t['degraded']:.3g} "
                f"({100 * loss:+.1f} % loss), after the fix {t['recovered']:.3g} ({100 * rec:.1f} % of healthy)"
            )
        if self.coverage:
            lines.append(
                "  workload huge-page share: "
                + ", ".join(f"{k} {100 * v:.0f} %" for k, v in self.coverage.items())
            )
        lines.append(f"  THP knobs restored to {self.original}: {'yes' if self.restored else 'NO'}")
        lines.append(f"  result: {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)


class _Workload:
    """The gather workload as a child process; its JSON lines collected by a thread."""

    def __init__(self, seconds: float, mib: int) -> None:
        self.records: list[dict[str, float]] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.workloads", "--seconds", str(seconds), "--mib", str(mib),
             "--buffers", "8", "--recycle", "1.0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.records.append(json.loads(line))
            except ValueError:
                continue

    def between(self, t0: float, t1: float) -> list[dict[str, float]]:
        return [r for r in self.records if t0 <= r["t"] < t1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._thread.join(5)


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if s else float("nan")


def run_story(lake: Path, *, healthy_s: float = 40, degraded_s: float = 60, recovery_s: float = 40,
              mib: int = 1024) -> StoryResult:
    from ingest import lake as lake_mod
    from ingest.agent import Agent, AgentConfig
    from ingest.lake import LakeSink
    from jobs.config import SweepConfig
    from jobs.postmortem import postmortem
    from jobs.remediations import queue_remediations
    from knowledge_base import load_kb
    from remediation.executor import Executor, ExecutorConfig
    from remediation.queue import Queue, default_path
    from remediation.verify import verify_action

    if os.geteuid() != 0 or not os.access(THP / "enabled", os.W_OK):
        raise PermissionError(f"the THP story changes {THP}/enabled: run it as root")
    original = {k: _read_mode(k) for k in KNOBS}
    result = StoryResult(lake=lake, original=original)
    agent = Agent(
        AgentConfig(
            lake=lake, host=HOST, interval_s=0.1, flush_interval_s=2.0, compact_every_s=0,
            collectors=("cpu", "memory", "vmstat", "numa", "pressure", "hostfacts"),
            tiers={"hostfacts": "slow"},  # see the mode flip within 10 s, not a minute
        ),
        [LakeSink(lake)],
    )
    agent_thread = threading.Thread(target=agent.run, name="unveil-agent", daemon=True)
    total = healthy_s + degraded_s + recovery_s + 120
    work: _Workload | None = None
    try:
        if original["enabled"] == "never":
            raise RuntimeError("THP is already off on this host: nothing to lose; set it to madvise or always first")
        agent_thread.start()
        work = _Workload(total, mib)
        t_start = time.time()
        time.sleep(healthy_s)
        t_inject = time.time()
        (THP / "enabled").write_text("never")
        result.steps.append(f"injected: {THP}/enabled = never (was {original['enabled']})")
        time.sleep(degraded_s)
        t_detect = time.time()
        agent.sync()

        start = datetime.fromtimestamp(t_start, UTC)
        end = datetime.fromtimestamp(t_detect, UTC)
        pm = postmortem(lake, [HOST], start, end, SweepConfig(), peers=False, progress=False)
        inc = pm.incidents.filter(pl.col("entry_id") == "thp_coverage_loss").sort("start")
        result.steps.append(
            f"detected: {pm.findings} anomalous windows, {pm.incidents.height} incident(s): "
            + ", ".join(f"{r['entry_id'] or 'unmatched'}" for r in pm.incidents.iter_rows(named=True))
        )
        if inc.is_empty():
            return result
        row = inc.row(0, named=True)
        result.incident = {k: row[k] for k in ("incident_id", "entry_id", "start", "end", "confidence")}

        facts = lake_mod.read(lake, "host_facts")
        kb = load_kb()
        queued = queue_remediations(lake, inc.head(1), facts, kb)
        if queued.is_empty():
            result.steps.append("remediation: nothing queued (see the log)")
            return result
        action_id = int(queued["action_id"][0])
        with Queue(default_path(lake)) as q:
            q.approve(action_id, by="thp-story")
            ex = Executor(q, ExecutorConfig(root="/"))
            dry = ex.dry_run(action_id, actor="thp-story")
            result.steps.append(f"dry run: {' '.join(dry.argv)}")
            t_fix = time.time()
            act = ex.execute(action_id, actor="thp-story")
            result.steps.append(
                f"remediated: action {action_id} ({act.script_id} {act.params}) -> {act.state}; "
                f"THP enabled is now {_read_mode('enabled')}"
            )
            time.sleep(recovery_s)
            agent.sync()
            t_end = time.time()
            # verification: the entry's features over the degraded minutes vs the minutes after
            before = _features(lake, t_inject + degraded_s / 3, t_fix)
            after = _features(lake, t_fix + recovery_s / 3, t_end)
            if act.state == "verifying":
                result.effect = verify_action(ex, action_id, before, after, actor="thp-story")
                result.steps.append(f"verified: {result.effect.get('verdict')}")
            result.action = {"id": action_id, "state": q.get(action_id).state, "params": act.params}

        # throughput, each phase once the memory had turned over
        settle = 10.0
        phases = {
            "healthy": (t_start + settle, t_inject),
            "degraded": (t_inject + settle, t_fix),
            "recovered": (t_fix + settle, t_end),
        }
        for name, (a, b) in phases.items():
            recs = work.between(a, b)
            result.throughput[name] = _median([r["gathers_per_s"] for r in recs])
            shares = [r["anon_huge_share"] for r in recs if r.get("anon_huge_share") is not None]
            result.coverage[name] = _median(shares)
        _write_workload(lake, work.records)
        return result
    finally:
        if work is not None:
            work.stop()
        agent.stop()
        agent_thread.join(30)
        for k, v in original.items():
            try:
                (THP / k).write_text(v)
            except OSError as exc:
                log.error("could not restore %s/%s to %s: %s", THP, k, v, exc)
        result.restored = all(_read_mode(k) == v for k, v in original.items())


def _features(lake: Path, t0: float, t1: float) -> pl.DataFrame:
    from analytics.pipeline import AnalyticsConfig, analyze_lake

    start = datetime.fromtimestamp(t0, UTC)
    end = datetime.fromtimestamp(t1, UTC)
    res = analyze_lake(lake, start - timedelta(seconds=3), end, [HOST], AnalyticsConfig(reference="self"))
    return res.features.filter(pl.col("window_start") >= start)


def _write_workload(lake: Path, records: list[dict[str, float]]) -> None:
    from ingest.lake import write_table

    if not records:
        return
    df = pl.DataFrame(
        {
            "time": [datetime.fromtimestamp(r["t"], UTC) for r in records],
            "host": HOST,
            "workload": "gather",
            "unit": "gathers",
            "throughput": [r["gathers_per_s"] for r in records],
            "phase": "",
        }
    )
    write_table(lake, "workload", df)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lake", type=Path, help="lake directory (default: a new temp dir)")
    ap.add_argument("--healthy", type=float, default=40)
    ap.add_argument("--degraded", type=float, default=60)
    ap.add_argument("--recovery", type=float, default=40)
    ap.add_argument("--mib", type=int, default=1024, help="workload memory")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    lake = args.lake or Path(tempfile.mkdtemp(prefix="unveil-thp-")) / "lake"
    res = run_story(lake, healthy_s=args.healthy, degraded_s=args.degraded, recovery_s=args.recovery, mib=args.mib)
    print(res.text())
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
