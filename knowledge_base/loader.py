"""Knowledge-base entries: one TOML file per known inefficiency, validated on load.

Every error names the file and the field (``gpu_power_throttle.toml: signals[2].direction:
expected 'up' or 'down', got 'sideways'``). The file format is documented in
docs/knowledge_base.md; in short::

    id = "gpu_power_throttle"            # = the file name's stem
    title = "GPU power throttling"
    label_type = "gpu_power_throttle"    # the simulator/labels type it identifies (default: id)
    explanation = "..."                  # for an operator: what it is, why it costs throughput
    impact = "..."                       # typical throughput cost
    subsystems = ["gpu"]                 # expected subsystem profile (the fingerprint's main shares)
    consequences = ["cpu"]               # optional: subsystems whose symptoms this cause also produces
    references = ["..."]

    [[preconditions]]                    # on host facts; all must hold
    fact = "gpu.count"                   # derived fact or "<category>.<key>" (knowledge_base.facts)
    op = ">="                            # == != > >= < <= in not_in exists
    value = 1
    why = "only hosts with a GPU can have a GPU power cap"

    [[signals]]                          # the signature
    feature = "gpu.power_limit_ratio"    # a catalog family (any device), or "family@device"
    direction = "down"                   # up | down: which way it moves under this inefficiency
    role = "required"                    # required | supporting | excludes
    group = "cap"                        # optional: required signals of one group are alternatives
    min_z = 3.0                          # robust z against the host's own history or its cohort
    min_change = 0.03                    # and at least this absolute change (feature units)
    value_below = 0.97                   # optional absolute bounds on the window's value
    value_above = 0.0
    weight = 1.0
    # absolute = true: the bound alone is the test (no history); cause = true (absolute,
    # required only): the series reads the cause itself (a setting, a device state), so a
    # match is never read as another entry's consequence (knowledge_base.incidents)

    [remediation]
    script = "gpu_power_limit"           # a remediation.registry.SCRIPTS id (checked on load)
    mode = "manual"                      # auto | manual (auto only if the script is safe for it)
    params = { gpu = "{device_indices}" }  # literals, or templates filled from the incident and facts
    guidance = "..."                     # what to do by hand (always shown)

    [verification]                       # what must return to normal after the fix
    within_s = 300
    features = [{ name = "gpu.power_limit_ratio", direction = "up", at_least = 0.99 }]

    [[audit]]                            # static checks on host facts alone (knowledge_base.audit)
    check = "fact_ratio"
    ...
"""

from __future__ import annotations

import logging
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from analytics.catalog import FAMILIES, SUBSYSTEMS, split_feature
from remediation.verify import Criterion, VerificationSpec

log = logging.getLogger(__name__)

ENTRIES_DIR = Path(__file__).parent / "entries"

ID_RE = re.compile(r"[a-z][a-z0-9_]{1,63}")
ROLES = ("required", "supporting", "excludes")
OPS = ("==", "!=", ">", ">=", "<", "<=", "in", "not_in", "exists")
MODES = ("auto", "manual")
AUDIT_CHECKS = ("fact", "fact_ratio", "gpu_nic_numa", "irq_off_node")
SEVERITIES = ("info", "warning", "critical")
#: placeholders a remediation parameter template may use (see knowledge_base.facts.fill_template)
FACT_RE = re.compile(r"[a-z_]+\.[a-z0-9_]+")

#: derived facts: name -> description (computed by knowledge_base.facts.HostFacts.derived)
DERIVED: dict[str, str] = {
    "numa.nodes": "number of NUMA nodes (numa facts with a cpulist)",
    "gpu.count": "number of GPUs",
    "nic.count": "number of NICs",
    "nvme.count": "number of NVMe disks",
    "irq.count": "number of device IRQs with affinity facts",
    "power.slow_governor": "a cpufreq policy whose governor holds the clocks low (see HostFacts.derived)",
}

