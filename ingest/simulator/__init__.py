"""A simulated fleet of 8-GPU ML hosts with labelled silent inefficiencies.

Writes telemetry through the same schema and sinks as the real agent (lake, InfluxDB),
plus ground truth: ``labels`` (injected inefficiencies) and ``workload`` (throughput).
Entry points: :func:`simulate` (into sinks), :func:`simulate_frames` (in memory),
:func:`load_scenario` / :func:`resolve_scenario` (TOML files), ``unveil simulate``.
See docs/simulator.md.
"""

from __future__ import annotations

from ingest.simulator.injections import INEFFICIENCIES, TYPES, Injection
from ingest.simulator.run import SimResult, plan_host, simulate, simulate_frames
from ingest.simulator.scenario import HostPlan, Scenario, ScenarioError, from_dict, named
from ingest.simulator.scenario import load as load_scenario
from ingest.simulator.scenario import resolve as resolve_scenario

__all__ = [
    "INEFFICIENCIES",
    "TYPES",
    "HostPlan",
    "Injection",
    "Scenario",
    "ScenarioError",
    "SimResult",
    "from_dict",
    "load_scenario",
    "named",
    "plan_host",
    "resolve_scenario",
    "simulate",
    "simulate_frames",
]
