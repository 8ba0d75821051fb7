"""Scenario files (TOML): a reproducible, shareable description of a simulated run.

::

    name = "power_throttle"          # optional, default: the file name
    seed = 7
    start = "2026-01-05T08:00:00Z"   # UTC; whole seconds
    duration = "1h"                   # s, m, h, d (or a number of seconds)
    perf = false                      # also write the perf table (most clouds expose no PMU)

    hosts = 4                         # a count of hosts named sim-00, sim-01 ...
    workload = "llm_serving"          # for counted hosts: llm_serving | training | idle | mixed

    # ... or an explicit list instead of the count:
    [[hosts]]
    name = "gpu-a01"
    workload = "training"
    params = { step_s = 1.2 }         # workload parameters (step_s, checkpoint_every_s,
                                      # eval_every_s, request_rate)

    [[injections]]
    type = "gpu_power_throttle"       # see ingest.simulator.injections.TYPES
    hosts = ["gpu-a01"]               # or host = "gpu-a01", or hosts = "all"
    devices = ["3"]                   # optional; default per type
    start = "10m"                     # offset from the run start, or an ISO time
    duration = "20m"                  # or "run": to the end of the run (with start = 0: from boot)
    severity = 0.6                    # (0, 1]
    params = { limit_w = 450 }        # optional, per type

Counter artefacts use the same list: ``type = "counter_wrap"`` (or ``counter_reset``) with
``params = { table = "net", field = "rx_bytes", series = "ens1np0", bits = 32 }``.
Every error names the file and the key.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from ingest import schema
from ingest.durations import duration_seconds, is_duration
from ingest.simulator.injections import TYPES, Injection
from ingest.simulator.workloads import WORKLOADS

DEFAULT_START = datetime(2026, 1, 5, 8, 0, 0, tzinfo=UTC)
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ScenarioError(ValueError):
    """A scenario file or value is invalid; the message names the file and the key."""


def parse_duration_s(value: object, where: str) -> float:
    if isinstance(value, str):
        try:
            return duration_seconds(value)
        except ValueError as exc:
            raise ScenarioError(f"{where}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where}: expected a duration like '90s', '10m', '1h30m', got {value!r}")
    if not value > 0:
        raise ScenarioError(f"{where}: must be positive, got {value!r}")
    return float(value)


def parse_start(value: object, where: str) -> datetime:
    if isinstance(value, datetime):
        ts = value
    elif isinstance(value, str):
        text = value.strip()
        text = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
        try:
            ts = datetime.fromisoformat(text)
        except ValueError:
            raise ScenarioError(f"{where}: expected an ISO-8601 time like '2026-01-05T08:00:00Z', got {value!r}") from None
    else:
        raise ScenarioError(f"{where}: expected an ISO-8601 time, got {value!r}")
    ts = ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    return ts.replace(microsecond=0)


@dataclass(frozen=True)
class HostPlan:
    name: str
    workload: str = "llm_serving"
    params: dict[str, float] = field(default_factory=dict, compare=False)
    cpus_per_node: int = 16
    nics: int = 8
    nic_queues: int = 4
    gpu_model: str = "h100_sxm"
    gpu_temp_spread: bool = False
    baseline_drops: float = 0.0
    smooth_throttle: bool = False


#: Host options a scenario may set at the top level (every host) or per ``[[hosts]]`` table,
#: with the defaults that keep the uniform host of earlier versions (docs/simulator.md).
HOST_OPTIONS: dict[str, object] = {
    "cpus_per_node": 16, "nics": 8, "nic_queues": 4, "gpu_model": "h100_sxm",
    "gpu_temp_spread": False, "baseline_drops": 0.0, "smooth_throttle": False,
}

#: ``profile = "realistic"``: benign diversity on (sources in docs/simulator.md); explicit
#: keys still override it. GPU models stay as given: a mixed fleet is its own choice.
PROFILES: dict[str, dict[str, object]] = {
    "uniform": {},
    "realistic": {"cpus_per_node": 56, "nic_queues": 16, "gpu_temp_spread": True, "baseline_drops": 1e-6,
                  "smooth_throttle": True},
}


@dataclass(frozen=True)
class Scenario:
    name: str = "healthy"
    seed: int = 0
    start: datetime = DEFAULT_START
    duration_s: float = 3600.0
    hosts: tuple[HostPlan, ...] = (HostPlan("sim-00"),)
    injections: tuple[Injection, ...] = ()
    perf: bool = False
    hosts_counted: bool = True  # hosts came from a count (so --hosts may change it)
    workload: str = "llm_serving"
    host_options: dict[str, object] = field(default_factory=dict, compare=False)  # top-level host options

    def with_overrides(self, *, hosts: int | None = None, duration_s: float | None = None,
                       seed: int | None = None, start: datetime | None = None) -> Scenario:
        out = self
        if hosts is not None:
            if hosts < 1:
                raise ScenarioError(f"hosts: must be >= 1, got {hosts}")
            if not self.hosts_counted:
                raise ScenarioError(f"scenario {self.name!r} lists its hosts by name; --hosts cannot change them")
            out = replace(out, hosts=counted_hosts(hosts, self.workload, self.host_options))
        if duration_s is not None:
            out = replace(out, duration_s=check_duration(duration_s, "duration"))
        if seed is not None:
            out = replace(out, seed=int(seed))
        if start is not None:
            out = replace(out, start=parse_start(start, "start"))
        names = {h.name for h in out.hosts}
        kept = tuple(i for i in out.injections if i.host in names and i.start_s < out.duration_s)
        return replace(out, injections=kept)


def check_duration(secs: float, where: str) -> float:
    if secs <= 0 or abs(secs - round(secs)) > 1e-9:
        raise ScenarioError(f"{where}: must be a positive whole number of seconds, got {secs:g} s")
    return float(round(secs))


def counted_hosts(n: int, workload: str, options: dict[str, object] | None = None) -> tuple[HostPlan, ...]:
    kinds = ("llm_serving", "training")
    return tuple(
        HostPlan(f"sim-{i:02d}", kinds[i % 2] if workload == "mixed" else workload, **_host_opts(options or {}, i))
        for i in range(n)
    )


def _host_opts(options: dict[str, object], i: int) -> dict[str, Any]:
    """The host options of the fleet's i-th host: a list value (``gpu_model``) cycles."""
    return {k: (v[i % len(v)] if isinstance(v, list) else v) for k, v in options.items()}


