"""Measurement frames of one host for one chunk of ticks, in the exact schema of ingest.schema.

Each ``render_<table>`` returns a polars DataFrame with the measurement's columns and dtypes
(``time``, ``host``, tags, fields), rows in time-major order. Counter fields are deltas of
raw cumulative counters (see :mod:`ingest.simulator.bank`). Tables follow the tier the schema
gives them: a medium-tier table averages the fast-tick state over each 1 s row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from ingest import schema
from ingest.simulator.bank import CounterBank, _sub
from ingest.simulator.injections import Effects
from ingest.simulator.physics import THP_COVERAGE, State
from ingest.simulator.topology import (
    CPU_TURBO_MHZ,
    GPU_SM_IDLE_MHZ,
    HOST_MEM_TOTAL,
    HUGEPAGE_SIZE,
    PAGE,
    SWAP_TOTAL,
    HostSpec,
)
from ingest.simulator.workloads import DT, PHASES, TICKS_PER_S, Schedule, Trace

_US = 1_000_000


@dataclass
class Chunk:
    """Everything one chunk's renderers need."""

    host: HostSpec
    a: int  # first fast tick (since the run start)
    n: int  # fast ticks
    t0_us: int  # run start, epoch microseconds
    schedule: Schedule
    trace: Trace
    eff: Effects
    st: State
    bank: CounterBank
    seed: object  # np.random.SeedSequence of the host
    chunk_index: int

    def rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng(_sub(self.seed, name, f"chunk{self.chunk_index}"))  # type: ignore[arg-type]

    def k(self, table: str) -> int:
        """Fast ticks per row of ``table``."""
        return max(1, int(round(schema.TIER_PERIOD_S[schema.get(table).tier] / DT)))

    def times(self, table: str) -> np.ndarray:
        k = self.k(table)
        start = -(-self.a // k)  # rows at multiples of the period
        idx = np.arange(start, (self.a + self.n) // k) if k > 1 else np.arange(self.a, self.a + self.n)
        # like the agent: the first sample (t0) has null deltas, later rows the increase since
        return self.t0_us + idx * k * (_US // TICKS_PER_S)

    def avg(self, table: str, x: np.ndarray) -> np.ndarray:
        """Block mean of a fast-tick array over each row's interval (last axis)."""
        k = self.k(table)
        if k == 1:
            return np.asarray(x, dtype=np.float64)
        x = np.asarray(x, dtype=np.float64)
        m = x.shape[-1] // k
        return x[..., : m * k].reshape(*x.shape[:-1], m, k).mean(axis=-1)

    def row0(self, table: str) -> int:
        k = self.k(table)
        return self.a // k


_NP = {pl.Int64: np.int64, pl.Float32: np.float32, pl.Float64: np.float64}


def _col(name: str, values: np.ndarray, dtype: pl.DataType, nulls: np.ndarray | None = None) -> pl.Series:
    np_t = _NP.get(dtype)  # type: ignore[call-overload]
    if np_t is None:
        out = pl.Series(name, values, dtype=dtype)
        return out if nulls is None or not nulls.any() else out.scatter(np.flatnonzero(nulls), None)
    v = np.ascontiguousarray(values, dtype=np_t)
    if nulls is None:
        return pl.Series(name, v)
    k = int(np.argmin(nulls)) if not nulls.all() else len(nulls)
    if k == 0 and not nulls.any():
        return pl.Series(name, v)
    if not nulls[k:].any():
        # the usual case: the first sample's rows (a prefix, rows being time-major) are null
        return pl.concat([pl.Series(name, [None] * k, dtype=dtype), pl.Series(name, v[k:])], rechunk=False)
    return pl.Series(name, v).scatter(np.flatnonzero(nulls), None)


def frame(
    table: str,
    host: str,
    times_us: np.ndarray,
    tags: dict[str, Sequence[str]],
    fields: dict[str, np.ndarray],
    *,
    valid: np.ndarray | None = None,
    keep: np.ndarray | None = None,
    null_fields: dict[str, np.ndarray] | None = None,
    time_major: bool = False,
) -> pl.DataFrame:
    """Build a measurement frame from (series x ticks) field arrays (ticks x series when
    ``time_major``; a 1-D array is one value per tick, the same for every series).

    Rows are ordered by time, then by the tag values as text - the order the lake sorts
    into, so its sort finds the frame already sorted. ``valid`` (series x ticks) marks
    counter deltas that exist (False -> null); ``keep`` filters rows (sparse tables);
    ``null_fields`` gives per-field null masks (broadcast to series x ticks)."""
    m = schema.get(table)
    n = len(times_us)
    s = len(next(iter(tags.values()))) if tags else 1
    order = sorted(range(s), key=lambda i: tuple(str(tags[t][i]) for t in m.tags)) if tags else [0]
    perm = None if order == list(range(s)) else np.array(order)

    def flat(x: np.ndarray) -> np.ndarray:
        if time_major:
            x = np.asarray(x)
            a2 = np.broadcast_to(x[:, None] if x.ndim == 1 else x, (n, s))
            if perm is not None:
                a2 = a2[:, perm]
            out = a2.ravel()
        else:
            a2 = np.broadcast_to(np.atleast_2d(x), (s, n))
            if perm is not None:
                a2 = a2[perm]
            out = a2.T.ravel() if s > 1 else a2.ravel()
        return out[flat_keep] if flat_keep is not None else out

    flat_keep = None
    if keep is not None:
        flat_keep = flat(keep)
    cols: list[pl.Series] = []
    t = np.repeat(np.asarray(times_us, dtype=np.int64), s) if s > 1 else np.asarray(times_us, dtype=np.int64)
    if flat_keep is not None:
        t = t[flat_keep]
    nrows = len(t)
    cols.append(pl.Series(schema.TIME, t).cast(schema.TIME_DTYPE))
    cols.append(pl.Series(schema.HOST, [host]).gather(np.zeros(nrows, dtype=np.uint32)))
    idx = np.tile(np.arange(s, dtype=np.uint32), n)
    if flat_keep is not None:
        idx = idx[flat_keep]
    for tag in m.tags:
        vals = [str(tags[tag][i]) for i in order]
        cols.append(pl.Series(tag, vals, dtype=pl.String).gather(idx))
    counters = set(m.counters)
    invalid = None
    if valid is not None and not valid.all():
        invalid = ~flat(valid)
    for f in m.fields:
        arr = fields.get(f.name)
        if arr is None:
            cols.append(pl.Series(f.name, [None] * nrows, dtype=f.dtype))
            continue
        v = flat(arr)
        nulls = invalid if f.name in counters else None
        if null_fields and f.name in null_fields:
            nm = flat(null_fields[f.name])
            nulls = nm if nulls is None else (nulls | nm)
        cols.append(_col(f.name, v, f.dtype, nulls))
    df = pl.DataFrame(cols)
    return df


class Counters:
    """Collects the deltas of one table's counters (all through the bank)."""

    def __init__(self, ch: Chunk, table: str, series: list[str], *, time_major: bool = False) -> None:
        self.ch, self.table, self.series = ch, table, series
        self.time_major = time_major
        self.valid: np.ndarray | None = None
        self.out: dict[str, np.ndarray] = {}

    def add(self, name: str, per_row: np.ndarray) -> np.ndarray:
        """``per_row``: true increments per row (series x rows, or rows x series)."""
        inc = np.asarray(per_row) if self.time_major else np.atleast_2d(per_row)
        d, v = self.ch.bank.deltas(self.table, name, self.series, self.ch.row0(self.table), inc,
                                   time_major=self.time_major)
        self.valid = v if self.valid is None else (self.valid & v)
        self.out[name] = d
        return d


# ------------------------------------------------------------------------- cpu


def render_cpu(ch: Chunk) -> pl.DataFrame:
    """Per-CPU time. Built time-major with CPUs in the lake's (text) order, so neither a
    transpose nor the lake's sort has work to do on the largest table."""
    h, st = ch.host, ch.st
    cpn, nodes = h.cpus_per_node, h.nodes
    k = ch.k("cpu")
    rng = ch.rng("cpu")
    ticks = np.float32(100.0 * DT * k)  # USER_HZ ticks per CPU per row
    n = ch.n // k
    C = h.n_cpus
    cpus = sorted(range(C), key=str)  # column j is CPU cpus[j]
    node = np.array([h.cpu_node(c) for c in cpus])
    local = np.array([c - h.cpu_node(c) * cpn for c in cpus])
    av = lambda x: ch.avg("cpu", x).astype(np.float32)  # noqa: E731
    quota_scale = av(st.workload_cores / np.maximum(st.demand_cores, 1e-9))
    spin_n = [int(round(float(st.spin[nd]))) for nd in range(nodes)]
    n_nb = [min(10, cpn - 2 - spin_n[nd]) for nd in range(nodes)]
    spin_col = np.array([2 <= local[j] < 2 + spin_n[node[j]] for j in range(C)])
    house_col = local < 2
    nb_col = np.array([local[j] >= cpn - n_nb[node[j]] for j in range(C)])
    # per-node rates (rows x nodes), then gathered to columns
    rest = np.stack([np.maximum(av(st.user[nd]) - spin_n[nd] * np.float32(0.97) * quota_scale, 0)
                     / max(cpn - spin_n[nd] - 2, 1) for nd in range(nodes)], axis=1)
    nb = np.stack([av(st.neighbour_cores[nd]) / np.float32(10.0) for nd in range(nodes)], axis=1)
    per = lambda x: np.stack([av(x[nd]) / np.float32(cpn) for nd in range(nodes)], axis=1)  # noqa: E731
    noise = np.float32(1.0) + np.float32(0.8) * (rng.random((n, C), dtype=np.float32) - np.float32(0.5))
    noise2 = noise[:, ::-1]
    w_rest = np.where(spin_col, 0.0, np.where(house_col, 0.5, 1.0)).astype(np.float32)
    user = rest[:, node] * w_rest
    user += np.where(spin_col[None, :], (np.float32(0.97) * quota_scale)[:, None], np.float32(0.0))
    user += nb[:, node] * nb_col
    user *= noise
    system = per(st.system)[:, node] * noise2
    system[:, cpus.index(0)] += np.float32(0.02)
    soft = per(st.softirq)[:, node] * noise2
    irq = per(st.irq)[:, node]
    iow = per(st.iowait)[:, node] * noise
    nice = np.full((n, C), 0.003, dtype=np.float32)
    busy = user + system + soft + irq + nice
    over = np.maximum(np.float32(1.0), busy)
    for x in (user, system, soft, irq, nice, busy):
        x /= over
    iow = np.minimum(iow, np.maximum(np.float32(0.0), np.float32(1.0) - busy))
    idle = np.maximum(np.float32(0.0), np.float32(1.0) - busy - iow)
    series = [str(c) for c in cpus]
    cc = Counters(ch, "cpu", series, time_major=True)
    for name, arr in (("user", user), ("nice", nice), ("system", system), ("idle", idle), ("iowait", iow),
                      ("irq", irq), ("softirq", soft)):
        cc.add(name, arr * ticks)
    cc.add("steal", np.zeros((n, C), dtype=np.float32))
    busy_frac = np.minimum(busy - nice, np.float32(1.0))
    fcap = av(st.freq)[:, None]
    healthy = np.float32(2000.0) + np.float32(1000.0) * np.minimum(np.float32(1.0), busy_frac + np.float32(0.3) * noise)
    freq = np.where(fcap < CPU_TURBO_MHZ - 1, fcap * (np.float32(0.98) + np.float32(0.04) * busy_frac), healthy)
    return frame("cpu", h.name, ch.times("cpu"), {"cpu": series, "node": [str(x) for x in node]},
                 {**cc.out, "freq_mhz": np.round(freq)}, valid=cc.valid, time_major=True)


# ---------------------------------------------------------------------- system


def render_system(ch: Chunk) -> pl.DataFrame:
    st = ch.st
    k = ch.k("system")
    dt = DT * k
    rng = ch.rng("system")
    cores = (st.user + st.system + st.softirq).sum(axis=0) + st.neighbour_cores.sum(axis=0)
    blocked_f = st.iowait.sum(axis=0) * 1.5
    n = ch.n // k
    cc = Counters(ch, "system", [""])
    ctxt = ch.avg("system", 15e3 + 4e3 * cores + 3e3 * ch.trace.busy) * dt * (1 + 0.1 * (rng.random(n) - 0.5))
    cc.add("ctxt", ctxt[None, :])
    cc.add("forks", rng.poisson(3.0 * dt, n)[None, :].astype(np.float64))
    running = np.maximum(1, np.round(ch.avg("system", cores) + rng.normal(0, 0.8, n)))
    blocked = rng.poisson(ch.avg("system", blocked_f)).astype(np.float64)
    load = ch.bank.ewm("load1", running + blocked, 60.0 / dt)
    # the kernel updates loadavg every 5 s
    hold = max(1, int(round(5.0 / dt)))
    r0 = ch.row0("system")
    pos = (r0 + np.arange(n)) % hold
    idx = np.maximum(np.arange(n) - pos, 0)
    load = load[idx]
    return frame("system", ch.host.name, ch.times("system"), {},
                 {**cc.out, "procs_running": running, "procs_blocked": blocked, "load1": np.round(load, 2)},
                 valid=cc.valid)


# ------------------------------------------------------------------------- gpu


def render_gpu(ch: Chunk) -> pl.DataFrame:
    h, st, tr = ch.host, ch.st, ch.trace
    k = ch.k("gpu")
    dt = DT * k
    G = h.n_gpus
    rng = ch.rng("gpu")
    n = ch.n // k
    av = lambda x: ch.avg("gpu", x)  # noqa: E731
    busy = av(st.busy)
    util = np.clip(np.round(100 * busy + rng.normal(0, 1.0, (G, n)) * (busy > 0.02)), 0, 100)
    mem_util = np.clip(np.round(100 * av(st.mem_busy) * 0.9), 0, 100)
    ratio = av(st.clock_ratio)
    gm = h.gpu_model
    sm = np.where(busy > 0.03, np.round(gm.sm_max_mhz * ratio / 15.0) * 15.0, GPU_SM_IDLE_MHZ)
    t_s = (ch.a + np.arange(ch.n)) / TICKS_PER_S
    if ch.schedule.kind == "training":
        frac = np.clip(t_s / max(ch.schedule.load_s, 1.0), 0, 1)
        used = 2e9 + 72e9 * frac + 1.5e9 * (tr.phase == PHASES.index("checkpoint"))
    else:
        frac = np.clip(t_s / max(ch.schedule.load_s * 0.8, 1.0), 0, 1)
        used = 1e9 + 0.9 * gm.mem_total * frac
    mem_used = np.broadcast_to(np.round(av(used) / 2**20) * 2**20, (G, n)) + (np.arange(G)[:, None] * 2**20)
    power = av(st.power)
    cc = Counters(ch, "gpu", [g.name for g in h.gpus])
    cc.add("energy", power * dt * 1000.0)
    cc.add("power_violation", av(st.power_capped.astype(np.float64)) * dt * 1e9)
    cc.add("thermal_violation", av(st.thermal_capped.astype(np.float64)) * dt * 1e9)
    cc.add("nvlink_tx", av(st.nvlink) * dt / 1024.0)
    cc.add("nvlink_rx", av(st.nvlink) * dt / 1024.0 * (1 + 0.002 * (rng.random((G, n)) - 0.5)))
    cc.add("ecc_corrected", rng.poisson(dt / 21600.0, (G, n)).astype(np.float64))
    cc.add("ecc_uncorrected", np.zeros((G, n)))
    cc.add("xid_events", np.zeros((G, n)))
    reasons = st.reasons if k == 1 else np.bitwise_or.reduce(st.reasons[:, : n * k].reshape(G, n, k), axis=2)
    pj = 1 + 0.06 * (rng.random((G, n)) - 0.5)
    f = {
        **cc.out,
        "util_gpu": util,
        "util_mem": mem_util,
        "mem_used": mem_used,
        "mem_total": np.full((G, n), gm.mem_total),
        "power_w": np.round(power, 2),
        "power_limit_w": av(st.power_limit),
        "power_limit_default_w": np.full((G, n), gm.power_default_w),
        "sm_clock_mhz": sm,
        "sm_clock_max_mhz": np.full((G, n), gm.sm_max_mhz),
        "mem_clock_mhz": np.full((G, n), gm.mem_max_mhz),
        "mem_clock_max_mhz": np.full((G, n), gm.mem_max_mhz),
        "temperature_c": np.round(av(st.temp)),
        "clock_event_reasons": reasons,
        "pcie_tx": np.round(av(st.pcie_tx) * pj / 1024.0),
        "pcie_rx": np.round(av(st.pcie_rx) / pj / 1024.0),
        "pcie_link_gen": np.round(av(st.pcie_gen)),
        "pcie_link_gen_max": np.full((G, n), float(gm.pcie_gen)),
        "pcie_link_width": av(st.pcie_width),
        "pcie_link_width_max": np.full((G, n), 16.0),
        "last_xid": np.zeros((G, n)),
    }
    return frame("gpu", h.name, ch.times("gpu"), {"gpu": [g.name for g in h.gpus], "uuid": [g.uuid for g in h.gpus]},
                 f, valid=cc.valid)


# ------------------------------------------------------------------ interrupts


def _irq_rates(ch: Chunk, table: str) -> tuple[list[tuple[str, str, int, int]], np.ndarray, np.ndarray]:
    """Per IRQ line: (irq, action, home node, far node), rate on home, rate on far (per s)."""
    h, st = ch.host, ch.st
    nics = {x.name: i for i, x in enumerate(h.nics)}
    disks = {d.ctrl: i for i, d in enumerate(h.disks)}
    lines, home, far = [], [], []
    for q in h.irqs:
        if q.device in nics:
            i = nics[q.device]
            rate = 200.0 + st.nic_bytes[i] / 8e6 * (1 + 2.0 * ch.eff.drops[i])
            # lines [0, share x queues) are the moved ones
            f = (q.slot + 0.5 < ch.eff.irq_far_nic[i] * h.nic_queues).astype(np.float64)
            rate = rate / h.nic_queues
        else:
            i = disks[q.device]
            ios = st.disk_r[i] / 131072.0 + st.disk_w[i] / 1048576.0 + 20.0 + 30000.0 * ch.eff.disk[i]
            rate = ios / h.disk_queues
            f = (q.slot + 0.5 < ch.eff.irq_far_disk[i] * h.disk_queues).astype(np.float64)
        lines.append((str(q.number), q.action, q.node, 1 - q.node))
        home.append(ch.avg(table, rate * (1 - f)))
        far.append(ch.avg(table, rate * f))
    return lines, np.array(home), np.array(far)


def render_interrupts(ch: Chunk) -> pl.DataFrame:
    k = ch.k("interrupts")
    dt = DT * k
    lines, home, far = _irq_rates(ch, "interrupts")
    nodes = ch.host.nodes
    series, irq_t, dev_t, node_t = [], [], [], []
    rates = []
    for j, (irq, action, hn, fn) in enumerate(lines):
        for nd in range(nodes):
            series.append(f"{irq}:{nd}")
            irq_t.append(irq)
            dev_t.append(action)
            node_t.append(str(nd))
            rates.append(home[j] if nd == hn else (far[j] if nd == fn else np.zeros_like(home[j])))
    rng = ch.rng("interrupts")
    r = np.array(rates) * dt
    r = np.where(r > 0, r * (1 + 0.1 * (rng.random(r.shape) - 0.5)), 0.0)
    cc = Counters(ch, "interrupts", series)
    d = cc.add("count", r)
    keep = (d != 0) | ~cc.valid if cc.valid is not None else d != 0
    return frame("interrupts", ch.host.name, ch.times("interrupts"), {"irq": irq_t, "device": dev_t, "node": node_t},
                 cc.out, valid=cc.valid, keep=keep)


SOFTIRQS = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU")


def render_softirqs(ch: Chunk) -> pl.DataFrame:
    h, st = ch.host, ch.st
    k = ch.k("softirqs")
    dt = DT * k
    nodes = h.nodes
    lines, home, far = _irq_rates(ch, "softirqs")
    nic_irq = np.zeros((nodes, home.shape[1]))
    blk_irq = np.zeros((nodes, home.shape[1]))
    for j, q in enumerate(h.irqs):
        tgt = nic_irq if q.device.startswith("mlx5") else blk_irq
        tgt[q.node] += home[j]
        tgt[1 - q.node] += far[j]
    busy = ch.avg("softirqs", st.user + st.system + st.neighbour_cores)
    cpn = h.cpus_per_node
    front_pk = ch.avg("softirqs", st.front) / 1200.0
    drops = ch.avg("softirqs", ch.eff.drops.max(axis=0))
    rows = []
    series = []
    for name in SOFTIRQS:
        for nd in range(nodes):
            if name == "TIMER":
                v = busy[nd] * 250.0 + (cpn - busy[nd]) * 8.0
            elif name == "NET_RX":
                v = nic_irq[nd] * (1 + 3 * drops) + (front_pk if nd == 0 else 0.0)
            elif name == "NET_TX":
                v = (front_pk / 16.0 if nd == 0 else 0.0) + 0.2 * nic_irq[nd]
            elif name == "BLOCK":
                v = blk_irq[nd]
            elif name == "TASKLET":
                v = nic_irq[nd]
            elif name == "SCHED":
                v = busy[nd] * 120.0 + 30.0
            elif name == "RCU":
                v = busy[nd] * 90.0 + 40.0
            elif name == "HRTIMER":
                v = np.full_like(busy[nd], 4.0)
            else:
                v = np.zeros_like(busy[nd])
            rows.append(np.broadcast_to(v, busy[nd].shape))
            series.append(f"{name}:{nd}")
    rng = ch.rng("softirqs")
    r = np.array(rows) * dt
    r = r * (1 + 0.1 * (rng.random(r.shape) - 0.5))
    cc = Counters(ch, "softirqs", series)
    d = cc.add("count", r)
    keep = (d != 0) | ~cc.valid if cc.valid is not None else d != 0
    return frame("softirqs", h.name, ch.times("softirqs"),
                 {"softirq": [s.split(":")[0] for s in series], "node": [s.split(":")[1] for s in series]},
                 cc.out, valid=cc.valid, keep=keep)


# ---------------------------------------------------------------------- memory


@dataclass
class _Mem:
    anon: np.ndarray
    cached: np.ndarray
    free: np.ndarray
    available: np.ndarray
    ahp: np.ndarray
    page_tables: np.ndarray
    dirty: np.ndarray
    writeback: np.ndarray
    swapped: np.ndarray
    neighbour_anon: np.ndarray
    coverage: np.ndarray


def _memory_state(ch: Chunk, table: str) -> _Mem:
    st, tr, eff = ch.st, ch.trace, ch.eff
    av = lambda x: ch.avg(table, x)  # noqa: E731
    mp = av(eff.mempress)
    nb = av(eff.neighbour.sum(axis=0))
    wl_anon = av(tr.anon)
    system = 14e9
    neighbour_anon = 4e9 + 30e9 * nb
    slab = 18e9
    driver = 24e9  # pinned / driver memory
    base_cache = 420e9
    used_nocache = wl_anon + system + neighbour_anon + slab + driver
    headroom = HOST_MEM_TOTAL - used_nocache - base_cache
    # a leak in the neighbour eats the free memory (up to severity 0.4), then the page
    # cache as reclaim holds free memory near the low watermark
    leak = headroom * np.minimum(1.0, mp / 0.4) + base_cache * 0.97 * np.clip((mp - 0.4) / 0.6, 0.0, 1.0)
    neighbour_anon = neighbour_anon + leak
    cached = np.maximum(base_cache - np.maximum(leak - headroom, 0.0), base_cache * 0.03)
    anon = wl_anon + system + neighbour_anon
    cov = THP_COVERAGE * (1 - av(eff.thp)) * (1 - 0.15 * mp)
    ahp = np.round(cov * wl_anon / HUGEPAGE_SIZE) * HUGEPAGE_SIZE
    page_tables = (anon - ahp) / 512.0 + 64e6
    free = HOST_MEM_TOTAL - anon - cached - slab - driver - page_tables
    free = np.maximum(free, 2.5e9 + 1e9 * (1 - mp))
    available = free + 0.9 * cached
    disk_w = av(st.disk_w.sum(axis=0))
    slow = 1 + 8 * av(eff.disk.max(axis=0))
    dirty = 20e6 + disk_w * 2.0 * slow
    writeback = 1e6 + disk_w * 0.3 * slow
    swapped = np.clip(mp - 0.3, 0, None) / 0.7 * SWAP_TOTAL * 0.6
    return _Mem(anon, cached, free, available, ahp, page_tables, dirty, writeback, swapped, neighbour_anon, cov)


def render_memory(ch: Chunk) -> pl.DataFrame:
    m = _memory_state(ch, "memory")
    n = len(m.anon)
    rng = ch.rng("memory")
    jit = 1 + 0.002 * (rng.random(n) - 0.5)
    kb = lambda x: np.round(np.asarray(x) / 1024.0) * 1024  # noqa: E731  meminfo has kB resolution
    f = {
        "mem_total": np.full(n, HOST_MEM_TOTAL),
        "mem_free": kb(m.free * jit),
        "mem_available": kb(m.available * jit),
        "cached": kb(m.cached),
        "dirty": kb(m.dirty),
        "writeback": kb(m.writeback),
        "anon_pages": kb(m.anon),
        "anon_huge_pages": kb(m.ahp),
        "shmem": np.full(n, 2.1e9),
        "page_tables": kb(m.page_tables),
        "swap_total": np.full(n, SWAP_TOTAL),
        "swap_free": kb(SWAP_TOTAL - m.swapped),
        "hugepages_total": np.zeros(n),
        "hugepages_free": np.zeros(n),
        "hugepages_rsvd": np.zeros(n),
        "hugepagesize": np.full(n, HUGEPAGE_SIZE),
    }
    return frame("memory", ch.host.name, ch.times("memory"), {}, f)


def _vm_rates(ch: Chunk, table: str) -> dict[str, np.ndarray]:
    """Per-second event rates of /proc/vmstat (host-wide)."""
    st, tr, eff = ch.st, ch.trace, ch.eff
    av = lambda x: ch.avg(table, x)  # noqa: E731
    mp = av(eff.mempress)
    thp = av(eff.thp)
    never = av(eff.thp_never)
    frag = thp * (1 - never)
    mis = av(eff.misplace.sum(axis=0))
    nb = av(eff.neighbour.sum(axis=0))
    alloc = av(tr.alloc * st.r) + 1500.0 * nb
    cov = THP_COVERAGE * (1 - thp)
    # faults are a flow: with THP "never" every new fault is a 4 KiB one from the moment the
    # mode changes, while the coverage (a stock) only decays as memory turns over
    cov_new = cov * (1 - never)
    alloc_b = alloc * PAGE
    r: dict[str, np.ndarray] = {}
    r["thp_fault_alloc"] = cov_new * alloc_b / HUGEPAGE_SIZE + 0.2
    r["thp_fault_fallback"] = (THP_COVERAGE - cov) * (1 - never) * alloc_b / HUGEPAGE_SIZE + 40.0 * mp
    r["pgfault"] = (1 - cov_new) * alloc + r["thp_fault_alloc"] + 18e3 + 2e3 * nb
    r["pgmajfault"] = 1.5 + 3000.0 * mp
    r["pswpout"] = np.clip(mp - 0.3, 0, None) * 6000.0
    r["pswpin"] = r["pswpout"] * 0.5
    r["pgscan_kswapd"] = mp * 400e3 + 10.0
    r["pgsteal_kswapd"] = r["pgscan_kswapd"] * 0.8
    r["pgscan_direct"] = np.clip(mp - 0.5, 0, None) * 300e3
    r["pgsteal_direct"] = r["pgscan_direct"] * 0.6
    r["allocstall_normal"] = np.clip(mp - 0.5, 0, None) * 2000.0
    r["compact_stall"] = 150.0 * frag + 80.0 * mp + 0.02
    r["compact_fail"] = r["compact_stall"] * 0.7
    r["compact_success"] = r["compact_stall"] * 0.3
    r["thp_collapse_alloc"] = 0.5 * (1 - never) * (1 - 0.8 * frag)
    r["thp_collapse_alloc_failed"] = 3.0 * frag + 0.01
    r["thp_split_page"] = 0.1 + 6.0 * frag + 10.0 * mp
    r["numa_pte_updates"] = 20e3 * (1 + 3.0 * (1 - cov / THP_COVERAGE))
    hint_local = 3000.0 * (1 + 0.2 * nb)
    remote = 120.0 + 6000.0 * mis + av(ch.st.remote_bytes) / 4e6
    r["numa_hint_faults"] = hint_local + remote
    r["numa_hint_faults_local"] = hint_local
    r["numa_pages_migrated"] = 40.0 + 2000.0 * mis
    r["pgmigrate_success"] = r["numa_pages_migrated"] + 100.0 * r["compact_success"]
    r["pgmigrate_fail"] = 0.5 + 800.0 * mis + 50.0 * r["compact_fail"]
    return r


def _numa_rates(ch: Chunk, table: str) -> dict[str, np.ndarray]:
    """Per-node numastat rates (nodes x rows)."""
    h, st, tr, eff = ch.host, ch.st, ch.trace, ch.eff
    av = lambda x: ch.avg(table, x)  # noqa: E731
    nodes = h.nodes
    alloc = av(tr.alloc * st.r)
    mp = av(eff.mempress)
    out = {k: np.zeros((nodes, len(alloc))) for k in
           ("numa_hit", "numa_miss", "numa_foreign", "interleave_hit", "local_node", "other_node")}
    for nd in range(nodes):
        a = alloc / nodes + 1500.0 * av(eff.neighbour[nd]) + 800.0
        # rank threads on the far node allocating staging buffers on the NIC's node
        mis = sum(av(eff.misplace[g.index]) for g in h.gpus if g.node == nd)
        irqf = sum(av(eff.irq_far_nic[i]) * av(st.nic_bytes[i]) / 8e6 for i, x in enumerate(h.nics) if x.node == nd)
        other = 0.02 * a + 3000.0 * mis + 0.5 * irqf
        miss = 0.001 * a + mp * 0.3 * a
        out["numa_hit"][nd] = a + 3000.0 * mis + 0.5 * irqf
        out["local_node"][nd] = out["numa_hit"][nd] - other
        out["other_node"][nd] = other
        out["numa_miss"][nd] = miss
        out["interleave_hit"][nd] = 12.0
    out["numa_foreign"] = out["numa_miss"][::-1].copy()
    return out


def render_vmstat(ch: Chunk) -> pl.DataFrame:
    k = ch.k("vmstat")
    dt = DT * k
    r = _vm_rates(ch, "vmstat")
    nm = _numa_rates(ch, "vmstat")
    r["numa_hit"] = nm["numa_hit"].sum(axis=0)
    r["numa_miss"] = nm["numa_miss"].sum(axis=0)
    r["numa_foreign"] = nm["numa_foreign"].sum(axis=0)
    r["numa_local"] = nm["local_node"].sum(axis=0)
    r["numa_other"] = nm["other_node"].sum(axis=0)
    rng = ch.rng("vmstat")
    cc = Counters(ch, "vmstat", [""])
    for name in schema.VMSTAT_COUNTERS:
        mean = r[name] * dt
        v = rng.poisson(mean).astype(np.float64) if np.all(mean < 50) else mean * (1 + 0.05 * (rng.random(len(mean)) - 0.5))
        cc.add(name, v[None, :])
    return frame("vmstat", ch.host.name, ch.times("vmstat"), {}, cc.out, valid=cc.valid)


def render_numa(ch: Chunk) -> pl.DataFrame:
    h = ch.host
    k = ch.k("numa")
    dt = DT * k
    nm = _numa_rates(ch, "numa")
    mem = _memory_state(ch, "numa")
    series = [str(n) for n in range(h.nodes)]
    cc = Counters(ch, "numa", series)
    rng = ch.rng("numa")
    for name, v in nm.items():
        cc.add(name, v * dt * (1 + 0.05 * (rng.random(v.shape) - 0.5)))
    split = np.array([0.52, 0.48])[: h.nodes, None]
    f = {**cc.out,
         "mem_free": np.round(mem.free[None, :] * split / 4096) * 4096,
         "anon_huge_pages": np.round(mem.ahp[None, :] * 0.5 / HUGEPAGE_SIZE) * HUGEPAGE_SIZE}
    return frame("numa", h.name, ch.times("numa"), {"node": series}, f, valid=cc.valid)


# -------------------------------------------------------------------- pressure


def render_pressure(ch: Chunk) -> pl.DataFrame:
    st, eff = ch.st, ch.eff
    k = ch.k("pressure")
    dt = DT * k
    av = lambda x: ch.avg("pressure", x)  # noqa: E731
    rng = ch.rng("pressure")
    n = ch.n // k
    ckpt = av((st.disk_w.sum(axis=0) > 1e9).astype(np.float64))
    thp_frag = av(eff.thp * (1 - eff.thp_never))
    cpu_some = 0.4 + 12.0 * av(st.throttle) + 6.0 * av(eff.neighbour.max(axis=0)) + 3.0 * (1 - av(st.freq) / CPU_TURBO_MHZ)
    mem_some = 35.0 * av(eff.mempress) + 3.0 * thp_frag
    mem_full = 12.0 * av(eff.mempress) + 0.5 * thp_frag
    io_some = 3.0 * ckpt + 40.0 * av(eff.disk.max(axis=0)) + 10.0 * av(eff.mempress) + 0.1
    io_full = 0.4 * io_some
    some = np.stack([cpu_some, mem_some, io_some])
    full = np.stack([np.zeros(n), mem_full, io_full])
    jit = rng.random((2, 3, n))
    some = np.clip(some * (0.6 + 0.8 * jit[0]), 0, 100)
    full = np.clip(full * (0.6 + 0.8 * jit[1]), 0, 100)
    series = ["cpu", "memory", "io"]
    cc = Counters(ch, "pressure", series)
    cc.add("some_total", some / 100.0 * dt * _US)
    cc.add("full_total", full / 100.0 * dt * _US)
    s10 = ch.bank.ewm("psi_some", some, 10.0 / dt)
    f10 = ch.bank.ewm("psi_full", full, 10.0 / dt)
    return frame("pressure", ch.host.name, ch.times("pressure"), {"resource": series},
                 {**cc.out, "some_avg10": np.round(s10, 2), "full_avg10": np.round(f10, 2)}, valid=cc.valid)


# ------------------------------------------------------------------- network


def render_net(ch: Chunk) -> pl.DataFrame:
    h, st, eff = ch.host, ch.st, ch.eff
    k = ch.k("net")
    dt = DT * k
    rng = ch.rng("net")
    names = list(h.all_netdevs)
    nn = len(names)
    rx_b = np.zeros((nn, ch.n // k))
    tx_b = np.zeros_like(rx_b)
    for i in range(len(h.nics)):
        b = ch.avg("net", st.nic_bytes[i])
        rx_b[i] = b * (1 + 0.01 * (rng.random(len(b)) - 0.5))
        tx_b[i] = b
    fr = ch.avg("net", st.front)
    rx_b[-1] = fr * 0.4 + 2e3
    tx_b[-1] = fr * 0.6 + 2e3
    rx_p = rx_b / 4096.0 + 5.0
    tx_p = tx_b / 4096.0 + 5.0
    rx_p[-1] = rx_b[-1] / 900.0
    tx_p[-1] = tx_b[-1] / 1200.0
    drop = np.zeros_like(rx_b)
    for i in range(len(h.nics)):
        drop[i] = ch.avg("net", eff.drops[i]) * 2e-3
    cc = Counters(ch, "net", names)
    cc.add("rx_bytes", rx_b * dt)
    cc.add("rx_packets", rx_p * dt)
    cc.add("rx_errors", np.zeros_like(rx_b))
    benign = np.zeros_like(rx_b)
    benign[-1] = rng.poisson(0.2 * dt, rx_b.shape[1])  # unknown-protocol drops on the mgmt port
    if h.baseline_drops > 0:
        # healthy RDMA NICs drop a few packets in micro-bursts (rx_out_of_buffer): a Poisson
        # count whose rate is gamma-mixed per second (shape 0.2: most seconds none, a few many)
        brng = ch.rng("net_baseline")
        nn_r = len(h.nics)
        burst = brng.gamma(0.2, 5.0, (nn_r, rx_b.shape[1]))
        benign[:nn_r] = brng.poisson(h.baseline_drops * rx_p[:nn_r] * dt * burst)
    cc.add("rx_dropped", rx_p * dt * drop * 0.4 + benign)
    cc.add("rx_fifo", rx_p * dt * drop * 0.6)
    cc.add("tx_bytes", tx_b * dt)
    cc.add("tx_packets", tx_p * dt)
    cc.add("tx_errors", np.zeros_like(rx_b))
    cc.add("tx_dropped", np.zeros_like(rx_b))
    return frame("net", h.name, ch.times("net"), {"interface": names}, cc.out, valid=cc.valid)


def render_tcp(ch: Chunk) -> pl.DataFrame:
    st, eff = ch.st, ch.eff
    k = ch.k("tcp")
    dt = DT * k
    rng = ch.rng("tcp")
    fr = ch.avg("tcp", st.front)
    segs_in = fr * 0.4 / 900.0 + 400.0
    segs_out = fr * 0.6 / 1200.0 + 400.0
    drops = ch.avg("tcp", eff.drops.max(axis=0))
    cc = Counters(ch, "tcp", [""])
    cc.add("in_segs", segs_in[None, :] * dt)
    cc.add("out_segs", segs_out[None, :] * dt)
    cc.add("retrans_segs", (rng.poisson(segs_out * dt * (2e-5 + 8e-3 * drops)))[None, :].astype(np.float64))
    cc.add("in_errs", np.zeros((1, len(fr))))
    opens = 1.0 + 0.02 * ch.avg("tcp", st.front) / 8e3
    cc.add("active_opens", rng.poisson(opens * dt)[None, :].astype(np.float64))
    return frame("tcp", ch.host.name, ch.times("tcp"), {}, cc.out, valid=cc.valid)


# ---------------------------------------------------------------------- disk


def render_disk(ch: Chunk) -> pl.DataFrame:
    h, st, eff = ch.host, ch.st, ch.eff
    k = ch.k("disk")
    dt = DT * k
    rng = ch.rng("disk")
    names = [d.name for d in h.disks]
    rb = ch.avg("disk", st.disk_r)
    wb = ch.avg("disk", st.disk_w)
    c = ch.avg("disk", eff.disk)
    mp = ch.avg("disk", eff.mempress)[None, :]
    # foreign I/O (another tenant, a RAID resync): 4 KiB random reads and 128 KiB writes
    f_reads = 30000.0 * c
    f_writes = 8000.0 * c
    reads = rb / 131072.0 + f_reads + 3.0 + 400.0 * mp
    writes = wb / 1048576.0 + f_writes + 2.0
    r_sect = (rb + f_reads * 4096 + 400.0 * mp * 65536) / 512.0
    w_sect = (wb + f_writes * 131072) / 512.0
    lat_r = 0.09 * (1 + 25.0 * c) + 0.02 * (rb > 5e8)
    lat_w = 0.05 * (1 + 40.0 * c) + 0.6 * (wb > 1e8)
    busy_ms = reads * lat_r + writes * lat_w
    in_flight = busy_ms / 1000.0
    io_time = 1000.0 * (1 - np.exp(-in_flight * 1.2))
    jit = 1 + 0.08 * (rng.random(rb.shape) - 0.5)
    cc = Counters(ch, "disk", names)
    cc.add("reads", reads * dt * jit)
    cc.add("read_sectors", r_sect * dt * jit)
    cc.add("read_time", reads * lat_r * dt * jit)
    cc.add("writes", writes * dt)
    cc.add("write_sectors", w_sect * dt)
    cc.add("write_time", writes * lat_w * dt)
    cc.add("io_time", io_time * dt * jit)
    cc.add("weighted_io_time", busy_ms * dt * jit)
    inflight_now = rng.poisson(np.maximum(in_flight, 0.0)).astype(np.float64)
    return frame("disk", h.name, ch.times("disk"), {"device": names}, {**cc.out, "in_flight": inflight_now},
                 valid=cc.valid)


# -------------------------------------------------------------------- cgroup

CGROUPS = ("system.slice", "workload.slice", "neighbour.slice")


def render_cgroup(ch: Chunk) -> pl.DataFrame:
    st, eff = ch.st, ch.eff
    k = ch.k("cgroup")
    dt = DT * k
    av = lambda x: ch.avg("cgroup", x)  # noqa: E731
    n = ch.n // k
    mem = _memory_state(ch, "cgroup")
    wl = av(st.workload_cores)
    nb = av(st.neighbour_cores.sum(axis=0)) + 0.05
    thr = av(st.throttle)
    quota = av(st.quota)
    mp = av(eff.mempress)
    periods = 1.0 / 0.1  # CFS period 100 ms
    usage = np.stack([np.full(n, 0.3 * ch.host.nodes), wl, nb]) * dt * _US
    nr_periods = np.stack([np.zeros(n), np.full(n, periods * dt), np.full(n, periods * dt)])
    # bursty threads hit a quota now and then even when the mean demand is below it
    ratio = np.minimum(av(st.demand_cores) / quota, 1.0)
    rng = ch.rng("cgroup")
    if st.throttle_time is None:
        benign = rng.poisson(periods * 0.02 * np.exp(-(1.0 - ratio) / 0.1) * dt).astype(np.float64)
        forced = thr * periods * dt
        nr_thr = np.stack([np.zeros(n), np.minimum(forced + benign, periods * dt), np.zeros(n)])
        over = np.maximum(0.0, 1.0 - quota / np.maximum(av(st.demand_cores), 1e-9))
        thr_time = np.stack([np.zeros(n), (forced * over * 0.1 + benign * 0.005) * _US, np.zeros(n)])
        th = np.clip(thr + benign / (periods * dt), 0, 1)
    else:
        # smooth model: each 100 ms period throttles with the physics' probability; the
        # throttled time follows the expected excess demand (both grow smoothly with demand)
        k_thr = ch.rng("cgroup_cfs").binomial(int(round(periods * dt)), np.clip(thr, 0.0, 1.0)).astype(np.float64)
        nr_thr = np.stack([np.zeros(n), k_thr, np.zeros(n)])
        thr_time = np.stack([np.zeros(n), av(st.throttle_time) * dt * _US, np.zeros(n)])
        th = np.clip(thr, 0, 1)
    cpu_p = np.stack([np.full(n, 0.002), 0.6 * th + 0.004, 0.05 * av(eff.neighbour.max(axis=0)) + 0.002]) * dt * _US
    mem_p = np.stack([0.05 * mp, 0.4 * mp, 0.5 * mp]) * dt * _US
    cc = Counters(ch, "cgroup", list(CGROUPS))
    cc.add("cpu_usage", usage)
    cc.add("nr_periods", nr_periods)
    cc.add("nr_throttled", nr_thr)
    cc.add("throttled_time", thr_time)
    cc.add("cpu_pressure_some", cpu_p)
    cc.add("memory_pressure_some", mem_p)
    wl_mem = av(ch.trace.anon) + 20e9
    mem_cur = np.stack([np.full(n, 6.2e9), wl_mem, mem.neighbour_anon])
    f = {**cc.out,
         "cpu_quota_cores": np.stack([np.zeros(n), np.round(quota, 2), np.full(n, 16.0)]),
         "memory_current": np.round(mem_cur / 4096) * 4096,
         "memory_max": np.stack([np.zeros(n), np.full(n, 1.8e12), np.zeros(n)])}
    nulls = {"cpu_quota_cores": np.array([True, False, False])[:, None],
             "memory_max": np.array([True, False, True])[:, None]}
    return frame("cgroup", ch.host.name, ch.times("cgroup"), {"cgroup": list(CGROUPS)}, f, valid=cc.valid,
                 null_fields=nulls)


# ---------------------------------------------------------------------- perf


def render_perf(ch: Chunk) -> pl.DataFrame:
    h, st, eff = ch.host, ch.st, ch.eff
    k = ch.k("perf")
    dt = DT * k
    av = lambda x: ch.avg("perf", x)  # noqa: E731
    rng = ch.rng("perf")
    series = [str(n) for n in range(h.nodes)]
    n = ch.n // k
    out = {name: np.zeros((h.nodes, n)) for name in ("instructions", "cycles", "llc_loads", "llc_misses",
                                                     "mem_bandwidth")}
    thp = av(eff.thp)
    for nd in range(h.nodes):
        cores = av(st.user[nd] + st.system[nd] + st.softirq[nd] + st.neighbour_cores[nd])
        nb = av(eff.neighbour[nd])
        cyc = cores * av(st.freq) * 1e6
        ipc = 1.4 / (1 + 0.8 * nb) / (1 + 0.25 * thp)
        dma = sum(av(st.pcie_rx[g.index] + st.pcie_tx[g.index]) for g in h.gpus if g.node == nd)
        bw = 15e9 + 0.1 * dma + 110e9 * nb + av(st.remote_bytes) * 1.5
        out["cycles"][nd] = cyc * dt
        out["instructions"][nd] = cyc * ipc * dt
        out["llc_loads"][nd] = cyc * 0.02 * dt
        out["llc_misses"][nd] = bw / 64.0 * dt
        out["mem_bandwidth"][nd] = bw * dt * (1 + 0.04 * (rng.random(n) - 0.5))
    cc = Counters(ch, "perf", series)
    for name, v in out.items():
        cc.add(name, v)
    return frame("perf", h.name, ch.times("perf"), {"socket": series}, cc.out, valid=cc.valid)


# --------------------------------------------------------------------- agent


def render_agent(ch: Chunk) -> pl.DataFrame:
    k = ch.k("agent")
    dt = DT * k
    n = ch.n // k
    rng = ch.rng("agent")
    slow = CPU_TURBO_MHZ / ch.avg("agent", ch.st.freq)
    r0 = ch.row0("agent")
    wraps = np.zeros(n)
    resets = np.zeros(n)
    for table, tick, kind in ch.bank.realised:
        secs = tick * schema.TIER_PERIOD_S[schema.get(table).tier]
        row = int(secs / (dt)) - r0
        if 0 <= row < n:
            (wraps if kind == "wrap" else resets)[row] += 1
    cc = Counters(ch, "agent", [""])
    cc.add("ticks", np.full((1, n), dt / DT))
    cc.add("missed_ticks", np.zeros((1, n)))
    cc.add("sample_time", (1500.0 * slow * (dt / DT) * (1 + 0.2 * (rng.random(n) - 0.5)))[None, :])
    cc.add("cpu_time", (1400.0 * slow * (dt / DT) * (1 + 0.1 * (rng.random(n) - 0.5)))[None, :])
    cc.add("counter_wraps", wraps[None, :])
    cc.add("counter_resets", resets[None, :])
    return frame("agent", ch.host.name, ch.times("agent"), {}, cc.out, valid=cc.valid)


# ------------------------------------------------------------------ workload


def render_workload(ch: Chunk) -> pl.DataFrame:
    k = ch.k("workload")
    thr = ch.avg("workload", ch.st.throughput)
    ph = ch.trace.phase[:: k] if k > 1 else ch.trace.phase
    phase = pl.Series("phase", ph.astype(np.uint32)).replace_strict(
        list(range(len(PHASES))), list(PHASES), return_dtype=pl.String).to_numpy()
    return frame("workload", ch.host.name, ch.times("workload"),
                 {"workload": [ch.schedule.kind], "unit": [ch.schedule.unit]},
                 {"throughput": np.round(thr, 3), "phase": phase})


RENDERERS: dict[str, Callable[[Chunk], pl.DataFrame]] = {
    "cpu": render_cpu,
    "system": render_system,
    "gpu": render_gpu,
    "interrupts": render_interrupts,
    "softirqs": render_softirqs,
    "memory": render_memory,
    "vmstat": render_vmstat,
    "numa": render_numa,
    "pressure": render_pressure,
    "net": render_net,
    "tcp": render_tcp,
    "disk": render_disk,
    "cgroup": render_cgroup,
    "perf": render_perf,
    "agent": render_agent,
    "workload": render_workload,
}
