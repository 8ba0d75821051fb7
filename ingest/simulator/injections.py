"""Injectable silent inefficiencies: their parameters, the physical knobs they turn and the
host facts they change.

An injection only sets *causes* in :class:`Effects` (a lowered power limit, IRQs moved to
the far node, a noisy neighbour's cores ...); the consequences on every signal and on
throughput are computed by :mod:`ingest.simulator.physics`, so footprints stay physically
consistent and overlap between types where the physics overlaps. Footprints and the source
of their magnitudes: docs/simulator.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ingest.simulator.topology import (
    CPU_MIN_MHZ,
    CPU_TURBO_MHZ,
    GPU_PCIE_GEN,
    GPU_PCIE_WIDTH,
    GPU_POWER_DEFAULT_W,
    FactState,
    HostSpec,
)
from ingest.simulator.workloads import TICKS_PER_S


@dataclass(frozen=True)
class Injection:
    """One injected inefficiency (or counter artefact) on one host."""

    type: str
    host: str
    start_s: float  # seconds after the run start
    duration_s: float
    severity: float = 0.5
    devices: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s  # inf for a fault that lasts the run

    def ticks(self) -> tuple[int, int]:
        """[start, end) in fast ticks (the end capped so that a run-long fault stays finite)."""
        return int(round(self.start_s * TICKS_PER_S)), int(round(min(self.end_s, 1e12) * TICKS_PER_S))


@dataclass
class Effects:
    """Causes over the fast ticks of one chunk; neutral values mean healthy."""

    n: int
    n_gpus: int
    n_nics: int
    n_disks: int
    nodes: int
    power_default_w: float = GPU_POWER_DEFAULT_W
    pcie_gen_max: int = GPU_PCIE_GEN

    def __post_init__(self) -> None:
        n, g = self.n, self.n_gpus
        self.power_limit = np.full((g, n), self.power_default_w)
        self.cooling = np.zeros((g, n))  # 0..1 loss of cooling
        self.pcie_gen = np.full((g, n), float(self.pcie_gen_max))
        self.pcie_width = np.full((g, n), float(GPU_PCIE_WIDTH))
        self.misplace = np.zeros((g, n))  # share of the GPU's comm staged through far-node memory
        self.irq_far_nic = np.zeros((self.n_nics, n))  # share of the NIC's IRQ lines on the far node
        self.irq_far_disk = np.zeros((self.n_disks, n))
        self.thp = np.zeros(n)  # huge-page coverage lost (0..1 of the healthy coverage)
        self.thp_never = np.zeros(n)  # 1 where THP is disabled (no THP faults at all)
        self.freq_cap = np.full(n, CPU_TURBO_MHZ)  # CPU frequency under load
        self.quota_cut = np.zeros(n)  # share of the workload cgroup quota removed
        self.neighbour = np.zeros((self.nodes, n))  # noisy neighbour intensity per node
        self.drops = np.zeros((self.n_nics, n))  # 0..1 severity of ring overflow per NIC
        self.disk = np.zeros((self.n_disks, n))  # 0..1 foreign I/O load per NVMe
        self.mempress = np.zeros(n)  # 0..1 memory pressure


def _env(inj: Injection, a: int, n: int, tau_s: float) -> tuple[slice, np.ndarray] | None:
    """Ticks of chunk [a, a+n) inside the injection and its envelope (severity, with an
    exponential onset of time constant ``tau_s``); None when they do not overlap."""
    s, e = inj.ticks()
    i, j = max(s, a), min(e, a + n)
    if i >= j:
        return None
    t = (np.arange(i, j) - s) / TICKS_PER_S
    env = inj.severity * (1.0 - np.exp(-t / tau_s)) if tau_s > 0 else np.full(j - i, inj.severity)
    return slice(i - a, j - a), env


def canonical(host: HostSpec, kind: str, name: str, inj: Injection) -> str:
    """The canonical name of a device an injection names, as the lake's tags spell it:
    GPU "3" (also "gpu3"), NIC netdev "ens1np0" (also "mlx5_0"), disk "nvme0n1" (also
    "nvme0"), NUMA node "0" (also "node0")."""
    n = str(name)
    if kind == "gpu":
        n = n[3:] if n.startswith("gpu") else n
        names = [g.name for g in host.gpus]
    elif kind == "nic":
        n = {x.name: x.netdev for x in host.nics}.get(n, n)
        names = [x.netdev for x in host.nics]
    elif kind == "disk":
        n = {d.ctrl: d.name for d in host.disks}.get(n, n)
        names = [d.name for d in host.disks]
    elif kind == "node":
        n = n[4:] if n.startswith("node") else n
        names = [str(k) for k in range(host.nodes)]
    elif kind == "irq":
        for k in ("nic", "disk"):
            try:
                return canonical(host, k, n, inj)
            except ValueError:
                pass
        names = [x.netdev for x in host.nics] + [d.name for d in host.disks]
    else:
        names = []
    if n not in names:
        raise ValueError(
            f"injection {inj.type} on {inj.host}: unknown device {name!r}; expected one of {', '.join(names)}"
        )
    return n


def _idx(names: tuple[str, ...], wanted: tuple[str, ...], inj: Injection) -> list[int]:
    return [names.index(d) for d in wanted]


Apply = Callable[[Effects, Injection, HostSpec, slice, np.ndarray], None]
Facts = Callable[[FactState, Injection, HostSpec], None]


@dataclass(frozen=True)
class InjectionType:
    name: str
    kind: str  # "gpu" | "nic" | "irq" | "disk" | "node" | "host": what ``devices`` names
    summary: str
    default_devices: Callable[[HostSpec], tuple[str, ...]]
    tau_s: float
    apply: Apply
    facts: Facts | None = None
    label: bool = True  # False for counter artefacts (not inefficiencies)


def _gpus(host: HostSpec, inj: Injection) -> list[int]:
    return _idx(tuple(g.name for g in host.gpus), inj.devices, inj)


def _nics(host: HostSpec, inj: Injection) -> list[int]:
    return _idx(tuple(x.netdev for x in host.nics), inj.devices, inj)


def _disks(host: HostSpec, inj: Injection) -> list[int]:
    return _idx(tuple(d.name for d in host.disks), inj.devices, inj)


def _nodes(host: HostSpec, inj: Injection) -> list[int]:
    return _idx(tuple(str(k) for k in range(host.nodes)), inj.devices, inj)


def _max(arr: np.ndarray, rows: list[int] | None, sl: slice, env: np.ndarray) -> None:
    if rows is None:
        arr[sl] = np.maximum(arr[sl], env)
    else:
        for r in rows:
            arr[r, sl] = np.maximum(arr[r, sl], env)


# ---------------------------------------------------------------- the inefficiencies


def power_limit_w(severity: float, params: dict[str, Any], default_w: float = GPU_POWER_DEFAULT_W) -> float:
    """Lowered power limit: severity 1 -> 3/7 of the default (300 W of an H100's 700 W,
    171 W of an A100's 400 W); ``limit_w`` overrides."""
    return float(params.get("limit_w", default_w - 400.0 / 700.0 * default_w * severity))


def pcie_gen_of(severity: float, params: dict[str, Any], gen_max: int = GPU_PCIE_GEN) -> int:
    return int(params.get("gen", max(1, gen_max - int(round(3 * severity)))))


def pcie_width_of(params: dict[str, Any]) -> int:
    return int(params.get("width", GPU_PCIE_WIDTH))


def _apply_power(eff: Effects, inj: Injection, host: HostSpec, sl: slice, env: np.ndarray) -> None:
    limit = power_limit_w(inj.severity, inj.params, host.gpu_model.power_default_w)
    for g in _gpus(host, inj):
        eff.power_limit[g, sl] = np.minimum(eff.power_limit[g, sl], limit)


def _facts_power(st: FactState, inj: Injection, host: HostSpec) -> None:
    limit = power_limit_w(inj.severity, inj.params, host.gpu_model.power_default_w)
    for g in _gpus(host, inj):
        st.power_limit_w[g] = min(st.power_limit_w[g], limit)


def _apply_pcie(eff: Effects, inj: Injection, host: HostSpec, sl: slice, env: np.ndarray) -> None:
    gen, width = pcie_gen_of(inj.severity, inj.params, host.gpu_model.pcie_gen), pcie_width_of(inj.params)
    for g in _gpus(host, inj):
        eff.pcie_gen[g, sl] = np.minimum(eff.pcie_gen[g, sl], gen)
        eff.pcie_width[g, sl] = np.minimum(eff.pcie_width[g, sl], width)


def _facts_pcie(st: FactState, inj: Injection, host: HostSpec) -> None:
    for g in _gpus(host, inj):
        st.pcie_gen[g] = min(st.pcie_gen[g], pcie_gen_of(inj.severity, inj.params, host.gpu_model.pcie_gen))
        st.pcie_width[g] = min(st.pcie_width[g], pcie_width_of(inj.params))


def moved_queues(severity: float, queues: int) -> int:
    """IRQ locality miss: the first round(severity x queues) IRQ lines of a device (at
    least one) get an affinity on the far node (a wrong smp_affinity script, an irqbalance
    ban); the facts and the interrupt counts agree line by line."""
    return max(1, min(queues, int(round(severity * queues))))


def _apply_irq(eff: Effects, inj: Injection, host: HostSpec, sl: slice, env: np.ndarray) -> None:
    nics = [x.netdev for x in host.nics]
    disks = [d.name for d in host.disks]
    for d in inj.devices:
        if d in nics:
            share = moved_queues(inj.severity, host.nic_queues) / host.nic_queues
            _max(eff.irq_far_nic, [nics.index(d)], sl, np.full(len(env), share))
        else:
            share = moved_queues(inj.severity, host.disk_queues) / host.disk_queues
            _max(eff.irq_far_disk, [disks.index(d)], sl, np.full(len(env), share))


def _facts_irq(st: FactState, inj: Injection, host: HostSpec) -> None:
    irq_dev = {x.netdev: (x.name, host.nic_queues) for x in host.nics}
    irq_dev |= {d.name: (d.ctrl, host.disk_queues) for d in host.disks}
    for d in inj.devices:
        name, queues = irq_dev[d]
        st.irq_far[name] = max(st.irq_far.get(name, 0), moved_queues(inj.severity, queues))


def _apply_thp(eff: Effects, inj: Injection, host: HostSpec, sl: slice, env: np.ndarray) -> None:
    _max(eff.thp, None, sl, env)
    if inj.params.get("cause", "mode_never") == "mode_never":
        eff.thp_never[sl] = 1.0


def _facts_thp(st: FactState, inj: Injection, host: HostSpec) -> None:
    if inj.params.get("cause", "mode_never") == "mode_never":
        st.thp_enabled = "never"
        st.thp_defrag = "never"


def _apply_gov(eff: Effects, inj: Injection, host: HostSpec, sl: slice, env: np.ndarray) -> None:
    f = CPU_TURBO_MHZ - env * (CPU_TURBO_MHZ - CPU_MIN_MHZ)
    eff.freq_cap[sl] = np.minimum(eff.freq_cap[sl], f)


def _facts_gov(st: FactState, inj: Injection, host: HostSpec) -> None:
    st.governor = "powersave"


def _check_cause(inj: Injection) -> None:
    cause = inj.params.get("cause", "mode_never")
    if cause not in ("mode_never", "fragmentation"):
        raise ValueError(f"injection thp_coverage_loss on {inj.host}: params.cause must be "
                         f"'mode_never' or 'fragmentation', not {cause!r}")


TYPES: dict[str, InjectionType] = {
    t.name: t
    for t in (
        InjectionType(
            "gpu_nic_numa_misplacement", "gpu",
            "the GPU's rank (NCCL proxy, host buffers) runs on the NUMA node far from its NIC",
            lambda h: tuple(g.name for g in h.gpus if g.node == 0), 0.0,
            lambda e, i, h, s, v: _max(e.misplace, _gpus(h, i), s, v),
        ),
        InjectionType(
            "irq_locality_miss", "irq",
            "device IRQs are serviced on CPUs of the far NUMA node",
            lambda h: tuple(x.netdev for x in h.nics if x.node == 0), 0.0, _apply_irq, _facts_irq,
        ),
        InjectionType(
            "thp_coverage_loss", "host",
            "transparent huge pages disabled or fragmented: AnonHugePages share falls",
            lambda h: (), 150.0, _apply_thp, _facts_thp,
        ),
        InjectionType(
            "gpu_power_throttle", "gpu",
            "GPU power limit set below default: power pinned at the limit, SM clock down",
            lambda h: tuple(g.name for g in h.gpus), 0.0, _apply_power, _facts_power,
        ),
        InjectionType(
            "thermal_throttle", "gpu",
            "GPU cooling degraded: temperature at the slowdown point, SM clock down",
            lambda h: (h.gpus[5].name,), 0.0,
            lambda e, i, h, s, v: _max(e.cooling, _gpus(h, i), s, v),
        ),
        InjectionType(
            "pcie_link_degraded", "gpu",
            "GPU PCIe link trained below its maximum generation/width",
            lambda h: (h.gpus[2].name,), 0.0, _apply_pcie, _facts_pcie,
        ),
        InjectionType(
            "cpu_governor_powersave", "host",
            "CPU frequency governor set to powersave: cores run near minimum frequency",
            lambda h: (), 0.0, _apply_gov, _facts_gov,
        ),
        InjectionType(
            "cgroup_cpu_throttle", "host",
            "the workload's cgroup CPU quota is below its demand: CFS throttling",
            lambda h: (), 0.0, lambda e, i, h, s, v: _max(e.quota_cut, None, s, v),
        ),
        InjectionType(
            "memory_bandwidth_contention", "node",
            "a noisy neighbour saturates the memory bandwidth of a NUMA node",
            lambda h: ("0",), 5.0, lambda e, i, h, s, v: _max(e.neighbour, _nodes(h, i), s, v),
        ),
        InjectionType(
            "nic_drops", "nic",
            "NIC receive ring overflows: drops, FIFO overruns, retransmissions",
            lambda h: (h.nics[0].netdev,), 0.0, lambda e, i, h, s, v: _max(e.drops, _nics(h, i), s, v),
        ),
        InjectionType(
            "storage_contention", "disk",
            "foreign I/O on the NVMe data disks: latency and queueing up",
            lambda h: tuple(d.name for d in h.disks), 2.0,
            lambda e, i, h, s, v: _max(e.disk, _disks(h, i), s, v),
        ),
        InjectionType(
            "memory_pressure", "host",
            "host memory nearly exhausted: reclaim, swapping, refaults",
            lambda h: (), 60.0, lambda e, i, h, s, v: _max(e.mempress, None, s, v),
        ),
        # Counter artefacts, not inefficiencies: no label, no throughput cost.
        InjectionType("counter_wrap", "counter", "a raw counter wraps (32 or 64 bit)",
                      lambda h: (), 0.0, lambda e, i, h, s, v: None, label=False),
        InjectionType("counter_reset", "counter", "a raw counter restarts from zero (driver reload)",
                      lambda h: (), 0.0, lambda e, i, h, s, v: None, label=False),
    )
}

INEFFICIENCIES: tuple[str, ...] = tuple(k for k, t in TYPES.items() if t.label)


def validate(inj: Injection, host: HostSpec) -> Injection:
    """Fill default devices and check devices/params against the host; returns the injection."""
    t = TYPES.get(inj.type)
    if t is None:
        raise ValueError(f"unknown injection type {inj.type!r}; known: {', '.join(TYPES)}")
    if not 0.0 < inj.severity <= 1.0:
        raise ValueError(f"injection {inj.type} on {inj.host}: severity must be in (0, 1], got {inj.severity}")
    if inj.duration_s <= 0 or inj.start_s < 0:
        raise ValueError(f"injection {inj.type} on {inj.host}: start must be >= 0 and duration > 0")
    if not t.label:
        return inj
    if t.kind == "host" and inj.devices:
        raise ValueError(f"injection {inj.type} on {inj.host}: takes no devices (host-wide), got {list(inj.devices)}")
    devices = tuple(canonical(host, t.kind, d, inj) for d in inj.devices) or t.default_devices(host)
    out = Injection(inj.type, inj.host, inj.start_s, inj.duration_s, inj.severity, devices, inj.params)
    if inj.type == "thp_coverage_loss":
        _check_cause(out)
    if inj.type == "gpu_power_throttle":
        top = host.gpu_model.power_default_w
        lim = power_limit_w(out.severity, out.params, top)
        if not 100.0 <= lim <= top:
            raise ValueError(f"injection gpu_power_throttle on {inj.host}: limit_w {lim} outside 100..{top:g} W")
    return out


def apply_all(injections: list[Injection], host: HostSpec, a: int, n: int) -> Effects:
    eff = Effects(n, host.n_gpus, len(host.nics), len(host.disks), host.nodes, host.gpu_model.power_default_w,
                  host.gpu_model.pcie_gen)
    for inj in injections:
        t = TYPES[inj.type]
        got = _env(inj, a, n, t.tau_s)
        if got is not None:
            t.apply(eff, inj, host, *got)
    return eff


def facts_at(base: FactState, injections: list[Injection], host: HostSpec, t_s: float) -> FactState:
    """The fact state at ``t_s`` seconds: the healthy state changed by active injections."""
    import copy

    st = copy.deepcopy(base)
    for inj in injections:
        t = TYPES[inj.type]
        if t.facts is not None and inj.start_s <= t_s < inj.end_s:
            t.facts(st, inj, host)
    return st


# ------------------------------------------------------------------ footprints
# What each inefficiency moves: (table, field, tag filter, direction). Filters may name
# the injection's devices with "{dev}" (GPU index / netdev / disk / node), its device's
# NUMA node with "{home}" and the other node with "{far}". docs/simulator.md describes the
# magnitudes; tests/test_simulator.py checks every row against a same-seed healthy run.
# A field "name&BIT" is the share of rows with that bit set.


@dataclass(frozen=True)
class Signal:
    table: str
    field: str
    where: tuple[tuple[str, str], ...] = ()
    direction: int = 1  # +1 rises, -1 falls


def _s(table: str, fld: str, d: int = 1, **where: str) -> Signal:
    return Signal(table, fld, tuple(where.items()), d)


FOOTPRINTS: dict[str, tuple[Signal, ...]] = {
    "gpu_nic_numa_misplacement": (
        _s("numa", "other_node", node="{home}"),
        _s("vmstat", "numa_hint_faults"),
        _s("vmstat", "numa_pages_migrated"),
        _s("vmstat", "pgmigrate_fail"),
        _s("cpu", "user", node="{far}"),
        _s("workload", "throughput", -1),
    ),
    "irq_locality_miss": (
        _s("interrupts", "count", node="{far}"),
        _s("softirqs", "count", softirq="NET_RX", node="{far}"),
        _s("cpu", "softirq", node="{far}"),
        _s("numa", "other_node", node="{home}"),
        _s("workload", "throughput", -1),
    ),
    "thp_coverage_loss": (
        _s("memory", "anon_huge_pages", -1),
        _s("numa", "anon_huge_pages", -1),
        _s("memory", "page_tables"),
        _s("vmstat", "thp_fault_alloc", -1),
        _s("vmstat", "pgfault"),
        _s("vmstat", "numa_pte_updates"),
        _s("cpu", "system"),
        _s("workload", "throughput", -1),
    ),
    "gpu_power_throttle": (
        _s("gpu", "power_limit_w", -1, gpu="{dev}"),
        _s("gpu", "power_w", -1, gpu="{dev}"),
        _s("gpu", "sm_clock_mhz", -1, gpu="{dev}"),
        _s("gpu", "clock_event_reasons&4", 1, gpu="{dev}"),
        _s("gpu", "power_violation", 1, gpu="{dev}"),
        _s("gpu", "temperature_c", -1, gpu="{dev}"),
        _s("gpu", "energy", -1, gpu="{dev}"),
        _s("workload", "throughput", -1),
    ),
    "thermal_throttle": (
        _s("gpu", "temperature_c", 1, gpu="{dev}"),
        _s("gpu", "thermal_violation", 1, gpu="{dev}"),
        _s("gpu", "clock_event_reasons&32", 1, gpu="{dev}"),
        _s("gpu", "sm_clock_mhz", -1, gpu="{dev}"),
        _s("gpu", "power_w", -1, gpu="{dev}"),
        _s("workload", "throughput", -1),
    ),
    "pcie_link_degraded": (
        _s("gpu", "pcie_link_gen", -1, gpu="{dev}"),
        _s("gpu", "pcie_tx", -1, gpu="{dev}"),
        _s("gpu", "pcie_rx", -1, gpu="{dev}"),
        _s("net", "rx_bytes", -1),
        _s("workload", "throughput", -1),
    ),
    "cpu_governor_powersave": (
        _s("cpu", "freq_mhz", -1),
        _s("cpu", "user", 1),
        _s("agent", "sample_time", 1),
        _s("gpu", "util_gpu", -1),
        _s("workload", "throughput", -1),
    ),
    "cgroup_cpu_throttle": (
        _s("cgroup", "nr_throttled", 1, cgroup="workload.slice"),
        _s("cgroup", "throttled_time", 1, cgroup="workload.slice"),
        _s("cgroup", "cpu_quota_cores", -1, cgroup="workload.slice"),
        _s("cgroup", "cpu_pressure_some", 1, cgroup="workload.slice"),
        _s("cgroup", "cpu_usage", -1, cgroup="workload.slice"),
        _s("pressure", "some_avg10", 1, resource="cpu"),
        _s("gpu", "util_gpu", -1),
        _s("workload", "throughput", -1),
    ),
    "memory_bandwidth_contention": (
        _s("cgroup", "cpu_usage", 1, cgroup="neighbour.slice"),
        _s("cgroup", "memory_current", 1, cgroup="neighbour.slice"),
        _s("cpu", "user", 1, node="{dev}"),
        _s("pressure", "some_avg10", 1, resource="cpu"),
        _s("workload", "throughput", -1),
    ),
    "nic_drops": (
        _s("net", "rx_dropped", 1, interface="{dev}"),
        _s("net", "rx_fifo", 1, interface="{dev}"),
        _s("tcp", "retrans_segs", 1),
        _s("softirqs", "count", 1, softirq="NET_RX", node="{home}"),
        _s("cpu", "softirq", 1, node="{home}"),
        _s("workload", "throughput", -1),
    ),
    "storage_contention": (
        _s("disk", "read_time", 1, device="{dev}"),
        _s("disk", "write_time", 1, device="{dev}"),
        _s("disk", "io_time", 1, device="{dev}"),
        _s("disk", "weighted_io_time", 1, device="{dev}"),
        _s("disk", "reads", 1, device="{dev}"),
        _s("cpu", "iowait", 1),
        _s("pressure", "some_avg10", 1, resource="io"),
        _s("workload", "throughput", -1),
    ),
    "memory_pressure": (
        _s("memory", "mem_available", -1),
        _s("memory", "cached", -1),
        _s("vmstat", "pgscan_kswapd", 1),
        _s("vmstat", "pgmajfault", 1),
        _s("vmstat", "pswpout", 1),
        _s("pressure", "some_avg10", 1, resource="memory"),
        _s("cgroup", "memory_pressure_some", 1, cgroup="workload.slice"),
        _s("cgroup", "memory_current", 1, cgroup="neighbour.slice"),
        _s("workload", "throughput", -1),
    ),
}

#: Side effects that are physical but not part of a type's signature (partial overlaps
#: between types): documented, not asserted, and exempt from the "unrelated" check.
ALSO_MOVES: dict[str, tuple[Signal, ...]] = {
    "memory_pressure": (
        _s("vmstat", "thp_fault_fallback"), _s("vmstat", "compact_stall"), _s("vmstat", "pgmigrate_fail"),
        _s("memory", "anon_huge_pages", -1), _s("disk", "read_time"), _s("pressure", "some_avg10", resource="io"),
        _s("cgroup", "nr_throttled", cgroup="workload.slice"),
    ),
    "memory_bandwidth_contention": (_s("memory", "mem_available", -1), _s("vmstat", "pgfault"),
                                    _s("cgroup", "nr_throttled", cgroup="workload.slice")),
    "thp_coverage_loss": (_s("pressure", "some_avg10", resource="memory"),
                          _s("cgroup", "nr_throttled", cgroup="workload.slice")),
    "cpu_governor_powersave": (_s("cgroup", "nr_throttled", cgroup="workload.slice"),),
    "storage_contention": (_s("memory", "dirty"), _s("vmstat", "pgmajfault")),
    "nic_drops": (_s("interrupts", "count"),),
    # the misplaced proxy threads add CPU demand to the job: nearer its quota, throttled more
    # often (visible with the smooth CFS model)
    "gpu_nic_numa_misplacement": (_s("net", "rx_bytes", -1), _s("cgroup", "nr_throttled", cgroup="workload.slice")),
}

#: Signals that no type moves except those whose footprint names them: the "unrelated"
#: pool the tests check stays within its healthy range.
UNRELATED_POOL: tuple[Signal, ...] = (
    _s("gpu", "power_limit_w"),
    _s("gpu", "temperature_c"),
    _s("gpu", "pcie_link_gen"),
    _s("gpu", "clock_event_reasons&32"),
    _s("memory", "mem_available"),
    _s("memory", "anon_huge_pages"),
    _s("vmstat", "pgmajfault"),
    _s("vmstat", "thp_fault_fallback"),
    _s("vmstat", "pgmigrate_fail"),
    _s("disk", "read_time"),
    _s("net", "rx_dropped"),
    _s("net", "rx_fifo"),
    _s("tcp", "retrans_segs"),
    _s("cgroup", "nr_throttled", cgroup="workload.slice"),
    _s("pressure", "some_avg10", resource="memory"),
    _s("pressure", "some_avg10", resource="io"),
)
