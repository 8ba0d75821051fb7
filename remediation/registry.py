"""The allowlist of remediation scripts and their parameter schemas.

This module is the remediation side of the contract with the knowledge base: an entry names a
script by ``id`` (a key of :data:`SCRIPTS`) with parameters taken from host facts, and the
executor runs nothing else. Parameters are validated here (type, range, regular expression,
allowed values) before a command line is ever built, and validated again by the script itself.

Each script is a module ``remediation.scripts.<id>`` run as
``python -m remediation.scripts.<id> check|apply|rollback --root R --state FILE --name=value ...``.
See docs/remediation.md for the full contract.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from remediation.errors import ParamError, UnknownScriptError

ParamType = Literal["int", "float", "str", "choice", "cpulist", "intlist", "bool"]

# Ids are Python module names inside remediation/scripts: no dots, slashes or leading underscore,
# so an id can never name a path outside that package or one of its private helpers.
ID_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")
# A CPU list as the kernel writes it: "0-3,8,10-11".
CPULIST_RE = re.compile(r"\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?){0,255}")
INTLIST_RE = re.compile(r"\d{1,6}(,\d{1,6}){0,1023}")
# Characters no string parameter may ever hold, whatever its own pattern says (defence in depth:
# the executor never uses a shell, but values also end up in logs and file paths).
_FORBIDDEN = re.compile(r"[\s;&|`$<>(){}\[\]*?!\\\"'~#%=\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Param:
    """One parameter of a script. ``pattern`` is matched against the whole string value."""

    name: str
    type: ParamType
    description: str
    required: bool = False
    default: Any = None
    choices: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    pattern: str | None = None
    max_len: int = 128

    def validate(self, script_id: str, value: Any) -> Any:
        """Return the normalised value or raise ParamError naming script, parameter and value."""
        where = f"{script_id}: parameter {self.name!r}"
        if isinstance(value, bool) and self.type != "bool":
            raise ParamError(f"{where}: expected {self.type}, got a boolean {value!r}")
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise ParamError(f"{where}: expected true or false, got {value!r}")
        if self.type in ("int", "float"):
            return self._number(where, value)
        if self.type == "intlist" and isinstance(value, int):
            value = str(value)  # one integer is a list of one (a GPU index queued before lists)
        if not isinstance(value, str):
            raise ParamError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        if len(value) > self.max_len or not value:
            raise ParamError(f"{where}: length must be 1..{self.max_len}, got {len(value)}")
        if _FORBIDDEN.search(value):
            raise ParamError(f"{where}: forbidden character in {value!r}")
        if self.type == "choice":
            if value not in self.choices:
                raise ParamError(f"{where}: {value!r} is not one of {', '.join(self.choices)}")
        elif self.type == "cpulist":
            value = _check_list(where, value, CPULIST_RE, "a CPU list like 0-3,8")
        elif self.type == "intlist":
            value = _check_list(where, value, INTLIST_RE, "a comma-separated list of integers")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise ParamError(f"{where}: {value!r} does not match {self.pattern}")
        return value

    def _number(self, where: str, value: Any) -> int | float:
        num: int | float
        try:
            if self.type == "int":
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
                if isinstance(value, str) and not re.fullmatch(r"-?\d{1,18}", value):
                    raise ValueError
                num = int(value)
            else:
                if isinstance(value, str) and not re.fullmatch(r"-?\d{1,18}(\.\d{1,18})?", value):
                    raise ValueError
                num = float(value)
        except (TypeError, ValueError):
            raise ParamError(f"{where}: expected {self.type}, got {value!r}") from None
        if self.min is not None and num < self.min:
            raise ParamError(f"{where}: {num} is below the minimum {self.min:g}")
        if self.max is not None and num > self.max:
            raise ParamError(f"{where}: {num} is above the maximum {self.max:g}")
        return num


def _check_list(where: str, value: str, rx: re.Pattern[str], what: str) -> str:
    if not rx.fullmatch(value):
        raise ParamError(f"{where}: {value!r} is not {what}")
    for part in value.split(","):
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            raise ParamError(f"{where}: range {part!r} runs backwards")
    return value


def expand_cpulist(text: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]`` (the kernel's list format, also used for IRQ lists)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


@dataclass(frozen=True)
class ScriptSpec:
    """One allowlisted script. ``records`` says what state apply saves for rollback."""

    id: str
    summary: str
    params: tuple[Param, ...]
    safe_for_auto: bool
    records: str
    timeout_s: float = 60.0
    # At least one of these parameters must be given (e.g. thp: enabled or defrag).
    one_of: tuple[str, ...] = ()
    notes: str = ""
    param_index: dict[str, Param] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not ID_RE.fullmatch(self.id):
            raise ValueError(f"script id {self.id!r} must match {ID_RE.pattern}")
        object.__setattr__(self, "param_index", {p.name: p for p in self.params})

    @property
    def module(self) -> str:
        return f"remediation.scripts.{self.id}"


_NAME = r"[A-Za-z0-9_.:@+-]+"
PCI_RE = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
IFACE_RE = r"[A-Za-z0-9_.:-]{1,15}"
# A cgroup path relative to the cgroup mount: no "..", no leading "/".
CGROUP_RE = rf"(?!.*(^|/)\.\.?(/|$)){_NAME}(/{_NAME}){{0,31}}"

THP_MODES = ("always", "madvise", "never")
THP_DEFRAG = ("always", "defer", "defer+madvise", "madvise", "never")
GOVERNORS = ("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace")

SCRIPTS: dict[str, ScriptSpec] = {
    s.id: s
    for s in (
        ScriptSpec(
            id="thp",
            summary="set transparent huge page mode/defrag; optionally collapse a process's memory",
            params=(
                Param("enabled", "choice", "THP mode", choices=THP_MODES),
                Param("defrag", "choice", "THP defrag mode", choices=THP_DEFRAG),
                Param(
                    "khugepaged_pages_to_scan", "int",
                    "khugepaged pages scanned per pass (speeds up collapse of existing memory)",
                    min=8, max=1 << 20,
                ),
                Param(
                    "khugepaged_scan_sleep_ms", "int", "khugepaged sleep between passes",
                    min=0, max=600_000,
                ),
                Param(
                    "collapse_pid", "int",
                    "after the mode change, ask the kernel to collapse this process's anonymous "
                    "memory into huge pages now (process_madvise MADV_COLLAPSE, Linux >= 6.1)",
                    min=1, max=1 << 22,
                ),
            ),
            safe_for_auto=True,
            records="THP enabled and defrag modes, and the khugepaged tunables it changes",
            timeout_s=120.0,
            one_of=("enabled", "defrag", "khugepaged_pages_to_scan", "khugepaged_scan_sleep_ms"),
            notes="A mode change affects new faults only; collapse_pid (or a faster khugepaged) "
            "brings existing memory back. The collapse itself is not undone by rollback.",
        ),
        ScriptSpec(
            id="irq_affinity",
            summary="pin the interrupts of one or more PCI devices to the CPUs of each one's local NUMA node",
            params=(
                Param("pci", "str", "PCI address of the device, or of several (comma-separated)", required=True,
                      pattern=rf"{PCI_RE}(,{PCI_RE}){{0,63}}", max_len=64 * 13),
                Param("cpus", "cpulist", "target CPUs (default: the device's local node CPUs)"),
                Param("irqs", "intlist", "only these IRQs (default: all MSI IRQs of the device)"),
            ),
            safe_for_auto=True,
            records="smp_affinity_list of every IRQ it changes",
            notes="Stop irqbalance first or it may move the IRQs again.",
        ),
        ScriptSpec(
            id="cpu_governor",
            summary="set the cpufreq scaling governor",
            params=(
                Param("governor", "choice", "governor", required=True, choices=GOVERNORS),
                Param("cpus", "cpulist", "only policies of these CPUs (default: all)"),
            ),
            safe_for_auto=True,
            records="scaling_governor of every cpufreq policy it changes",
        ),
        ScriptSpec(
            id="numa_rebind",
            summary="move a process's CPUs and memory to one NUMA node",
            params=(
                Param("pid", "int", "process id", required=True, min=1, max=1 << 22),
                Param("node", "int", "target NUMA node", required=True, min=0, max=1023),
                Param("cpus", "cpulist", "target CPUs (default: the node's CPUs)"),
                Param("migrate_memory", "bool", "also migrate memory (migratepages)", default=True),
            ),
            safe_for_auto=False,
            records="CPU affinity of every thread and the process's pages per node",
            timeout_s=300.0,
            notes="Page migration stalls the process briefly; rollback moves pages back to the "
            "previous nodes, not to their exact previous placement.",
        ),
        ScriptSpec(
            id="gpu_power_limit",
            summary="restore the power limit of one or more GPUs (default: each one's default limit) via NVML",
            params=(
                Param("gpu", "intlist", "GPU index, or the indices of several (0,1,7)", required=True,
                      pattern=r"\d{1,2}(,\d{1,2}){0,63}"),
                Param("limit_w", "float", "power limit in W (default: the default limit)", min=1, max=5000),
            ),
            safe_for_auto=False,
            records="the power management limit in mW",
            notes="Raising a limit an operator set on purpose can exceed a rack power budget.",
        ),
        ScriptSpec(
            id="cgroup_cpu_quota",
            summary="set a cgroup's CPU quota (v2 cpu.max, v1 cpu.cfs_quota_us/cpu.cfs_period_us)",
            params=(
                Param("cgroup", "str", "cgroup path below the mount", required=True,
                      pattern=CGROUP_RE, max_len=512),
                Param("quota_us", "int", "quota per period in us; -1 = unlimited", required=True,
                      min=-1, max=10**9),
                Param("period_us", "int", "period in us (default: keep)", min=1000, max=1_000_000),
            ),
            safe_for_auto=False,
            records="cpu.max (v2) or cpu.cfs_quota_us and cpu.cfs_period_us (v1)",
            notes="Quotas are often a tenant's contract: change them with the owner's consent.",
        ),
        ScriptSpec(
            id="nic_ring",
            summary="resize the RX/TX rings of one or more NICs (ethtool -G)",
            params=(
                Param("iface", "str", "network interface, or several (comma-separated)", required=True,
                      pattern=rf"{IFACE_RE}(,{IFACE_RE}){{0,63}}", max_len=64 * 16),
                Param("rx", "int", "RX ring size", min=1, max=1 << 16),
                Param("tx", "int", "TX ring size", min=1, max=1 << 16),
            ),
            safe_for_auto=False,
            records="the current RX and TX ring sizes",
            one_of=("rx", "tx"),
            notes="Many drivers reset the link to resize rings: traffic stops for a moment.",
        ),
    )
}

# Known fixes that must stay manual: the knowledge base may cite them as guidance, the executor
# never runs them (they are not in SCRIPTS).
MANUAL_ONLY: dict[str, str] = {
    "pcie_link_retrain": "Retraining a PCIe link (setpci LNKCTL retrain / reseat) drops in-flight "
    "DMA and can hang the device: quiesce the workload and do it by hand.",
    "gpu_reset": "nvidia-smi -r needs every process off the GPU: drain the node first.",
    "bios_numa_settings": "NPS/SNC and memory interleave are firmware settings: needs a reboot.",
}


def get(script_id: str) -> ScriptSpec:
    """The allowlisted spec for ``script_id``, or UnknownScriptError."""
    if not isinstance(script_id, str) or not ID_RE.fullmatch(script_id):
        raise UnknownScriptError(f"script id {script_id!r} is not a valid id (must match {ID_RE.pattern})")
    spec = SCRIPTS.get(script_id)
    if spec is None:
        extra = f" (manual-only fix: {MANUAL_ONLY[script_id]})" if script_id in MANUAL_ONLY else ""
        raise UnknownScriptError(
            f"script {script_id!r} is not in the remediation allowlist{extra}; "
            f"allowed: {', '.join(sorted(SCRIPTS))}"
        )
    return spec


def validate_params(script_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Validate and normalise ``params`` for ``script_id``; defaults filled, unknown keys refused.

    Raises UnknownScriptError for an id outside the allowlist and ParamError (naming the script,
    the parameter and the value) for anything else.
    """
    spec = get(script_id)
    if not isinstance(params, Mapping):
        raise ParamError(f"{script_id}: parameters must be a mapping, got {type(params).__name__}")
    unknown = sorted(set(params) - set(spec.param_index))
    if unknown:
        raise ParamError(
            f"{script_id}: unknown parameter(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(spec.param_index)}"
        )
    out: dict[str, Any] = {}
    for p in spec.params:
        value = params.get(p.name)
        if value is None:
            if p.required:
                raise ParamError(f"{script_id}: missing required parameter {p.name!r}")
            if p.default is not None:
                out[p.name] = p.default
            continue
        out[p.name] = p.validate(script_id, value)
    if spec.one_of and not any(k in out for k in spec.one_of):
        raise ParamError(f"{script_id}: give at least one of {', '.join(spec.one_of)}")
    return out


def validate_values(script_id: str, name: str, values: Sequence[Any]) -> list[Any]:
    """Each of ``values`` validated and normalised as parameter ``name`` of ``script_id``."""
    spec = get(script_id)
    if name not in spec.param_index:
        raise ParamError(f"{script_id}: unknown parameter {name!r}; known: {', '.join(spec.param_index)}")
    return [spec.param_index[name].validate(script_id, v) for v in values]


def to_argv(script_id: str, params: Mapping[str, Any]) -> list[str]:
    """Validated params as ``--name=value`` arguments (the ``=`` form so no value is ever read as
    an option, even one starting with ``-``)."""
    out = []
    for name, value in validate_params(script_id, params).items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out.append(f"--{name}={text}")
    return out
