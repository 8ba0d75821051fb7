"""Record the knowledge-base test fixture: features, findings and host facts of a short
simulated run (4 hosts, 4 min; sim-01 power-throttled from 1m30 for 2 min), reduced to the
feature families the knowledge base reads, so the matcher tests replay real pipeline output.

    .venv/bin/python tests/data/knowledge_base/record.py
"""

from __future__ import annotations

from pathlib import Path

from analytics.catalog import split_feature
from analytics.features import compute_features
from analytics.pipeline import AnalyticsConfig, analyze
from ingest.simulator import from_dict, simulate_frames
from knowledge_base import load_kb

HERE = Path(__file__).parent


def main() -> None:
    doc = {"seed": 3, "duration": "4m", "hosts": 4, "workload": "llm_serving",
           "injections": [{"type": "gpu_power_throttle", "host": "sim-01", "start": "90s", "duration": "2m",
                           "severity": 0.6, "devices": ["3", "5"]}]}
    frames, _ = simulate_frames(from_dict(doc, name="kb-fixture"))
    facts = frames.pop("host_facts")
    labels = frames.pop("labels")
    frames.pop("workload", None)
    feats = compute_features({k: v.lazy() for k, v in frames.items()}, host_facts=facts)
    res = analyze({}, AnalyticsConfig(), host_facts=facts, features=feats)
    kb = load_kb()
    fams = {f for e in kb for s in e.signals if s.fact is None for f in (s.family, s.gate.feature if s.gate else s.family)}
    keep = ["host", "window_start", "window_end"] + [c for c in feats.columns if split_feature(c)[0] in fams]
    feats.select(keep).write_parquet(HERE / "features.parquet", compression="zstd")
    res.findings.write_parquet(HERE / "findings.parquet", compression="zstd")
    facts.write_parquet(HERE / "host_facts.parquet", compression="zstd")
    labels.write_parquet(HERE / "labels.parquet", compression="zstd")


if __name__ == "__main__":
    main()
