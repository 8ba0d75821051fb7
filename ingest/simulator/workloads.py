"""Workload models: what the host's GPUs, CPUs, NICs and disks are asked to do, tick by tick.

A :class:`Schedule` is drawn once per host for the whole run (phase segments, step
boundaries, request-rate curve), so chunks of it can be materialised independently and
the run does not depend on how it is cut. :meth:`Schedule.trace` turns a range of fast
ticks into a :class:`Trace`: per-tick demand arrays (healthy, unthrottled) plus the
*work composition* weights that tell the physics in :mod:`ingest.simulator.physics` which
part of the work a given inefficiency slows down.

Magnitudes are for an 8x H100 host (docs/simulator.md, "Workloads").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

DT = 0.1  # fast tick, seconds
TICKS_PER_S = 10

PHASES: tuple[str, ...] = (
    "idle",
    "model_load",
    "prefill",
    "decode",
    "compute",
    "allreduce",
    "checkpoint",
    "eval",
)
P = {name: i for i, name in enumerate(PHASES)}

WORKLOADS: dict[str, str] = {"llm_serving": "tokens/s", "training": "steps/s", "idle": "tokens/s"}

# Prefill / decode capacity of the host (70B-class model, TP=8, H100): tokens/s.
PREFILL_CAP = 60_000.0
DECODE_CAP = 12_000.0


@dataclass
class Trace:
    """Healthy demand over ``n`` fast ticks. Per-GPU/NIC arrays are the same for every device
    (the render adds per-device noise); bytes are per second."""

    n: int
    phase: np.ndarray  # int8 codes into PHASES
    a_c: np.ndarray  # compute-bound GPU activity 0..1 (GEMM, prefill)
    a_m: np.ndarray  # memory-bound GPU activity 0..1 (decode, elementwise)
    busy: np.ndarray  # GPU busy share 0..1 (NVML util/100)
    h2d: np.ndarray  # PCIe host->device bytes/s per GPU
    d2h: np.ndarray  # PCIe device->host bytes/s per GPU
    nvlink: np.ndarray  # NVLink bytes/s per GPU, each direction
    net: np.ndarray  # scale-out RDMA bytes/s per NIC, each direction
    front: np.ndarray  # frontend bytes/s (requests in, responses out) on the management NIC
    disk_r: np.ndarray  # host disk read bytes/s (all data disks)
    disk_w: np.ndarray  # host disk write bytes/s
    cpu_work: np.ndarray  # workload CPU cores doing useful work (scales with progress)
    cpu_spin: float  # cores busy-polling regardless of progress
    anon: np.ndarray  # workload anonymous memory bytes
    alloc: np.ndarray  # page allocations/s by the workload
    throughput: np.ndarray  # units/s of useful work, healthy
    # Work composition (shares of the tick's time; the rest is unaffected by injections).
    w_c: np.ndarray  # GPU compute-bound
    w_m: np.ndarray  # GPU memory-bound
    w_comm: np.ndarray  # inter-GPU / inter-node communication
    w_in: np.ndarray  # host CPU input path (dataloader, tokenizer, scheduler, launches)
    w_io: np.ndarray  # storage path (checkpoint, dataset reads, model load)
    smooth: int  # ticks over which throughput is averaged (a training step)
    quota: float  # the job's CFS quota in cores, as a healthy deployment provisions it (Schedule.quota)


#: The job's CFS quota in cores on a host of any size (the job's demand does not grow with
#: the host): above a training job's mean demand (~13 cores) but not far
JOB_QUOTA_CORES = 16.0
#: the most of its quota a healthy job's mean demand reaches at its peak: at 80 % the smooth
#: CFS model (physics.cfs_smooth) throttles ~2 % of periods, far below the 25 % at which
#: kubernetes-mixin's CPUThrottlingHigh alert fires; the usual provisioning of a limit with
#: headroom over the observed peak
QUOTA_PEAK_SHARE = 0.8
#: cores a serving job's engine busy-polls whatever its load
SERVING_SPIN_CORES = 8.0


def _serving_cpu_work(rate: Any) -> Any:
    """Cores a serving job's CPU path uses at ``rate`` requests/s (tokenizer, scheduler, launches)."""
    return 0.6 + 0.09 * rate


