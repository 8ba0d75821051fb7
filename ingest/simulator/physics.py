"""From demand (:class:`Trace`) and causes (:class:`Effects`) to the host's physical state.

The model, in one paragraph: every tick's work is split into paths (GPU compute-bound,
GPU memory-bound, communication, host input path, storage path; :class:`Trace` weights).
Each inefficiency stretches the time of the paths it physically slows (a power cap
stretches compute by 1/clock-ratio, a NIC dropping packets stretches inter-node
communication ...). The tick's work then takes ``D = sum(w * stretch)`` times longer:
progress (throughput) is ``1/D`` of healthy, GPU utilisation falls when host-side paths
stretch and stays high when the GPU itself is slowed, and every traffic counter scales
with progress. Synchronous collectives make the slowest GPU/NIC set the pace.
Magnitudes: docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ingest.simulator.bank import CounterBank
from ingest.simulator.injections import Effects
from ingest.simulator.topology import (
    CPU_TURBO_MHZ,
    GPU_HW_SLOWDOWN_C,
    GPU_POWER_DEFAULT_W,
    GPU_POWER_IDLE_W,
    GPU_SLOWDOWN_C,
    PCIE_X16_BPS,
    HostSpec,
)
from ingest.simulator.workloads import Trace

THP_COVERAGE = 0.88  # healthy AnonHugePages / AnonPages with THP "always"
THERMAL_R = 0.062  # degC per W, GPU die to inlet air, healthy HGX cooling
INLET_C = 27.0
TAU_TEMP_S = 12.0

# NVML clocks-event reasons (nvmlClocksEventReason*)
R_IDLE = 0x1
R_SW_POWER = 0x4
R_SW_THERMAL = 0x20
R_HW_THERMAL = 0x40

_PCIE_BPS = np.array([0.0] + [PCIE_X16_BPS[g] for g in range(1, 6)])


#: Per-period CPU demand of the job, relative to its mean (coefficient of variation) for the
#: smooth CFS model. Assumed (no measured per-period distribution for these workloads): a job
#: at 70 % of its quota on average is almost never throttled (< 0.1 % of periods), at 80 %
#: in ~2 %, at 90 % in ~18 %: bursty jobs are throttled well below their quota
#: (docs/simulator.md).
THROTTLE_CV = 0.12


def _phi_cdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF (Abramowitz-Stegun 7.1.26, |error| < 1.5e-7): numpy only."""
    z = np.abs(x) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