TEMPLATE_RE = re.compile(r"\{(device|device_index|device_indices|device_node|device_node_cpus|device_pci|device_pcis|netdev|netdevs|cgroup"
                         r"|pid|fact:[a-z_]+\.[a-z0-9_]+|fact_before:[a-z_]+\.[a-z0-9_]+(?:\|[A-Za-z0-9_.-]+)?)\}")


class KBError(ValueError):
    """A knowledge-base file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Precondition:
    fact: str
    op: str
    value: Any
    why: str
    if_missing: Literal["pass", "fail"] = "pass"


@dataclass(frozen=True)
class Gate:
    """Evaluate a signal only on devices where another feature of the same device is within
    bounds (e.g. PCIe link state only on GPUs that are busy: idle links downshift), and/or
    only in windows where a host fact holds (``fact``, a fact signal's test: e.g. a level
    that is evidence only while THP is off). ``if_missing``: where the device has no value
    of the gate feature, "pass" (default: the gate says nothing) or "fail" (the signal is
    not evaluated: the gate feature says what kind of device the signal is for)."""

    feature: str | None = None
    above: float | None = None
    below: float | None = None
    fact: Signal | None = None
    if_missing: Literal["pass", "fail"] = "pass"


@dataclass(frozen=True)
class Signal:
    feature: str  # family, or family@device
    direction: Literal["up", "down"]
    role: Literal["required", "supporting", "excludes"]
    min_z: float = 3.0
    min_change: float = 0.0
    value_below: float | None = None
    value_above: float | None = None
    weight: float = 1.0
    group: str | None = None
    note: str = ""
    gate: Gate | None = None
    fact: str | None = None  # a host-fact signal: fact op value at the window's time
    op: str = "=="
    value: Any = None
    # the value alone is the evidence (value_above / value_below, no reference, no z): a
    # cause read directly, e.g. a group throttled in most CFS periods, which is a quota below
    # demand whether the group is new (no history) or has been throttled since boot
    absolute: bool = False
    # the series reads the cause itself, a setting or device state sampled as telemetry
    # (the GPU power limit against its default, a CFS quota's throttling): a match through
    # it is a cause of its own, as a host fact is, never another fault's consequence
    cause: bool = False

    @property
    def family(self) -> str:
        return split_feature(self.feature)[0]

    @property
    def device(self) -> str:
        return split_feature(self.feature)[1]

    @property
    def key(self) -> str:
        """The name used in explanations: the feature and its direction (or the fact test)."""
        if self.fact is not None:
            return f"fact {self.fact} {self.op} {self.value!r}"
        if self.absolute:
            key = (f"{self.feature} > {self.value_above:g}" if self.direction == "up"
                   else f"{self.feature} < {self.value_below:g}")
        else:
            key = f"{self.feature} {'↑' if self.direction == 'up' else '↓'}"
        if self.gate is not None and self.gate.fact is not None:
            key += f" while {self.gate.fact.key.removeprefix('fact ')}"
        return key


@dataclass(frozen=True)
class Remediation:
    script: str | None
    mode: Literal["auto", "manual"]
    params: Mapping[str, Any]
    guidance: str
    # parameter -> the values that ARE the fault (THP enabled = never): no proposal sets them
    fault_values: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditCheck:
    check: str
    message: str
    severity: str = "warning"
    category: str = ""
    key: str = ""
    op: str = "=="
    value: Any = None
    ref_key: str = ""
    factor: float = 1.0


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    label_type: str
    explanation: str
    impact: str
    subsystems: tuple[str, ...]
    signals: tuple[Signal, ...]
    preconditions: tuple[Precondition, ...] = ()
    remediation: Remediation | None = None
    verification: VerificationSpec | None = None  # remediation.verify: the one spec type
    audit: tuple[AuditCheck, ...] = ()
    references: tuple[str, ...] = ()
    min_confidence: float = 0.5
    path: str = ""
    #: subsystems whose symptoms this cause produces besides its own (memory pressure:
    #: reclaim and page zeroing take CPU, a squeezed page cache re-reads from disk): a
    #: symptom-only match there overlapping this entry's is read as its consequence
    consequences: tuple[str, ...] = ()
    #: an incident of this entry is raised only once it spans this long (None: the
    #: scheduler's ``min_incident_s``; the larger of the two applies): for causes whose
    #: symptoms a healthy workload also shows in bursts (a checkpoint's writes)
    min_duration_s: float | None = None

    @property
    def required(self) -> tuple[Signal, ...]:
        return tuple(s for s in self.signals if s.role == "required")

    @property
    def families(self) -> frozenset[str]:
        return frozenset(s.family for s in self.signals if s.role != "excludes")


@dataclass(frozen=True)
class KnowledgeBase:
    entries: tuple[Entry, ...]
    source: str = ""
    by_id: dict[str, Entry] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {e.id: e for e in self.entries})

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Any:
        return iter(self.entries)

    def get(self, entry_id: str) -> Entry:
        try:
            return self.by_id[entry_id]
        except KeyError:
            raise KeyError(f"no knowledge-base entry {entry_id!r}; known: {', '.join(sorted(self.by_id))}") from None


# --------------------------------------------------------------------------- parsing
def _is_device_family(family: str) -> bool:
    """Families whose columns carry a device (``family@device``) — known from the catalog's
    description is not reliable, so list the host-wide ones instead."""
    return family not in _HOST_WIDE


_HOST_WIDE = frozenset({
    "cpu.ctxt_rate", "cpu.fork_rate", "cpu.procs_running", "cpu.procs_blocked", "cpu.load1",
    "psi.cpu_some_share", "psi.cpu_some_avg10", "psi.memory_some_share", "psi.memory_full_share",
    "psi.memory_some_avg10", "psi.io_some_share", "psi.io_full_share", "psi.io_some_avg10",
    "mem.hugepage_coverage", "mem.available_share", "mem.dirty_share", "mem.swap_used_share",
    "mem.hugetlb_used_share", "mem.page_tables_share", "mem.thp_fallback_rate", "mem.thp_fallback_share",
    "mem.pgfault_rate", "mem.pgmajfault_rate", "mem.swap_rate", "mem.direct_scan_rate", "mem.kswapd_scan_rate",
    "mem.compact_stall_rate", "mem.allocstall_rate", "numa.migration_rate", "numa.hint_fault_remote_share",
    "net.retrans_share", "net.retrans_rate", "net.in_err_rate", "net.active_open_rate",
})


class _Ctx:
    """Where we are in a file, for error messages."""

    def __init__(self, path: str) -> None:
        self.path = path

    def err(self, where: str, msg: str) -> KBError:
        return KBError(f"{self.path}: {where}: {msg}" if where else f"{self.path}: {msg}")


def _table(ctx: _Ctx, where: str, v: Any) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ctx.err(where, f"expected a table, got {type(v).__name__} {v!r}")
    return v


def _keys(ctx: _Ctx, where: str, d: Mapping[str, Any], allowed: Iterable[str], required: Iterable[str] = ()) -> None:
    allowed = set(allowed)
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ctx.err(where, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    for k in required:
        if k not in d:
            raise ctx.err(f"{where}.{k}" if where else k, "missing (required)")


def _str(ctx: _Ctx, where: str, v: Any, *, empty: bool = False) -> str:
    if not isinstance(v, str) or (not empty and not v.strip()):
        raise ctx.err(where, f"expected a non-empty string, got {v!r}")
    return v.strip()


def _num(ctx: _Ctx, where: str, v: Any, *, lo: float | None = None, hi: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ctx.err(where, f"expected a number, got {v!r}")
    if lo is not None and v < lo:
        raise ctx.err(where, f"must be >= {lo:g}, got {v!r}")
    if hi is not None and v > hi:
        raise ctx.err(where, f"must be <= {hi:g}, got {v!r}")
    return float(v)


def _choice(ctx: _Ctx, where: str, v: Any, choices: Sequence[str]) -> str:
    if v not in choices:
        raise ctx.err(where, f"expected one of {', '.join(repr(c) for c in choices)}, got {v!r}")
    return str(v)


def _list(ctx: _Ctx, where: str, v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise ctx.err(where, f"expected an array, got {type(v).__name__} {v!r}")
    return v


def _family(ctx: _Ctx, where: str, v: Any) -> str:
    name = _str(ctx, where, v)
    fam, dev = split_feature(name)
    if fam not in FAMILIES:
        close = sorted(f for f in FAMILIES if f.split(".")[0] == fam.split(".")[0])
        hint = f"; families of {fam.split('.')[0]!r}: {', '.join(close)}" if close else ""
        raise ctx.err(where, f"unknown feature family {fam!r} (not in analytics.catalog){hint}")
    if "@" in name and not dev:
        raise ctx.err(where, f"empty device in {name!r}")
    return name


def _signal(ctx: _Ctx, where: str, d: Any) -> Signal:
    d = _table(ctx, where, d)
    if "fact" in d:
        return _fact_signal(ctx, where, d)
    _keys(ctx, where, d, ("feature", "direction", "role", "min_z", "min_change", "value_below", "value_above",
                          "weight", "group", "note", "gate", "absolute", "cause"), ("feature", "direction"))
    feature = _family(ctx, f"{where}.feature", d["feature"])
    direction = _choice(ctx, f"{where}.direction", d["direction"], ("up", "down"))
    role, weight, group, note = _role_etc(ctx, where, d)
    min_z = _num(ctx, f"{where}.min_z", d.get("min_z", 3.0), lo=0.0)
    min_change = _num(ctx, f"{where}.min_change", d.get("min_change", 0.0), lo=0.0)
    below = _num(ctx, f"{where}.value_below", d["value_below"]) if "value_below" in d else None
    above = _num(ctx, f"{where}.value_above", d["value_above"]) if "value_above" in d else None
    if below is not None and above is not None and above >= below:
        raise ctx.err(where, f"value_above ({above:g}) must be below value_below ({below:g})")
    gate = _gate(ctx, f"{where}.gate", d["gate"]) if "gate" in d else None
    absolute = _flag(ctx, where, d, "absolute")
    if absolute:
        # the bound in the signal's direction is its whole test; z and change do not apply
        bound = "value_above" if direction == "up" else "value_below"
        if bound not in d:
            raise ctx.err(where, f"an absolute signal with direction = {direction!r} needs {bound}")
        for k in ("min_z", "min_change"):
            if k in d:
                raise ctx.err(f"{where}.{k}", "does not apply to an absolute signal (the value alone is the test)")
    cause = _flag(ctx, where, d, "cause")
    if cause and not (absolute and role == "required"):
        raise ctx.err(f"{where}.cause", "only a required absolute signal reads the cause itself")
    return Signal(feature, direction, role, min_z, min_change, below, above, weight, group, note, gate,  # type: ignore[arg-type]
                  absolute=absolute, cause=cause)


def _flag(ctx: _Ctx, where: str, d: Mapping[str, Any], key: str) -> bool:
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise ctx.err(f"{where}.{key}", f"expected true or false, got {v!r}")
    return v


def _role_etc(ctx: _Ctx, where: str, d: Mapping[str, Any]) -> tuple[str, float, str | None, str]:
    role = _choice(ctx, f"{where}.role", d.get("role", "supporting"), ROLES)
    weight = _num(ctx, f"{where}.weight", d.get("weight", 1.0), lo=0.0)
    if weight == 0 and role != "excludes":
        raise ctx.err(f"{where}.weight", "must be > 0 for a required or supporting signal")
    group = _str(ctx, f"{where}.group", d["group"]) if "group" in d else None
    if group is not None and role != "required":
        raise ctx.err(f"{where}.group", "only required signals have groups (alternatives)")
    note = _str(ctx, f"{where}.note", d["note"]) if "note" in d else ""
    return role, weight, group, note


def _fact_signal(ctx: _Ctx, where: str, d: Mapping[str, Any]) -> Signal:
    """A signal read from host facts at the window's time (e.g. thp.enabled == never)."""
    _keys(ctx, where, d, ("fact", "op", "value", "role", "weight", "group", "note"), ("fact", "op", "value"))
    fact = _str(ctx, f"{where}.fact", d["fact"])
    if fact not in DERIVED and not FACT_RE.fullmatch(fact):
        raise ctx.err(f"{where}.fact", f"{fact!r} is neither a derived fact nor '<category>.<key>'")
    op = _choice(ctx, f"{where}.op", d["op"], tuple(o for o in OPS if o != "exists"))
    if op in ("in", "not_in"):
        _list(ctx, f"{where}.value", d["value"])
    role, weight, group, note = _role_etc(ctx, where, d)
    return Signal(f"fact:{fact}", "up", role, 0.0, 0.0, None, None, weight, group, note,  # type: ignore[arg-type]
                  None, fact, op, d["value"])