def _check_option(key: str, v: object, where: str) -> object:
    from ingest.simulator.topology import GPU_MODELS

    def num(lo: float, hi: float, integer: bool) -> object:
        ok = isinstance(v, int) if integer else isinstance(v, int | float)
        if isinstance(v, bool) or not ok or not lo <= float(v) <= hi:  # type: ignore[arg-type]
            kind = "an integer" if integer else "a number"
            raise ScenarioError(f"{where}: expected {kind} {lo:g}..{hi:g}, got {v!r}")
        return v

    if key == "cpus_per_node":
        return num(4, 128, True)
    if key == "nics":
        if v not in (4, 8) or isinstance(v, bool):
            raise ScenarioError(f"{where}: expected 4 or 8, got {v!r}")
        return v
    if key == "nic_queues":
        return num(1, 128, True)
    if key == "baseline_drops":
        return float(num(0.0, 1e-3, False))  # type: ignore[arg-type]
    if key in ("gpu_temp_spread", "smooth_throttle"):
        if not isinstance(v, bool):
            raise ScenarioError(f"{where}: expected true or false, got {v!r}")
        return v
    if key == "gpu_model":
        if v not in GPU_MODELS:
            raise ScenarioError(f"{where}: unknown GPU model {v!r}; known: {', '.join(GPU_MODELS)}")
        return v
    raise AssertionError(key)


def _top_options(doc: dict[str, Any], w: Any) -> dict[str, object]:
    prof = doc.get("profile", "uniform")
    if prof not in PROFILES:
        raise ScenarioError(f"{w('profile')}: unknown profile {prof!r}; known: {', '.join(PROFILES)}")
    out: dict[str, object] = dict(PROFILES[prof])
    for key in HOST_OPTIONS:
        if key not in doc:
            continue
        v = doc[key]
        if key == "gpu_model" and isinstance(v, list):
            if not v:
                raise ScenarioError(f"{w(key)}: expected a model or a non-empty list of models")
            out[key] = [_check_option(key, x, w(f"{key}[{j}]")) for j, x in enumerate(v)]
        else:
            out[key] = _check_option(key, v, w(key))
    return out


_TOP = {"name", "seed", "start", "duration", "perf", "hosts", "workload", "injections", "description", "profile",
        *HOST_OPTIONS}
_HOST_KEYS = {"name", "workload", "params", *HOST_OPTIONS}
_INJ_KEYS = {"type", "host", "hosts", "devices", "start", "duration", "severity", "params"}


def _unknown(d: dict[str, Any], allowed: set[str], where: str, *, top: bool = False) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        key = f"{where}: {extra[0]}" if top else f"{where}.{extra[0]}"
        raise ScenarioError(f"{key}: unknown key; allowed: {', '.join(sorted(allowed))}")