def cfs_smooth(demand: np.ndarray, quota: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CFS bandwidth control when the job's demand in each 100 ms period varies around its
    mean (normal, CV :data:`THROTTLE_CV`): (share of periods throttled, expected overage
    E[(D/q - 1)+]). Both grow smoothly with the mean demand: no step at the quota."""
    x = demand / quota
    sig = np.maximum(x * THROTTLE_CV, 1e-9)
    m = (x - 1.0) / sig
    p = _phi_cdf(m)
    over = sig * np.exp(-0.5 * m * m) / np.sqrt(2 * np.pi) + (x - 1.0) * p
    return p, np.maximum(over, 0.0)


@dataclass
class State:
    """Physical state over the fast ticks of one chunk (G = GPUs, N = NICs, D = disks)."""

    r: np.ndarray  # progress: throughput / healthy throughput
    throughput: np.ndarray
    busy: np.ndarray  # (G, n) GPU busy share
    mem_busy: np.ndarray  # (G, n)
    power: np.ndarray  # (G, n) W
    power_limit: np.ndarray  # (G, n)
    clock_ratio: np.ndarray  # (G, n)
    temp: np.ndarray  # (G, n) C
    reasons: np.ndarray  # (G, n) int64 bitmask
    power_capped: np.ndarray  # (G, n) bool
    thermal_capped: np.ndarray  # (G, n) bool
    pcie_tx: np.ndarray  # (G, n) bytes/s
    pcie_rx: np.ndarray
    pcie_gen: np.ndarray  # (G, n) current gen
    pcie_width: np.ndarray
    nvlink: np.ndarray  # (G, n) bytes/s each direction
    nic_bytes: np.ndarray  # (N, n) RDMA bytes/s each direction
    front: np.ndarray  # (n,) frontend bytes/s
    disk_r: np.ndarray  # (D, n) workload read bytes/s
    disk_w: np.ndarray  # (D, n)
    # host CPU in cores per node (nodes, n)
    user: np.ndarray
    system: np.ndarray
    softirq: np.ndarray
    irq: np.ndarray
    iowait: np.ndarray
    neighbour_cores: np.ndarray
    spin: np.ndarray  # (nodes,) cores pinned busy-polling per node
    workload_cores: np.ndarray  # (n,) workload cgroup usage
    demand_cores: np.ndarray  # (n,) workload CPU demand (before the quota)
    quota: np.ndarray  # (n,)
    throttle: np.ndarray  # (n,) share of CFS periods throttled
    freq: np.ndarray  # (n,) CPU MHz under load
    cpu_slow: np.ndarray  # (n,) CPU work stretch
    misplace_cores: np.ndarray  # (nodes, n) extra proxy cores
    remote_bytes: np.ndarray  # (n,) bytes/s crossing the socket interconnect (misplacement, IRQ)
    throttle_time: np.ndarray | None = None  # (n,) share of wall time throttled (smooth CFS model only)


def derive(host: HostSpec, tr: Trace, eff: Effects, rng: np.random.Generator, bank: CounterBank) -> State:
    G, n = host.n_gpus, tr.n
    N, D = len(host.nics), len(host.disks)
    nodes = host.nodes
    u = rng.random((3, G, n))
    gj = 1.0 + 0.03 * (u[0] - 0.5)
    a_c = tr.a_c * gj
    a_m = tr.a_m * gj

    # --- causes -> path stretches that do not depend on GPU clocks
    gpu_nic = np.array([[x.netdev for x in host.nics].index(_nic_of(host, g)) for g in range(G)])
    per_nic = np.bincount(gpu_nic, minlength=N)
    drops = eff.drops.max(axis=0)
    irq_far = eff.irq_far_nic.max(axis=0)
    mis = eff.misplace.max(axis=0)
    nb = eff.neighbour.max(axis=0)
    disk = eff.disk.max(axis=0)
    fr = eff.freq_cap / CPU_TURBO_MHZ
    s_cpu = fr ** -0.8
    thp = eff.thp
    mp = eff.mempress
    # PCIe: GPUDirect RDMA to the NIC and host copies share the GPU's link
    bw = _PCIE_BPS[np.clip(eff.pcie_gen.astype(np.int64), 1, 5)] * (eff.pcie_width / 16.0)
    rdma = np.broadcast_to(tr.net, (G, n))
    need = np.maximum(tr.h2d, tr.d2h) + rdma
    s_pcie = np.maximum(1.0, need / bw).max(axis=0)
    s_comm = (1 + 0.5 * (s_pcie - 1)) * (1 + 0.45 * mis) * (1 + 0.1 * irq_far) * (1 + 1.2 * drops) * (1 + 0.05 * nb)
    ckpt_or_load = tr.w_io > 0.3
    s_io = (1 + 3.0 * disk) * (1 + 1.0 * mp) * (1 + 0.2 * nb) * np.where(ckpt_or_load, s_pcie, 1.0)
    s_io = s_io * (1 + 0.1 * eff.irq_far_disk.max(axis=0))
    cpu_work_slow = s_cpu * (1 + 0.3 * thp) * (1 + 0.4 * nb) * (1 + 0.5 * mp)
    # CPU demand of the workload and the cgroup quota
    quota = tr.quota * (1 - 0.85 * eff.quota_cut)
    proxy = 0.25 * eff.misplace.sum(axis=0)
    demand = tr.cpu_spin + tr.cpu_work * cpu_work_slow + proxy
    if host.smooth_throttle:
        over = 1.0 + cfs_smooth(demand, quota)[1]
    else:
        over = np.maximum(1.0, demand / quota)
    s_cg = 1 + 0.2 * (over - 1)
    s_in = (1 + 0.6 * (s_cpu - 1)) * (1 + 0.3 * thp) * (1 + 0.5 * nb) * (1 + 0.8 * mp) * (1 + 0.05 * irq_far)
    s_in = s_in * (1 + 0.8 * (over - 1))
    rest = np.maximum(0.0, 1 - (tr.w_c + tr.w_m + tr.w_comm + tr.w_in + tr.w_io))
    host_d = (tr.w_c + tr.w_m) * s_cg + tr.w_comm * s_comm + tr.w_in * s_in + tr.w_io * s_io + rest

    # --- GPU power / thermal caps (demand after host-side stalls)
    a_c_h, a_m_h = a_c / host_d, a_m / host_d
    gm = host.gpu_model
    idle_w = gm.idle_w
    # compute-bound work draws 600 W above idle on an H100 (700 W), memory-bound 120 W: the
    # same shares of another model's idle-to-limit range
    span = (gm.power_default_w - idle_w) / (GPU_POWER_DEFAULT_W - GPU_POWER_IDLE_W)
    k_c, k_m = 600.0 * span, 120.0 * span
    p_dem = idle_w + k_c * a_c_h + k_m * a_m_h + 4.0 * (u[1] - 0.5)
    limit = eff.power_limit
    inlet = INLET_C + 8.0 * eff.cooling + bank.ewm("inlet", 2.0 * (rng.random(n) - 0.5), 600.0)
    if host.inlet_offsets_c:
        inlet = inlet + np.asarray(host.inlet_offsets_c)[:, None]
    r_th = THERMAL_R * (1 + 0.9 * eff.cooling)
    t_free = bank.ewm("temp_free", inlet + r_th * np.minimum(p_dem, limit), TAU_TEMP_S * 10)
    therm = t_free > GPU_SLOWDOWN_C
    p_th = (GPU_SLOWDOWN_C - inlet) / r_th
    cap = np.where(therm, np.minimum(limit, p_th), limit)
    capped = p_dem > cap
    ratio = np.where(capped, ((cap - idle_w) / np.maximum(p_dem - idle_w, 1.0)) ** (1 / 2.5), 1.0)
    hw = t_free > GPU_HW_SLOWDOWN_C + 3.0
    ratio = np.where(hw, ratio * 0.85, ratio)
    ratio = np.clip(ratio, 0.2, 1.0)
    s_c_g = 1.0 / ratio
    s_m_g = ratio ** -0.3
    s_c, s_m = s_c_g.max(axis=0), s_m_g.max(axis=0)

    gpu_t = (tr.w_c * s_c + tr.w_m * s_m) * s_cg + tr.w_comm * s_comm + rest
    dd = gpu_t + tr.w_in * s_in + tr.w_io * s_io
    r = 1.0 / dd
    g1 = tr.w_c + tr.w_m + tr.w_comm + rest
    busy_scale = np.where(g1 > 0, (gpu_t / dd) / np.maximum(g1, 1e-9), r)
    busy_h = np.clip(tr.busy * busy_scale, 0.0, 1.0)
    busy = np.clip(busy_h * (1 + 0.04 * (u[2] - 0.5)), 0.0, 1.0)
    wait = s_c_g / s_c  # GPUs faster than the slowest wait in collectives at lower power
    act = np.where(tr.busy > 0, busy_scale, 0.0)
    p_run = idle_w + (k_c * a_c * wait + k_m * a_m) * act + 4.0 * (u[1] - 0.5)
    power = np.where(capped, cap * (0.985 + 0.01 * u[0]), np.minimum(p_run, cap))
    temp = np.where(therm, GPU_SLOWDOWN_C - 1.0 + 1.5 * u[2], t_free)
    temp = np.where(hw, GPU_HW_SLOWDOWN_C + 2 * u[1], temp)
    idle = busy < 0.03
    reasons = (np.where(idle, R_IDLE, 0) | np.where(capped & ~therm, R_SW_POWER, 0)
               | np.where(therm & capped, R_SW_THERMAL, 0) | np.where(hw, R_HW_THERMAL, 0)).astype(np.int64)

    # --- traffic scales with progress
    rd = rdma * r
    pcie_tx = np.minimum(tr.d2h * r + rd, bw)
    pcie_rx = np.minimum(tr.h2d * r + rd, bw)
    # an idle link (no kernels, no DMA) trains down to gen 1 to save power, back up on traffic
    pcie_gen = np.where(idle & (pcie_tx + pcie_rx < 50e6), 1.0, eff.pcie_gen)
    nvlink = np.broadcast_to(tr.nvlink * r, (G, n))
    nic_bytes = np.stack([per_nic[k] * tr.net * r for k in range(N)]) if N else np.zeros((0, n))
    share = np.array([1.0 / D] * D)[:, None]
    disk_r = share * tr.disk_r * r
    disk_w = share * tr.disk_w * np.minimum(1.0, r * 1.0)

    # --- host CPU (cores per node)
    work = tr.cpu_work * r * cpu_work_slow
    wl_demand = tr.cpu_spin + work + proxy
    if host.smooth_throttle:
        thr_share, excess = cfs_smooth(wl_demand, quota)
        wl = wl_demand - quota * excess  # E[min(D, q)]
        throttle = thr_share
        throttle_time = np.clip(quota * excess / np.maximum(wl_demand, 1e-9), 0.0, 1.0)
    else:
        wl = np.minimum(wl_demand, quota)
        throttle = np.clip(np.where(wl_demand > quota, 0.5 + (wl_demand / quota - 1), 0.0), 0, 1)
        throttle_time = None
    scale = wl / np.maximum(wl_demand, 1e-9)
    spin_node = np.full(nodes, tr.cpu_spin / nodes)
    node_of_gpu = np.array([g.node for g in host.gpus])
    far_work = np.zeros((nodes, n))
    mis_cores = np.zeros((nodes, n))
    for g in range(G):
        far = 1 - node_of_gpu[g]
        far_work[far] += eff.misplace[g] * (work / G)
        far_work[node_of_gpu[g]] -= eff.misplace[g] * (work / G)
        mis_cores[far] += 0.25 * eff.misplace[g]
    user = np.zeros((nodes, n))
    system = np.zeros((nodes, n))
    for k in range(nodes):
        node_work = (work / nodes + far_work[k]) * scale + mis_cores[k] * scale
        user[k] = spin_node[k] * scale + 0.85 * node_work
        system[k] = 0.15 * node_work + 0.15
    # page faults without huge pages (a flow: all new faults are 4 KiB from the moment THP is
    # "never"; fragmentation grows with the envelope): ~1 us of kernel time per extra 4 KiB
    # fault (the zeroing is the same bytes either way), reclaim (kswapd), compaction
    small_faults = 1 - (1 - thp) * (1 - eff.thp_never)
    system += (0.01 * small_faults * tr.alloc / 2e4 + 0.8 * mp + 0.05 * thp)[None, :]
    neighbour_cores = 10.0 * eff.neighbour
    # NIC completions / frontend packets -> irq and softirq time where the IRQs run
    irq_c = np.zeros((nodes, n))
    soft_c = np.zeros((nodes, n))
    for k, nic in enumerate(host.nics):
        load = nic_bytes[k] / 8e6 * 2e-6 + eff.drops[k] * 0.6
        far = eff.irq_far_nic[k]
        soft_c[nic.node] += load * (1 - far)
        soft_c[1 - nic.node] += load * far * 1.3  # remote memory makes each packet dearer
        irq_c[nic.node] += 0.2 * load * (1 - far)
        irq_c[1 - nic.node] += 0.2 * load * far
    soft_c[0] += tr.front / 1200.0 * 1.5e-6
    iowait = np.zeros((nodes, n))
    busy_disk = (tr.w_io > 0.01) | (tr.disk_w > 1e8)
    iow = np.where(busy_disk, 0.6, 0.05) * (1 + 6.0 * disk) + 0.5 * mp
    for k in range(nodes):
        iowait[k] = iow / nodes
    remote = (rd.sum(axis=0) / G) * eff.misplace.sum(axis=0) + 0.3 * nic_bytes.sum(axis=0) / max(N, 1) * irq_far
    thr = tr.throughput * r
    if tr.smooth > 1:
        kernel = np.ones(tr.smooth) / tr.smooth
        thr = np.convolve(thr, kernel, mode="same")
    return State(
        r=r, throughput=thr, busy=busy, mem_busy=np.clip(a_m * act, 0, 1), power=power, power_limit=limit,
        clock_ratio=ratio, temp=temp, reasons=reasons, power_capped=capped & ~therm, thermal_capped=therm & capped,
        pcie_tx=pcie_tx, pcie_rx=pcie_rx, pcie_gen=pcie_gen, pcie_width=eff.pcie_width, nvlink=nvlink,
        nic_bytes=nic_bytes, front=tr.front, disk_r=disk_r, disk_w=disk_w, user=user, system=system,
        softirq=soft_c, irq=irq_c, iowait=iowait, neighbour_cores=neighbour_cores, spin=spin_node,
        workload_cores=wl, demand_cores=wl_demand, quota=quota,
        throttle=throttle, throttle_time=throttle_time,
        freq=eff.freq_cap, cpu_slow=cpu_work_slow, misplace_cores=mis_cores, remote_bytes=remote,
    )


def _nic_of(host: HostSpec, g: int) -> str:
    name = host.gpus[g].nic
    return next(x.netdev for x in host.nics if x.name == name)