def _gate(ctx: _Ctx, where: str, d: Any) -> Gate:
    d = _table(ctx, where, d)
    _keys(ctx, where, d, ("feature", "above", "below", "fact", "op", "value", "if_missing"), ())
    if "feature" not in d and "fact" not in d:
        raise ctx.err(where, "give a feature (with above and/or below) and/or a fact (with op and value)")
    fact = None
    if "fact" in d:
        fact = _fact_signal(ctx, where, {k: d[k] for k in ("fact", "op", "value") if k in d} | {"role": "required"})
    if "feature" not in d:
        for k in ("above", "below", "if_missing"):
            if k in d:
                raise ctx.err(f"{where}.{k}", "applies to a gate feature: give feature too")
        return Gate(fact=fact)
    feature = _family(ctx, f"{where}.feature", d["feature"])
    if "@" in feature:
        raise ctx.err(f"{where}.feature", "a gate names a family; it applies to the signal's own device")
    above = _num(ctx, f"{where}.above", d["above"]) if "above" in d else None
    below = _num(ctx, f"{where}.below", d["below"]) if "below" in d else None
    if above is None and below is None:
        raise ctx.err(where, "give above and/or below")
    if_missing = _choice(ctx, f"{where}.if_missing", d.get("if_missing", "pass"), ("pass", "fail"))
    return Gate(feature, above, below, fact, if_missing)  # type: ignore[arg-type]