def _ar1(rng: np.random.Generator, n: int, tau_ticks: float, sigma: float) -> np.ndarray:
    """AR(1) noise with unit-free std ``sigma`` and correlation time ``tau_ticks``.

    Polars' ewm_mean (adjust=False) is exactly the AR(1) recursion, vectorised in Rust."""
    alpha = 1.0 - np.exp(-1.0 / max(tau_ticks, 1.0))
    white = rng.standard_normal(n).astype(np.float64)
    white[0] *= np.sqrt(alpha / (2 - alpha))  # start in the stationary distribution
    y = pl.Series(white).ewm_mean(alpha=alpha, adjust=False).to_numpy()
    # stationary std of the filtered series: alpha / sqrt(1 - (1-alpha)^2)
    scale = np.sqrt(1 - (1 - alpha) ** 2) / alpha
    return (y * scale * sigma).astype(np.float64)


def _segments(rng: np.random.Generator, total_s: float, every: tuple[float, float],
              length: tuple[float, float], first_after: float) -> list[tuple[float, float]]:
    out = []
    t = first_after + rng.uniform(*every)
    while t < total_s:
        d = rng.uniform(*length)
        out.append((t, t + d))
        t += d + rng.uniform(*every)
    return out


def _mask(n: int, a: int, segs: list[tuple[float, float]]) -> np.ndarray:
    """Boolean mask over ticks [a, a+n) covered by segments given in seconds."""
    m = np.zeros(n, dtype=bool)
    for s, e in segs:
        i, j = int(s * TICKS_PER_S) - a, int(e * TICKS_PER_S) - a
        if j > 0 and i < n:
            m[max(i, 0) : min(j, n)] = True
    return m