def _workload(v: object, where: str, allow_mixed: bool) -> str:
    ok = list(WORKLOADS) + (["mixed"] if allow_mixed else [])
    if not isinstance(v, str) or v not in ok:
        raise ScenarioError(f"{where}: unknown workload {v!r}; expected one of {', '.join(ok)}")
    return v


def from_dict(doc: dict[str, Any], *, source: str = "<scenario>", name: str | None = None) -> Scenario:
    """Validate a parsed scenario document; errors name ``source`` and the key."""
    w = lambda key: f"{source}: {key}"  # noqa: E731
    _unknown(doc, _TOP, source, top=True)
    seed = doc.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ScenarioError(f"{w('seed')}: expected a non-negative integer, got {seed!r}")
    start = parse_start(doc.get("start", DEFAULT_START), w("start"))
    duration = check_duration(parse_duration_s(doc.get("duration", "1h"), w("duration")), w("duration"))
    perf = doc.get("perf", False)
    if not isinstance(perf, bool):
        raise ScenarioError(f"{w('perf')}: expected true or false, got {perf!r}")
    workload = _workload(doc.get("workload", "llm_serving"), w("workload"), True)
    options = _top_options(doc, w)
    hosts_v = doc.get("hosts", 1)
    counted = True
    if isinstance(hosts_v, bool):
        raise ScenarioError(f"{w('hosts')}: expected a count or a list of host tables, got {hosts_v!r}")
    if isinstance(hosts_v, int):
        if hosts_v < 1:
            raise ScenarioError(f"{w('hosts')}: must be >= 1, got {hosts_v}")
        hosts = counted_hosts(hosts_v, workload, options)
    elif isinstance(hosts_v, list) and hosts_v:
        counted = False
        plans = []
        for i, hd in enumerate(hosts_v):
            where = w(f"hosts[{i}]")
            if not isinstance(hd, dict):
                raise ScenarioError(f"{where}: expected a table, got {hd!r}")
            _unknown(hd, _HOST_KEYS, where)
            hname = hd.get("name", f"sim-{i:02d}")
            if not isinstance(hname, str) or not _HOST_RE.match(hname):
                raise ScenarioError(f"{where}.name: invalid host name {hname!r} (letters, digits, '_', '.', '-')")
            params = hd.get("params", {})
            if not isinstance(params, dict) or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                                       for v in params.values()):
                raise ScenarioError(f"{where}.params: expected a table of numbers, got {params!r}")
            allowed_p = {"step_s", "checkpoint_every_s", "eval_every_s", "request_rate"}
            bad = sorted(set(params) - allowed_p)
            if bad:
                raise ScenarioError(f"{where}.params: unknown key(s) {', '.join(bad)}; allowed: {', '.join(sorted(allowed_p))}")
            opts = _host_opts(options, i)
            for key in HOST_OPTIONS:
                if key in hd:
                    opts[key] = _check_option(key, hd[key], f"{where}.{key}")
            plans.append(HostPlan(hname, _workload(hd.get("workload", workload), f"{where}.workload", False),
                                  {k: float(v) for k, v in params.items()}, **opts))
        names = [p.name for p in plans]
        dup = sorted({x for x in names if names.count(x) > 1})
        if dup:
            raise ScenarioError(f"{w('hosts')}: duplicate host name(s) {', '.join(dup)}")
        hosts = tuple(plans)
    else:
        raise ScenarioError(f"{w('hosts')}: expected a count or a non-empty list of host tables, got {hosts_v!r}")
    names = [h.name for h in hosts]
    injections: list[Injection] = []
    inj_v = doc.get("injections", [])
    if not isinstance(inj_v, list):
        raise ScenarioError(f"{w('injections')}: expected an array of tables ([[injections]])")
    for i, d in enumerate(inj_v):
        where = w(f"injections[{i}]")
        if not isinstance(d, dict):
            raise ScenarioError(f"{where}: expected a table, got {d!r}")
        _unknown(d, _INJ_KEYS, where)
        typ = d.get("type")
        if typ not in TYPES:
            raise ScenarioError(f"{where}.type: unknown injection type {typ!r}; known: {', '.join(TYPES)}")
        if "host" in d and "hosts" in d:
            raise ScenarioError(f"{where}: give 'host' or 'hosts', not both")
        hv = d.get("hosts", d.get("host", "all"))
        key = "hosts" if "hosts" in d else "host"
        if hv == "all":
            targets = names
        elif isinstance(hv, str):
            targets = [hv]
        elif isinstance(hv, list) and all(isinstance(x, str) for x in hv) and hv:
            targets = hv
        else:
            raise ScenarioError(f"{where}.{key}: expected a host name, a list of names or 'all', got {hv!r}")
        for t in targets:
            if t not in names and counted and t.startswith("sim-"):
                continue  # a counted fleet may be shrunk by --hosts
            if t not in names:
                raise ScenarioError(f"{where}.{key}: unknown host {t!r}; hosts: {', '.join(names)}")
        if "start" not in d:
            raise ScenarioError(f"{where}.start: missing (an offset like '10m' or an ISO time)")
        sv = d["start"]
        if isinstance(sv, datetime) or (isinstance(sv, str) and not is_duration(sv)):
            start_s = (parse_start(sv, f"{where}.start") - start).total_seconds()
            if start_s < 0:
                raise ScenarioError(f"{where}.start: {sv!r} is before the run start {start.isoformat()}")
        elif sv == 0:
            start_s = 0.0
        else:
            start_s = parse_duration_s(sv, f"{where}.start")
        if start_s >= duration:
            raise ScenarioError(f"{where}.start: {sv!r} is not before the end of the run ({duration:g} s)")
        if "duration" not in d:
            raise ScenarioError(f"{where}.duration: missing (e.g. '20m', or 'run' for the rest of the run)")
        # "run": until the end of the run, however long (--duration) it is made
        dur = math.inf if d["duration"] == "run" else parse_duration_s(d["duration"], f"{where}.duration")
        sev = d.get("severity", 0.5)
        if isinstance(sev, bool) or not isinstance(sev, int | float) or not 0 < sev <= 1:
            raise ScenarioError(f"{where}.severity: expected a number in (0, 1], got {sev!r}")
        devices = d.get("devices", [])
        if isinstance(devices, str):
            devices = [devices]
        if not isinstance(devices, list) or not all(isinstance(x, str | int) and not isinstance(x, bool)
                                                    for x in devices):
            raise ScenarioError(f"{where}.devices: expected a list of device names, got {devices!r}")
        params = d.get("params", {})
        if not isinstance(params, dict):
            raise ScenarioError(f"{where}.params: expected a table, got {params!r}")
        if typ in ("counter_wrap", "counter_reset"):
            _check_counter_params(params, f"{where}.params")
        for t in targets:
            injections.append(Injection(str(typ), t, float(start_s), float(dur), float(sev),
                                        tuple(str(x) for x in devices), dict(params)))
    sc = Scenario(name or str(doc.get("name", "scenario")), seed, start, duration, hosts, (), perf, counted, workload,
                  options)
    sc = replace(sc, injections=tuple(injections))
    return sc