def _precondition(ctx: _Ctx, where: str, d: Any) -> Precondition:
    d = _table(ctx, where, d)
    _keys(ctx, where, d, ("fact", "op", "value", "why", "if_missing"), ("fact", "op", "why"))
    fact = _str(ctx, f"{where}.fact", d["fact"])
    if fact not in DERIVED and not FACT_RE.fullmatch(fact):
        raise ctx.err(f"{where}.fact", f"{fact!r} is neither a derived fact ({', '.join(sorted(DERIVED))}) "
                      "nor '<category>.<key>'")
    op = _choice(ctx, f"{where}.op", d["op"], OPS)
    if op != "exists" and "value" not in d:
        raise ctx.err(f"{where}.value", f"missing (required for op {op!r})")
    value = d.get("value")
    if op in ("in", "not_in"):
        _list(ctx, f"{where}.value", value)
    elif op in (">", ">=", "<", "<="):
        _num(ctx, f"{where}.value", value)
    why = _str(ctx, f"{where}.why", d["why"])
    if_missing = _choice(ctx, f"{where}.if_missing", d.get("if_missing", "pass"), ("pass", "fail"))
    return Precondition(fact, op, value, why, if_missing)  # type: ignore[arg-type]


def _remediation(ctx: _Ctx, d: Any) -> Remediation:
    from remediation import registry
    from remediation.errors import ParamError, UnknownScriptError

    where = "remediation"
    d = _table(ctx, where, d)
    _keys(ctx, where, d, ("script", "mode", "params", "guidance", "fault_values"), ("mode", "guidance"))
    mode = _choice(ctx, f"{where}.mode", d["mode"], MODES)
    guidance = _str(ctx, f"{where}.guidance", d["guidance"])
    script = d.get("script")
    params = dict(_table(ctx, f"{where}.params", d.get("params", {})))
    if script is None:
        if params or "fault_values" in d:
            raise ctx.err(f"{where}.{'params' if params else 'fault_values'}", "given without a script")
        if mode == "auto":
            raise ctx.err(f"{where}.mode", "'auto' needs a script")
        return Remediation(None, "manual", {}, guidance)
    script = _str(ctx, f"{where}.script", script)
    try:
        spec = registry.get(script)
    except UnknownScriptError as exc:
        raise ctx.err(f"{where}.script", str(exc)) from None
    if mode == "auto" and not spec.safe_for_auto:
        raise ctx.err(f"{where}.mode", f"script {script!r} is not safe for automatic execution; use 'manual'")
    unknown = sorted(set(params) - set(spec.param_index))
    if unknown:
        raise ctx.err(f"{where}.params", f"unknown parameter(s) {', '.join(unknown)} for script {script!r}; "
                      f"known: {', '.join(spec.param_index)}")
    missing = [p.name for p in spec.params if p.required and p.name not in params]
    if missing:
        raise ctx.err(f"{where}.params", f"missing required parameter(s) {', '.join(missing)} of script {script!r}")
    faults = _fault_values(ctx, where, d.get("fault_values", {}), script, spec)
    for name, value in params.items():
        pw = f"{where}.params.{name}"
        fault = faults.get(name, ())
        if isinstance(value, str) and "{" in value:
            rest = TEMPLATE_RE.sub("", value)
            if "{" in rest or "}" in rest:
                raise ctx.err(pw, f"bad template {value!r}; placeholders: {{device}}, {{device_index}}, {{device_indices}}, "
                              "{device_node}, {device_node_cpus}, {device_pci}, {device_pcis}, {netdev}, {netdevs}, {cgroup}, {pid}, "
                              "{fact:<category>.<key>}, {fact_before:<category>.<key>[|fallback]}")
            for m in TEMPLATE_RE.finditer(value):
                # a fact_before fallback is a literal value: it must suit the parameter
                _, bar, fallback = m.group(1).partition("|")
                if bar and TEMPLATE_RE.fullmatch(value):
                    try:
                        clean = spec.param_index[name].validate(script, fallback)
                    except ParamError as exc:
                        raise ctx.err(pw, f"bad fallback {fallback!r} in {value!r}: {exc}") from None
                    if clean in fault:
                        raise ctx.err(pw, f"fallback {fallback!r} is a fault value of this entry (fault_values.{name})")
            if not TEMPLATE_RE.fullmatch(value):
                # text around placeholders must itself be valid: try it with a dummy value
                try:
                    spec.param_index[name].validate(script, TEMPLATE_RE.sub("0", value))
                except ParamError as exc:
                    raise ctx.err(pw, f"bad template {value!r}: {exc}") from None
            continue
        try:
            clean = spec.param_index[name].validate(script, value)
        except ParamError as exc:
            raise ctx.err(pw, str(exc)) from None
        if clean in fault:
            raise ctx.err(pw, f"{value!r} is a fault value of this entry (fault_values.{name}): the fix would set the fault")
    if spec.one_of and not any(k in params for k in spec.one_of):
        raise ctx.err(f"{where}.params", f"script {script!r} needs at least one of {', '.join(spec.one_of)}")
    return Remediation(script, mode, params, guidance, faults)  # type: ignore[arg-type]