class Schedule:
    """The whole-run plan of one host's workload."""

    def __init__(self, kind: str, total_ticks: int, start_epoch_s: float, seed: np.random.SeedSequence,
                 params: dict[str, float] | None = None) -> None:
        if kind not in WORKLOADS:
            raise ValueError(f"unknown workload {kind!r}; known: {', '.join(WORKLOADS)}")
        self.kind = kind
        self.unit = WORKLOADS[kind]
        self.total = total_ticks
        self.start_epoch_s = start_epoch_s
        self._seed = seed
        p = params or {}
        rng = np.random.default_rng(seed.spawn(1)[0])
        total_s = total_ticks / TICKS_PER_S
        self.load_s = float(rng.uniform(45, 90))
        if kind == "training":
            self.step_s = float(p.get("step_s", rng.uniform(1.0, 1.6)))
            n_steps = int(total_s / self.step_s * 1.2) + 10
            dur = self.step_s * (1 + 0.02 * rng.standard_normal(n_steps))
            slow = rng.random(n_steps) < 0.01  # benign straggler steps
            dur[slow] *= rng.uniform(1.15, 1.5, int(slow.sum()))
            self.step_edges = self.load_s + np.concatenate([[0.0], np.cumsum(dur)])
            ck_every = float(p.get("checkpoint_every_s", rng.uniform(720, 1200)))
            self.ckpt = _segments(rng, total_s, (ck_every * 0.9, ck_every * 1.1), (4, 8), self.load_s)
            self.ckpt_write = [(e, e + rng.uniform(30, 45)) for _, e in self.ckpt]
            ev_every = float(p.get("eval_every_s", rng.uniform(1500, 2100)))
            self.evals = _segments(rng, total_s, (ev_every * 0.9, ev_every * 1.1), (40, 70), self.load_s)
            self.reloads: list[tuple[float, float]] = []
            self.gaps: list[tuple[float, float]] = []
        else:
            self.base_rate = float(p.get("request_rate", rng.uniform(10, 30)))
            n_s = int(total_s) + 2
            # request rate at 1 s: diurnal swing x slow log-AR(1) x level shifts; idle gaps
            hours = (start_epoch_s + np.arange(n_s)) / 3600.0
            diurnal = 1 + 0.35 * np.sin(2 * np.pi * (hours / 24.0) + rng.uniform(0, 2 * np.pi))
            wander = np.exp(_ar1(rng, n_s, 300, 0.25))
            shifts = np.ones(n_s)
            t = 0.0
            while t < n_s:
                t += rng.uniform(600, 2400)
                shifts[int(t):] *= float(rng.lognormal(0, 0.25))
            self.rate_s = self.base_rate * diurnal * wander * shifts
            self.gaps = _segments(rng, total_s, (900, 2700), (20, 180), self.load_s)
            self.reloads = _segments(rng, total_s, (5400, 14400), (50, 80), self.load_s + 600)
            if kind == "idle":
                self.rate_s[:] = 0.0
            self.ckpt, self.ckpt_write, self.evals = [], [], []
            self.step_s = 0.0
        self.quota = self._healthy_quota()

    def _healthy_quota(self) -> float:
        """The job's CFS quota as a healthy deployment provisions it: :data:`JOB_QUOTA_CORES`,
        raised to whole cores for a serving job whose request rate over the run (known in
        advance here) would take its mean demand above :data:`QUOTA_PEAK_SHARE` of it. A
        fixed 16 cores left the busiest healthy serving hosts throttled in 37 % of CFS
        periods at their load peak (tuning seed 1, 90 min): a quota below demand, which is
        the ``cgroup_cpu_throttle`` fault, not a healthy host."""
        if self.kind == "training":
            return JOB_QUOTA_CORES
        peak = SERVING_SPIN_CORES + _serving_cpu_work(float(self.rate_s.max(initial=0.0)))
        return max(JOB_QUOTA_CORES, float(np.ceil(peak / QUOTA_PEAK_SHARE)))

    # ------------------------------------------------------------------ materialise

    def trace(self, a: int, b: int, rng: np.random.Generator) -> Trace:
        n = b - a
        if self.kind == "training":
            return self._training(a, n, rng)
        return self._serving(a, n, rng)

    def _base(self, n: int) -> dict[str, np.ndarray]:
        z = lambda: np.zeros(n, dtype=np.float64)  # noqa: E731
        return {k: z() for k in ("a_c", "a_m", "busy", "h2d", "d2h", "nvlink", "net", "front", "disk_r",
                                 "disk_w", "cpu_work", "alloc", "throughput", "w_c", "w_m", "w_comm",
                                 "w_in", "w_io")}

    def _training(self, a: int, n: int, rng: np.random.Generator) -> Trace:
        t_s = (a + np.arange(n)) / TICKS_PER_S
        f = self._base(n)
        phase = np.full(n, P["compute"], dtype=np.int8)
        load = t_s < self.load_s
        ck = _mask(n, a, self.ckpt)
        ckw = _mask(n, a, self.ckpt_write)
        ev = _mask(n, a, self.evals)
        train = ~(load | ck | ev)
        k = np.searchsorted(self.step_edges, t_s, side="right") - 1
        k = np.clip(k, 0, len(self.step_edges) - 2)
        s0, s1 = self.step_edges[k], self.step_edges[k + 1]
        pos = np.where(t_s >= self.load_s, (t_s - s0) / (s1 - s0), 0.0)
        ar = train & (pos >= 0.78)
        comp = train & ~ar
        phase[ar] = P["allreduce"]
        phase[load] = P["model_load"]
        phase[ck] = P["checkpoint"]
        phase[ev] = P["eval"]
        jit = 1 + 0.03 * (rng.random(n) - 0.5)
        # GPU activity per phase
        f["a_c"] = np.select([comp, ar, ev, ck, load], [0.9, 0.22, 0.6, 0.05, 0.03], 0.0) * jit
        f["a_m"] = np.select([comp, ar, ev, ck, load], [0.45, 0.35, 0.5, 0.1, 0.05], 0.0) * jit
        f["busy"] = np.select([comp, ar, ev, ck, load], [0.985, 0.92, 0.85, 0.12, 0.06], 0.0)
        f["nvlink"] = np.select([comp, ar, ev], [25e9, 150e9, 2e9], 0.0) * jit
        f["net"] = np.select([comp, ar, ev], [4e9, 22e9, 0.2e9], 0.0) * jit
        f["h2d"] = np.select([comp | ar, ev, load], [0.25e9, 0.4e9, 1.6e9], 0.0) * jit
        f["d2h"] = np.select([ck, comp | ar], [21e9, 0.02e9], 0.0) * jit
        f["disk_r"] = np.select([load, train | ev], [9e9, 0.35e9], 0.0) * jit
        f["disk_w"] = np.where(ckw & ~ck, 6.0e9, 0.0) * jit + 2e6
        f["front"] = np.full(n, 0.05e6)
        f["cpu_work"] = np.select([train, ev, load, ck], [6.0, 4.0, 3.0, 2.0], 0.5) * jit
        f["alloc"] = np.select([train, load, ck], [6e3, 60e3, 40e3], 1e3)
        thr = np.where(train, 1.0 / (s1 - s0), 0.0)
        f["throughput"] = thr
        # composition: which share of the tick's time each path holds
        f["w_c"] = np.select([comp, ar, ev], [0.72, 0.08, 0.65], 0.0)
        f["w_m"] = np.select([comp, ar, ev], [0.12, 0.07, 0.2], 0.0)
        f["w_comm"] = np.select([comp, ar, ev], [0.06, 0.8, 0.02], 0.0)
        f["w_in"] = np.select([comp, ar, ev, ck], [0.08, 0.03, 0.1, 0.1], 0.0)
        f["w_io"] = np.select([comp, ck, load], [0.02, 0.5, 0.7], 0.0) + np.where(ckw & train, 0.04, 0.0)
        anon = np.where(load, 60e9 + 200e9 * np.clip(t_s / max(self.load_s, 1), 0, 1), 260e9)
        anon = anon + np.where(ckw | ck, 40e9, 0.0)
        return Trace(n=n, phase=phase, anon=anon, cpu_spin=8.0 * 0.9, smooth=int(self.step_s * TICKS_PER_S) or 1,
                     quota=self.quota, **f)

    def _serving(self, a: int, n: int, rng: np.random.Generator) -> Trace:
        t_s = (a + np.arange(n)) / TICKS_PER_S
        f = self._base(n)
        load = (t_s < self.load_s) | _mask(n, a, self.reloads)
        gap = _mask(n, a, self.gaps) | load
        sec = np.minimum((a + np.arange(n)) // TICKS_PER_S, len(self.rate_s) - 1)
        lam = np.where(gap, 0.0, self.rate_s[sec])
        arrivals = rng.poisson(lam * DT)
        prompt = arrivals * 900.0 * (0.5 + rng.random(n))
        f_p = np.minimum(1.0, prompt / (PREFILL_CAP * DT))
        # decode tokens/s follow the number of active sequences (Little's law, ~10 s lifetime)
        dec = pl.Series(lam * 250.0).ewm_mean(alpha=1 - np.exp(-1 / 100.0), adjust=False).to_numpy()
        dec = np.minimum(dec * (1 + 0.05 * (rng.random(n) - 0.5)), DECODE_CAP)
        dec = np.where(load, 0.0, dec)
        d_load = dec / DECODE_CAP
        active = d_load > 0.01
        f_d = np.where(active, 1 - f_p, 0.0)
        phase = np.where(f_p > 0.5, P["prefill"], np.where(active | (prompt > 0), P["decode"], P["idle"]))
        phase = phase.astype(np.int8)
        phase[load] = P["model_load"]
        f["a_c"] = 0.95 * f_p + f_d * (0.2 + 0.25 * d_load) + np.where(load, 0.03, 0.0)
        f["a_m"] = 0.45 * f_p + f_d * (0.45 + 0.4 * d_load) + np.where(load, 0.05, 0.0)
        f["busy"] = np.minimum(1.0, f_p + f_d * np.minimum(1.0, 0.45 + 0.6 * d_load)) + np.where(load, 0.06, 0.0)
        tok = prompt / DT + dec * (1 - f_p)
        f["throughput"] = tok
        f["nvlink"] = tok * 1.2e6
        f["net"] = prompt / DT * 160e3 / 8.0 + np.where(active, 5e6, 0.0)
        f["front"] = lam * 8e3 + dec * 120.0 + 0.05e6
        first = t_s < self.load_s
        f["h2d"] = np.where(load, 1.5e9, 30e6 * f_p + 5e6)
        f["d2h"] = np.where(active, 10e6 + dec * 50.0, 0.0)
        # first load reads the weights from NVMe; reloads come from the page cache
        f["disk_r"] = np.where(first, 4.5e9, np.where(load, 0.15e9, 1e6)) * (1 + 0.1 * (rng.random(n) - 0.5))
        f["disk_w"] = np.full(n, 3e6) + 2e3 * lam  # request logs
        f["cpu_work"] = np.where(load, 2.5, _serving_cpu_work(lam))
        f["alloc"] = np.where(load, 80e3, 2e3 + 250.0 * lam)
        f["w_c"] = 0.85 * f_p + 0.05 * f_d
        f["w_m"] = 0.78 * f_d
        f["w_in"] = np.where(active | (f_p > 0), 0.06 + 0.1 * (1 - d_load) * f_d, 0.0)
        f["w_comm"] = np.where(active | (f_p > 0), 0.04 + 0.04 * f_p, 0.0)
        f["w_io"] = np.where(load, 0.7, 0.0)
        anon = np.where(first, 20e9 + 100e9 * np.clip(t_s / max(self.load_s, 1), 0, 1), 120e9) + 2e8 * lam
        spin = 0.0 if self.kind == "idle" else SERVING_SPIN_CORES
        return Trace(n=n, phase=phase, anon=anon, cpu_spin=spin, smooth=1, quota=self.quota, **f)