def _check_counter_params(p: dict[str, Any], where: str) -> None:
    table = p.get("table")
    if table not in schema.MEASUREMENTS or not schema.get(str(table)).counters:
        raise ScenarioError(f"{where}.table: expected a table with counters, got {table!r}")
    fld = p.get("field")
    if fld not in schema.get(str(table)).counters:
        raise ScenarioError(f"{where}.field: {fld!r} is not a counter of {table!r}; "
                            f"counters: {', '.join(schema.get(str(table)).counters)}")
    if not isinstance(p.get("series", ""), str):
        raise ScenarioError(f"{where}.series: expected the series' tag value as text (\"\" for host-wide tables)")
    if p.get("bits", 64) not in (32, 64):
        raise ScenarioError(f"{where}.bits: expected 32 or 64, got {p.get('bits')!r}")


def load(path: str | Path) -> Scenario:
    """Load and validate a scenario file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {p}: {exc.strerror or exc}") from exc
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{p}: invalid TOML: {exc}") from exc
    return from_dict(doc, source=str(p), name=doc.get("name") or p.stem)


def named() -> list[str]:
    """Names of the scenarios shipped with the package."""
    d = resources.files("ingest.simulator") / "scenarios"
    return sorted(f.name[:-5] for f in d.iterdir() if f.name.endswith(".toml"))


def resolve(ref: str) -> Scenario:
    """A scenario by file path or by the name of a shipped one."""
    p = Path(ref)
    if p.suffix == ".toml" or p.exists():
        return load(p)
    if ref in named():
        d = resources.files("ingest.simulator") / "scenarios" / f"{ref}.toml"
        with resources.as_file(d) as f:
            return load(f)
    raise ScenarioError(f"no scenario file {ref!r} and no shipped scenario of that name; shipped: {', '.join(named())}")