def _fault_values(ctx: _Ctx, where: str, d: Any, script: str, spec: Any) -> dict[str, tuple[Any, ...]]:
    """``fault_values = { param = [value, ...] }``: each a parameter of the script, each value
    valid for it (normalised the way the queue normalises proposals)."""
    from remediation.errors import ParamError

    d = _table(ctx, f"{where}.fault_values", d)
    unknown = sorted(set(d) - set(spec.param_index))
    if unknown:
        raise ctx.err(f"{where}.fault_values", f"unknown parameter(s) {', '.join(unknown)} for script {script!r}; "
                      f"known: {', '.join(spec.param_index)}")
    out: dict[str, tuple[Any, ...]] = {}
    for name, values in d.items():
        fw = f"{where}.fault_values.{name}"
        items = _list(ctx, fw, values)
        clean = []
        for i, v in enumerate(items):
            try:
                clean.append(spec.param_index[name].validate(script, v))
            except ParamError as exc:
                raise ctx.err(f"{fw}[{i}]", str(exc)) from None
        out[name] = tuple(clean)
    return out


def _vfeature(ctx: _Ctx, where: str, d: Any) -> Criterion:
    d = _table(ctx, where, d)
    _keys(ctx, where, d, ("name", "direction", "at_least", "min_change"), ("name", "direction"))
    name = _family(ctx, f"{where}.name", d["name"])
    direction = _choice(ctx, f"{where}.direction", d["direction"], ("up", "down"))
    at_least = _num(ctx, f"{where}.at_least", d["at_least"]) if "at_least" in d else None
    min_change = _num(ctx, f"{where}.min_change", d["min_change"], lo=1e-12) if "min_change" in d else None
    fam, dev = split_feature(name)
    per_device = not dev and _is_device_family(fam)  # expanded per device of an incident
    return Criterion(name, direction, at_least, min_change, per_device)  # type: ignore[arg-type]


def _verification(ctx: _Ctx, d: Any) -> VerificationSpec:
    where = "verification"
    d = _table(ctx, where, d)
    _keys(ctx, where, d, ("within_s", "min_windows", "features", "guards"), ("within_s", "features"))
    within = _num(ctx, f"{where}.within_s", d["within_s"], lo=1.0)
    mw = d.get("min_windows", 3)
    if isinstance(mw, bool) or not isinstance(mw, int) or mw < 1:
        raise ctx.err(f"{where}.min_windows", f"expected a positive integer, got {mw!r}")
    feats = tuple(_vfeature(ctx, f"{where}.features[{i}]", x) for i, x in enumerate(_list(ctx, f"{where}.features", d["features"])))
    if not feats:
        raise ctx.err(f"{where}.features", "must list at least one feature")
    guards = tuple(_vfeature(ctx, f"{where}.guards[{i}]", x) for i, x in enumerate(_list(ctx, f"{where}.guards", d.get("guards", []))))
    return VerificationSpec(feats, guards, within_s=within, min_windows=mw)


def _audit(ctx: _Ctx, where: str, d: Any) -> AuditCheck:
    d = _table(ctx, where, d)
    _keys(ctx, where, d, ("check", "message", "severity", "category", "key", "op", "value", "ref_key", "factor"),
          ("check", "message"))
    check = _choice(ctx, f"{where}.check", d["check"], AUDIT_CHECKS)
    message = _str(ctx, f"{where}.message", d["message"])
    severity = _choice(ctx, f"{where}.severity", d.get("severity", "warning"), SEVERITIES)
    out = AuditCheck(check, message, severity)
    if check == "fact":
        _keys(ctx, where, d, ("check", "message", "severity", "category", "key", "op", "value"),
              ("category", "key", "op", "value"))
        op = _choice(ctx, f"{where}.op", d["op"], tuple(o for o in OPS if o != "exists"))
        if op in ("in", "not_in"):
            _list(ctx, f"{where}.value", d["value"])
        return AuditCheck(check, message, severity, _str(ctx, f"{where}.category", d["category"]),
                          _str(ctx, f"{where}.key", d["key"]), op, d["value"])
    if check == "fact_ratio":
        _keys(ctx, where, d, ("check", "message", "severity", "category", "key", "ref_key", "factor"),
              ("category", "key", "ref_key"))
        factor = _num(ctx, f"{where}.factor", d.get("factor", 1.0), lo=0.0)
        return AuditCheck(check, message, severity, _str(ctx, f"{where}.category", d["category"]),
                          _str(ctx, f"{where}.key", d["key"]), "<", None, _str(ctx, f"{where}.ref_key", d["ref_key"]),
                          factor)
    _keys(ctx, where, d, ("check", "message", "severity"))
    return out


def parse_entry(data: Mapping[str, Any], path: str) -> Entry:
    """Validate one entry's parsed TOML; errors name ``path`` and the field."""
    ctx = _Ctx(path)
    _keys(ctx, "", data, ("id", "title", "label_type", "explanation", "impact", "subsystems", "signals",
                          "preconditions", "remediation", "verification", "audit", "references", "min_confidence",
                          "consequences", "min_duration_s"),
          ("id", "title", "explanation", "impact", "subsystems", "signals"))
    eid = _str(ctx, "id", data["id"])
    if not ID_RE.fullmatch(eid):
        raise ctx.err("id", f"{eid!r} must match {ID_RE.pattern}")
    stem = Path(path).stem
    if stem and stem != eid and not path.startswith("<"):
        raise ctx.err("id", f"{eid!r} differs from the file name {stem!r}")
    subs = _list(ctx, "subsystems", data["subsystems"])
    if not subs:
        raise ctx.err("subsystems", "must name at least one subsystem")
    for i, s in enumerate(subs):
        _choice(ctx, f"subsystems[{i}]", s, SUBSYSTEMS)
    cons = _list(ctx, "consequences", data.get("consequences", []))
    for i, s in enumerate(cons):
        _choice(ctx, f"consequences[{i}]", s, SUBSYSTEMS)
    signals = tuple(_signal(ctx, f"signals[{i}]", s) for i, s in enumerate(_list(ctx, "signals", data["signals"])))
    if not any(s.role == "required" for s in signals):
        raise ctx.err("signals", "at least one signal must have role = 'required'")
    seen: set[tuple[str, str, bool]] = set()
    for i, s in enumerate(signals):
        if (s.feature, s.direction, s.absolute) in seen:
            raise ctx.err(f"signals[{i}]", f"duplicate signal {s.key}")
        seen.add((s.feature, s.direction, s.absolute))
    pre = tuple(_precondition(ctx, f"preconditions[{i}]", p)
                for i, p in enumerate(_list(ctx, "preconditions", data.get("preconditions", []))))
    rem = _remediation(ctx, data["remediation"]) if "remediation" in data else None
    ver = _verification(ctx, data["verification"]) if "verification" in data else None
    aud = tuple(_audit(ctx, f"audit[{i}]", a) for i, a in enumerate(_list(ctx, "audit", data.get("audit", []))))
    refs = tuple(_str(ctx, f"references[{i}]", r) for i, r in enumerate(_list(ctx, "references", data.get("references", []))))
    min_conf = _num(ctx, "min_confidence", data.get("min_confidence", 0.5), lo=0.0, hi=1.0)
    label = _str(ctx, "label_type", data.get("label_type", eid))
    min_dur = _num(ctx, "min_duration_s", data["min_duration_s"], lo=0.0) if "min_duration_s" in data else None
    return Entry(eid, _str(ctx, "title", data["title"]), label, _str(ctx, "explanation", data["explanation"]),
                 _str(ctx, "impact", data["impact"]), tuple(subs), signals, pre, rem, ver, aud, refs, min_conf, path,
                 tuple(str(c) for c in cons), min_dur)


def load_entry(path: str | Path) -> Entry:
    """Read and validate one entry file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise KBError(f"{p}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise KBError(f"{p}: not UTF-8 text: {exc}") from None
    return parse_entry(data, str(p))


def load_kb(path: str | Path | None = None) -> KnowledgeBase:
    """All entries of a directory (default: the shipped knowledge_base/entries) or one file.

    Files whose name starts with ``_`` or ``.`` are skipped (drafts in progress). Duplicate
    ids are an error naming both files."""
    root = Path(path) if path is not None else ENTRIES_DIR
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(f for f in root.glob("*.toml") if not f.name.startswith(("_", ".")))
    else:
        raise KBError(f"{root}: no such knowledge-base file or directory")
    entries: list[Entry] = []
    seen: dict[str, str] = {}
    for f in files:
        e = load_entry(f)
        if e.id in seen:
            raise KBError(f"{f}: id: {e.id!r} already defined in {seen[e.id]}")
        seen[e.id] = str(f)
        entries.append(e)
    if not entries:
        raise KBError(f"{root}: no entries (*.toml)")
    log.debug("loaded %d knowledge-base entries from %s", len(entries), root)
    return KnowledgeBase(tuple(sorted(entries, key=lambda e: e.id)), str(root))
