"""Entries that read the cause (issue 15, item 4): a cause seen in absolute terms is named
without any history, and a busy CPU does not outrank it.

* a small features frame of one host (no cohort) where a cgroup appears already throttled
  (the drill's quota fault: the group is created with its quota, so it has no history);
* the real thing on this host (root, cgroup v1 or v2): a cgroup created after the real agent
  started, with a 0.02-CPU quota on a busy loop, collected by the real agent into a real lake,
  through the real feature code and the matcher. The group is removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analytics.features import compute_features
from knowledge_base import load_kb, match_windows
from knowledge_base.loader import KBError, parse_entry

T0 = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)


def _rmdir_cgroup(cg: Path) -> None:
    """Remove a test cgroup, waiting (up to 5 s) for its killed processes to leave it."""
    for _ in range(100):
        try:
            cg.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def _frame(n: int, cols: dict[str, list[float | None]]) -> pl.DataFrame:
    starts = [T0 + timedelta(seconds=3 * i) for i in range(n)]
    return pl.DataFrame({"host": ["vm"] * n, "window_start": starts,
                         "window_end": [s + timedelta(seconds=3) for s in starts], **cols},
                        schema_overrides={c: pl.Float64 for c in cols})


def _rank1(m: pl.DataFrame) -> dict[datetime, str]:
    return dict(m.filter(pl.col("rank") == 1).select("window_start", "entry_id").iter_rows())


def test_new_cgroup_throttled_from_its_first_window_is_named() -> None:
    # 60 healthy windows, then a group that did not exist before, throttled in every period;
    # the host's CPU is as busy as ever (psi cpu some ~0.7, as on the drill's VM)
    rng = np.random.default_rng(0)
    n, onset = 80, 60
    psi = (0.7 + 0.05 * rng.standard_normal(n)).tolist()
    thr: list[float | None] = [None] * onset + [1.0] * (n - onset)
    use: list[float | None] = [None] * onset + [0.99] * (n - onset)
    f = _frame(n, {"psi.cpu_some_share": psi, "cgroup.throttled_share@unveil-drill-quota": thr,
                   "cgroup.quota_use_share@unveil-drill-quota": use})
    got = _rank1(match_windows(f, None, load_kb()))
    after = [f["window_start"][i] for i in range(onset, n)]
    assert all(got.get(t) == "cgroup_cpu_throttle" for t in after), {t: got.get(t) for t in after[:5]}
    assert not any(v == "cgroup_cpu_throttle" for t, v in got.items() if t < after[0])
    m = match_windows(f, None, load_kb()).filter(pl.col("entry_id") == "cgroup_cpu_throttle").row(0, named=True)
    assert m["devices"] == ["unveil-drill-quota"]
    assert "cgroup.throttled_share > 0.25 (value=1 on unveil-drill-quota)" in m["explanation"]


def test_bursty_group_below_the_absolute_bound_is_not_named() -> None:
    # a group throttled now and then (a few % of periods, as bursty threads near their quota
    # are) since it appeared: no history, no z, and below the absolute bound: no incident
    n = 40
    f = _frame(n, {"cgroup.throttled_share@burst.slice": [0.05 if i % 3 else 0.1 for i in range(n)]})
    assert match_windows(f, None, load_kb()).filter(pl.col("entry_id") == "cgroup_cpu_throttle").is_empty()


def _entry(signal: str) -> str:
    return f'''id = "xx"
title = "x"
explanation = "x"
impact = "x"
subsystems = ["cpu"]
[[signals]]
{signal}
[remediation]
mode = "manual"
guidance = "x"
'''


@pytest.mark.parametrize(("signal", "message"), [
    ('feature = "cgroup.throttled_share"\ndirection = "up"\nrole = "required"\nabsolute = true',
     "signals[0]: an absolute signal with direction = 'up' needs value_above"),
    ('feature = "mem.available_share"\ndirection = "down"\nrole = "required"\nabsolute = true\nvalue_above = 0.1',
     "signals[0]: an absolute signal with direction = 'down' needs value_below"),
    ('feature = "cgroup.throttled_share"\ndirection = "up"\nrole = "required"\nabsolute = true\n'
     'value_above = 0.25\nmin_z = 3.0', "signals[0].min_z: does not apply to an absolute signal"),
    ('feature = "cgroup.throttled_share"\ndirection = "up"\nrole = "required"\nabsolute = "yes"\nvalue_above = 0.2',
     "signals[0].absolute: expected true or false"),
])
def test_absolute_signal_errors_name_the_field(signal: str, message: str) -> None:
    with pytest.raises(KBError, match=re.escape("xx.toml: " + message)):
        parse_entry(tomllib.loads(_entry(signal)), "xx.toml")


# ----------------------------------------------------------------------- the real host
def _layout():  # type: ignore[no-untyped-def]
    from jobs.drill import CgroupLayout, cgroup_layout

    if os.geteuid() != 0:
        pytest.skip("needs root (creates a cgroup)")
    layout = cgroup_layout()
    if not isinstance(layout, CgroupLayout):
        pytest.skip(str(layout))
    return layout


@contextlib.contextmanager
def _quota_group(name: str, delay_s: float) -> Iterator[dict[str, object]]:
    """After ``delay_s``, a cgroup ``name`` with a 0.02-CPU quota and a busy loop in it (so small
    that the loop exhausts it whenever it runs, however loaded the host is);
    the loop is killed and the group removed on exit, whatever happened."""
    layout = _layout()
    cg = layout.cpu_root / name
    state: dict[str, object] = {}

    def create() -> None:
        time.sleep(delay_s)
        cg.mkdir()
        for fname, value in layout.quota_files(2_000, 100_000):
            (cg / fname).write_text(value)
        # Popen first, then move: the loop runs its whole life at most 25 s
        p = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 25\nwhile time.time() < end: pass"])
        state["proc"] = p
        (cg / "cgroup.procs").write_text(str(p.pid))
        state["created"] = datetime.now(UTC)

    t = threading.Thread(target=create, daemon=True)
    t.start()
    try:
        yield state
    finally:
        t.join()
        p = state.get("proc")
        if isinstance(p, subprocess.Popen):
            p.kill()
            p.wait()
        _rmdir_cgroup(cg)
        assert not cg.exists(), f"test cgroup {cg} left behind"


def test_real_quota_on_a_group_created_after_the_agent_started(tmp_path: Path) -> None:
    from ingest import lake
    from ingest.agent import Agent, AgentConfig
    from ingest.lake import LakeSink

    name = f"unveil-test-quota-{os.getpid()}"
    cfg = AgentConfig(lake=tmp_path / "lake", host="vm", interval_s=0.1, flush_interval_s=1.0,
                      commit_interval_s=2.0, duration_s=13.0, compact_every_s=0, collectors=("cgroup", "cpu", "pressure"))
    with _quota_group(name, delay_s=3.0) as state:
        Agent(cfg, [LakeSink(tmp_path / "lake")]).run()
    created = state["created"]
    assert isinstance(created, datetime)
    frames = {t: lake.read(tmp_path / "lake", t).lazy() for t in ("cgroup", "cpu", "pressure")}
    feats = compute_features(frames)
    col = f"cgroup.throttled_share@{name}"
    assert col in feats.columns, [c for c in feats.columns if c.startswith("cgroup.")]
    got = _rank1(match_windows(feats, None, load_kb()))
    # the windows wholly after the group's creation (its first full second included)
    inside = feats.filter(pl.col("window_start") >= created + timedelta(seconds=1))
    assert inside.height >= 2, feats.select("window_start", col).rows()
    named = [t for t in inside["window_start"] if got.get(t) == "cgroup_cpu_throttle"]
    assert len(named) == inside.height, (inside.select("window_start", col).rows(), got)
    before = feats.filter(pl.col("window_end") <= created)
    assert not any(got.get(t) == "cgroup_cpu_throttle" for t in before["window_start"])


# ----------------------------------------------------------------------- own processes
def test_unveil_own_groups_are_recognised_and_the_drill_faults_are_not() -> None:
    from ingest.collectors.cgroup import is_own

    assert is_own("unveil.slice") and is_own("unveil.slice/unveil-scheduler.service")
    assert is_own("system.slice/unveil-agent.service")
    # the drill's injected faults are evidence: its quota group is no unit of ours
    assert not is_own("unveil-drill-quota") and not is_own("system.slice") and not is_own("user.slice")
    assert not is_own("system.slice/unveil-drill.service.d")


def test_collector_watches_the_agents_own_unit_group(tmp_path: Path) -> None:
    from ingest.collectors.cgroup import CgroupCollector, own_cgroup

    base = tmp_path / "sys/fs/cgroup"
    for g in ("system.slice", "system.slice/unveil-agent.service", "user.slice"):
        (base / g).mkdir(parents=True)
        (base / g / "cpu.stat").write_text("usage_usec 10\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
    (base / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/system.slice/unveil-agent.service\n")
    assert own_cgroup(tmp_path, 2) == "system.slice/unveil-agent.service"
    c = CgroupCollector(tmp_path)
    assert c.collect()[0].tags["cgroup"] == ["system.slice", "user.slice", "system.slice/unveil-agent.service"]
    c.close()
    # a shared group (a login shell's scope, the root) is not ours: nothing is set apart
    (tmp_path / "proc/self/cgroup").write_text("0::/user.slice/user-0.slice/session-1.scope\n")
    assert own_cgroup(tmp_path, 2) is None
    (tmp_path / "proc/self/cgroup").write_text("4:memory:/x\n1:cpu,cpuacct:/\n0::/\n")
    assert own_cgroup(tmp_path, 1) is None


def test_own_sweep_is_no_noisy_neighbour() -> None:
    # CPU pressure rises at window 60 for 10 windows; in one frame the rise comes with
    # Unveil's own cores (a sweep), in the other with nobody's: only the latter is a neighbour
    rng = np.random.default_rng(1)
    n, lo, hi = 90, 60, 70
    psi = (0.2 + 0.02 * rng.standard_normal(n)).tolist()
    psi[lo:hi] = [0.8] * (hi - lo)
    own = [0.05] * n
    own[lo:hi] = [1.0] * (hi - lo)
    during = {T0 + timedelta(seconds=3 * i) for i in range(lo, hi)}

    def neighbour_windows(cols: dict[str, list[float | None]]) -> set[datetime]:
        m = match_windows(_frame(n, cols), None, load_kb())
        return set(m.filter((pl.col("rank") == 1) & (pl.col("entry_id") == "cpu_noisy_neighbour"))["window_start"])

    assert neighbour_windows({"psi.cpu_some_share": psi, "cpu.own_cores": [0.05] * n}) == during
    assert neighbour_windows({"psi.cpu_some_share": psi, "cpu.own_cores": own}) == set()


def test_real_own_slice_cpu_is_set_apart_from_the_detectors(tmp_path: Path) -> None:
    from analytics.features import feature_columns
    from ingest import lake
    from ingest.agent import Agent, AgentConfig
    from ingest.lake import LakeSink

    layout = _layout()
    # v1: CPU time is read from the cpuacct hierarchy, a mount of its own on some hosts
    roots = {layout.cpu_root}
    if layout.version == 1:
        roots |= {Path(os.path.realpath(layout.cpu_root.parent / d)) for d in ("cpuacct", "cpu,cpuacct")
                  if (layout.cpu_root.parent / d / "cpuacct.usage").exists()}
    names = ("unveil.slice", f"unveil-test-nb-{os.getpid()}")
    if any((r / names[0]).exists() for r in roots):
        pytest.skip("unveil.slice exists on this host (a deployment): not ours to touch")
    procs: list[subprocess.Popen[bytes]] = []
    made: list[Path] = []
    try:
        for name in names:
            p = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 20\nwhile time.time() < end: pass"])
            procs.append(p)
            for r in sorted(roots):
                (r / name).mkdir()
                made.append(r / name)
                (r / name / "cgroup.procs").write_text(str(p.pid))
        cfg = AgentConfig(lake=tmp_path / "lake", host="vm", interval_s=0.1, flush_interval_s=1.0,
                          commit_interval_s=2.0, duration_s=8.0, compact_every_s=0, collectors=("cgroup", "cpu"))
        Agent(cfg, [LakeSink(tmp_path / "lake")]).run()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for cg in made:
            _rmdir_cgroup(cg)
    assert not any(cg.exists() for cg in made)
    feats = compute_features({t: lake.read(tmp_path / "lake", t).lazy() for t in ("cgroup", "cpu")})
    assert "cpu.own_cores" in feats.columns
    both = feats.drop_nulls(["cpu.own_cores", "cgroup.cpu_cores@unveil.slice"])
    assert both.height >= 2
    # the busy loop is Unveil's own CPU (a share of a core: it competes with the host's load)
    assert both["cpu.own_cores"].to_list() == both["cgroup.cpu_cores@unveil.slice"].to_list()
    assert float(both["cpu.own_cores"].median()) > 0.05  # type: ignore[arg-type]
    judged = feature_columns(feats)
    assert "cpu.own_cores" not in judged and not any(c.endswith("@unveil.slice") for c in judged)
    assert f"cgroup.cpu_cores@{names[1]}" in judged  # somebody else's group stays evidence


# ----------------------------------------------------------------------- memory pressure
def test_memory_hog_is_memory_pressure_not_a_busy_cpu() -> None:
    # the drill's memory fault: a hog takes RAM fast and keeps its pages hot (CPU pressure up),
    # before any reclaim or PSI memory stall
    rng = np.random.default_rng(2)
    n, onset = 90, 60
    avail = (0.88 + 0.005 * rng.standard_normal(n)).tolist()
    avail[onset:] = np.linspace(0.85, 0.05, n - onset).tolist()
    psi = (0.2 + 0.02 * rng.standard_normal(n)).tolist()
    psi[onset:] = [0.95] * (n - onset)
    f = _frame(n, {"mem.available_share": avail, "psi.cpu_some_share": psi, "psi.memory_some_share": [0.0] * n,
                   "mem.kswapd_scan_rate": [0.0] * n})
    got = _rank1(match_windows(f, None, load_kb()))
    low = [f["window_start"][i] for i in range(onset, n) if avail[i] < 0.5]
    assert low and all(got.get(t) == "memory_pressure" for t in low), {t: got.get(t) for t in low}
    # before the hog nothing; while it only starts (MemAvailable still above half) the busy
    # CPU may be reported, never memory pressure
    assert not any(v == "memory_pressure" for t, v in got.items() if t < f["window_start"][onset])


@pytest.mark.parametrize("cols", [
    {"mem.available_share": [0.06] * 40},  # short of memory since the first window: no history
    {"psi.memory_some_share": [0.3] * 40, "mem.available_share": [0.6] * 40},  # stalls on memory all along
])
def test_memory_pressure_without_history(cols: dict[str, list[float | None]]) -> None:
    got = _rank1(match_windows(_frame(40, cols), None, load_kb()))
    assert set(got.values()) == {"memory_pressure"} and len(got) == 40, got


def test_healthy_memory_is_quiet() -> None:
    # a host with a fifth of its memory available all along, PSI memory at its usual few %
    f = _frame(40, {"mem.available_share": [0.2] * 40, "psi.memory_some_share": [0.03] * 40})
    assert match_windows(f, None, load_kb()).filter(pl.col("entry_id") == "memory_pressure").is_empty()


# ----------------------------------------------------------------------- configuration faults
def _gpu_facts() -> pl.DataFrame:
    return pl.DataFrame({"time": [T0 - timedelta(minutes=1)] * 2, "host": ["vm"] * 2, "category": ["gpu"] * 2,
                         "device": ["0", "0"], "key": ["name", "power_limit_w"], "value": ["NVIDIA H100", "670"],
                         "value_num": [None, 670.0]})


@pytest.mark.parametrize(("cols", "entry"), [
    # a power limit of 670 W of 700 since boot (or on every host of the fleet), the GPU held at it
    ({"gpu.power_limit_ratio@gpu0": [670 / 700] * 40, "gpu.throttle_power_share@gpu0": [0.6] * 40,
      "gpu.util@gpu0": [0.95] * 40}, "gpu_power_throttle"),
    # a PCIe link at gen4 of gen5 while the GPU is busy, since boot
    ({"pcie.link_gen_ratio@gpu0": [0.8] * 40, "gpu.util@gpu0": [0.9] * 40}, "pcie_link_degraded"),
    # the driver lowers the clocks for heat in a third of the samples, since boot; 79 C is no
    # hotter than a neighbouring healthy slot may run
    ({"gpu.throttle_thermal_share@gpu0": [0.3] * 40, "gpu.thermal_violation_share@gpu0": [0.25] * 40,
      "gpu.temperature_max@gpu0": [79.0] * 40, "gpu.util@gpu0": [0.9] * 40}, "thermal_throttle"),
])
def test_configuration_and_thermal_faults_from_boot_are_named(cols: dict[str, list[float | None]], entry: str) -> None:
    got = _rank1(match_windows(_frame(40, cols), _gpu_facts(), load_kb()))
    assert len(got) == 40 and set(got.values()) == {entry}, got


@pytest.mark.parametrize("cols", [
    # a lowered limit the GPU never reaches costs nothing: quiet
    {"gpu.power_limit_ratio@gpu0": [670 / 700] * 40, "gpu.throttle_power_share@gpu0": [0.0] * 40},
    # an idle GPU lowers its link on purpose
    {"pcie.link_gen_ratio@gpu0": [0.25] * 40, "gpu.util@gpu0": [0.0] * 40},
    # a hot GPU the driver does not slow down is no thermal throttling
    {"gpu.temperature_max@gpu0": [84.0] * 40, "gpu.throttle_thermal_share@gpu0": [0.0] * 40,
     "gpu.thermal_violation_share@gpu0": [0.0] * 40},
])
def test_configuration_without_effect_is_quiet(cols: dict[str, list[float | None]]) -> None:
    assert match_windows(_frame(40, cols), _gpu_facts(), load_kb()).is_empty()


def _numa_facts(nodes: int) -> pl.DataFrame:
    return pl.DataFrame({"time": [T0 - timedelta(minutes=1)], "host": ["vm"], "category": ["numa"], "device": [""],
                         "key": ["nodes"], "value": [str(nodes)], "value_num": [float(nodes)]})


def _irq_frame(n: int, locality: float, rx: float | None, dev: str = "ens1np0") -> pl.DataFrame:
    # a device (and a NIC whose interrupts are local) whose interrupts are serviced on the far
    # node since the first window: no history and no peers to differ from; rx None: the
    # device is no NIC (no net.* of its name)
    cols = {f"irq.locality@{dev}": [locality] * n, f"irq.rate@{dev}": [1200.0] * n,
            "irq.locality@ens2np0": [1.0] * n, "irq.rate@ens2np0": [1200.0] * n,
            "net.rx_bytes_rate@ens2np0": [2e8] * n}
    if rx is not None:
        cols[f"net.rx_bytes_rate@{dev}"] = [rx] * n
    return _frame(n, cols)


def test_irq_locality_miss_since_boot_is_named_from_the_placement() -> None:
    m = match_windows(_irq_frame(40, 0.2, 2e8), _numa_facts(2), load_kb())
    got = _rank1(m)
    assert len(got) == 40 and set(got.values()) == {"irq_locality_miss"}, got
    assert set(m.filter(pl.col("rank") == 1)["devices"].explode().to_list()) == {"ens1np0"}


@pytest.mark.parametrize(("locality", "rx", "nodes", "dev"), [
    (0.6, 2e8, 2, "ens1np0"),  # most interrupts on the NIC's own node: no miss read from the level alone
    (0.2, 2e4, 2, "ens1np0"),  # an idle NIC's stray interrupts
    (0.2, 2e8, 1, "ens1np0"),  # one NUMA node: there is no far node (a one-node host's locality is 1 anyway)
    (0.2, None, 2, "nvme0"),  # NVMe queues are serviced where the I/O is submitted: not a setting
])
def test_irq_placement_without_cost_is_quiet(locality: float, rx: float | None, nodes: int, dev: str) -> None:
    m = match_windows(_irq_frame(40, locality, rx, dev), _numa_facts(nodes), load_kb())
    assert m.filter(pl.col("entry_id") == "irq_locality_miss").is_empty()


def _power_facts(governor: str, driver: str) -> pl.DataFrame:
    rows = [("policy0", "scaling_governor", governor), ("policy1", "scaling_governor", governor),
            ("", "scaling_driver", driver)]
    return pl.DataFrame({"time": [T0 - timedelta(minutes=1)] * 3, "host": ["vm"] * 3, "category": ["power"] * 3,
                         "device": [d for d, _k, _v in rows], "key": [k for _d, k, _v in rows],
                         "value": [v for _d, _k, v in rows], "value_num": [None] * 3},
                        schema_overrides={"value_num": pl.Float64})


def test_a_governor_holding_the_clocks_low_since_boot_is_named_on_a_busy_host() -> None:
    # powersave since boot (every host of the fleet: no past or peer differs), a third of the
    # CPU time busy
    cols: dict[str, list[float | None]] = {"cpu.busy_share@node0": [0.35] * 40, "cpu.freq_mhz": [1900.0] * 40}
    got = _rank1(match_windows(_frame(40, cols), _power_facts("powersave", "acpi-cpufreq"), load_kb()))
    assert len(got) == 40 and set(got.values()) == {"cpu_governor_powersave"}, got
    conservative = _rank1(match_windows(_frame(40, cols), _power_facts("conservative", "intel_cpufreq"), load_kb()))
    assert set(conservative.values()) == {"cpu_governor_powersave"}, conservative


@pytest.mark.parametrize(("busy", "governor", "driver"), [
    (0.35, "powersave", "intel_pstate"),  # intel_pstate's own powersave: its dynamic default
    (0.35, "powersave", "amd-pstate-epp"),
    (0.35, "performance", "acpi-cpufreq"),
    (0.03, "powersave", "acpi-cpufreq"),  # slow clocks on an idle host cost nothing
])
def test_a_governor_that_costs_nothing_is_quiet(busy: float, governor: str, driver: str) -> None:
    cols: dict[str, list[float | None]] = {"cpu.busy_share@node0": [busy] * 40, "cpu.freq_mhz": [1900.0] * 40}
    got = match_windows(_frame(40, cols), _power_facts(governor, driver), load_kb())
    assert got.filter(pl.col("entry_id") == "cpu_governor_powersave").is_empty(), got


def _clock_drop(busy_after: float) -> pl.DataFrame:
    # node0: 60 windows at 2 890 MHz and 75 % busy, then 20 at 2 565 MHz (a drop of 325 MHz,
    # z >> 3) and ``busy_after`` busy: a co-runner on node0 finishing (the busy share falls
    # with the clocks) or a slower governor (the same work, as busy or more); node1 runs on
    # unchanged, a third busy at 2 570 MHz (as the simulated host of the false incident did)
    rng = np.random.default_rng(3)
    def noise(v: float, sd: float, n: int) -> list[float | None]:
        return [v + sd * rng.standard_normal() for _ in range(n)]
    return _frame(80, {"cpu.freq_mhz@node0": noise(2890.0, 3, 60) + noise(2565.0, 3, 20),
                       "cpu.busy_share@node0": noise(0.75, 0.005, 60) + [busy_after] * 20,
                       "cpu.freq_mhz@node1": noise(2570.0, 3, 80), "cpu.busy_share@node1": noise(0.33, 0.005, 80)})


@pytest.mark.parametrize(("busy_after", "governor", "named"), [
    (0.32, "performance", False),  # the load left and the clocks followed it: no governor
    (0.78, "performance", True),  # clocks down, the work as busy as before: a cap of some kind
    (0.32, "powersave", True),  # the setting itself holds the clocks low: named whatever the load
])
def test_clocks_that_fall_with_the_load_are_no_governor(busy_after: float, governor: str, named: bool) -> None:
    got = _rank1(match_windows(_clock_drop(busy_after), _power_facts(governor, "acpi-cpufreq"), load_kb()))
    after = {v for t, v in got.items() if t >= T0 + timedelta(seconds=3 * 60)}
    assert ("cpu_governor_powersave" in after) is named, got


def _thp_facts(enabled: str) -> pl.DataFrame:
    return pl.DataFrame({"time": [T0 - timedelta(minutes=1)], "host": ["vm"], "category": ["thp"],
                         "device": [""], "key": ["enabled"], "value": [enabled], "value_num": [None]},
                        schema_overrides={"value_num": pl.Float64})


# THP off since boot on every host: coverage flat at its low level (no history or peer shows
# a fall), page tables of ~12 % of RAM in 4 KiB pages (2.4e-4 x 512)
_THP_OFF = {"mem.hugepage_coverage": [0.4] * 40, "mem.page_tables_share": [2.4e-4] * 40,
            "mem.pgfault_rate": [50.0] * 40, "mem.thp_fault_alloc_rate": [0.0] * 40}


def test_thp_off_since_boot_is_named_from_the_coverage_level() -> None:
    m = match_windows(_frame(40, _THP_OFF), _thp_facts("never"), load_kb())
    got = _rank1(m)
    assert len(got) == 40 and set(got.values()) == {"thp_coverage_loss"}, got
    row = m.filter(pl.col("entry_id") == "thp_coverage_loss").row(0, named=True)
    assert "mem.hugepage_coverage < 0.5 while thp.enabled == 'never' (value=0.4)" in row["matched_signals"]


@pytest.mark.parametrize(("cols", "enabled"), [
    (_THP_OFF, "madvise"),  # the same low coverage under madvise: the workload did not ask for huge pages
    ({**_THP_OFF, "mem.page_tables_share": [5e-5] * 40}, "never"),  # THP off on an idle host: nothing to lose
    ({**_THP_OFF, "mem.hugepage_coverage": [0.8] * 40}, "never"),  # most memory still on huge pages
])
def test_thp_level_without_the_setting_or_the_footprint_is_quiet(cols: dict[str, list[float | None]],
                                                                  enabled: str) -> None:
    got = match_windows(_frame(40, cols), _thp_facts(enabled), load_kb())
    assert got.filter(pl.col("entry_id") == "thp_coverage_loss").is_empty(), got


@pytest.mark.parametrize(("gate", "message"), [
    ("{}", "signals[0].gate: give a feature (with above and/or below) and/or a fact (with op and value)"),
    ('{ fact = "thp.enabled", op = "==", value = "never", above = 0.5 }',
     "signals[0].gate.above: applies to a gate feature: give feature too"),
    ('{ fact = "thp.enabled", op = "exists", value = 1 }', "signals[0].gate.op"),
    ('{ fact = "thp.enabled", op = "==" }', "signals[0].gate.value: missing"),
    ('{ fact = "THP", op = "==", value = "never" }', "signals[0].gate.fact"),
])
def test_gate_errors_name_the_field(gate: str, message: str) -> None:
    signal = f'feature = "mem.hugepage_coverage"\ndirection = "down"\nrole = "required"\ngate = {gate}'
    with pytest.raises(KBError, match=re.escape("xx.toml: " + message)):
        parse_entry(tomllib.loads(_entry(signal)), "xx.toml")


def test_quota_on_a_cgroup_v2_tree_created_after_the_agent_started(tmp_path: Path) -> None:
    # cgroup v2 (not on this VM): the real agent on a v2 tree whose files a writer advances
    # like the kernel does: a group appears after 2 s with a 0.2-CPU quota, throttled in
    # every 100 ms period, using its whole quota
    from ingest import lake
    from ingest.agent import Agent, AgentConfig
    from ingest.lake import LakeSink

    base = tmp_path / "sys/fs/cgroup"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpu memory\n")
    (base / "system.slice").mkdir()
    (base / "system.slice/cpu.stat").write_text("usage_usec 1000\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
    stop = threading.Event()

    def kernel() -> None:
        time.sleep(2.0)
        g = base / "job.slice"
        g.mkdir()
        (g / "cpu.max").write_text("20000 100000\n")
        t0 = time.monotonic()
        # the agent keeps the file open and re-reads it (as the kernel regenerates it): the
        # same inode, rewritten in place at a fixed width
        fd = os.open(g / "cpu.stat", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            while not stop.is_set():
                n = int((time.monotonic() - t0) / 0.1)
                os.pwrite(fd, (f"usage_usec {20_000 * n:012d}\nnr_periods {n:08d}\nnr_throttled {n:08d}\n"
                               f"throttled_usec {80_000 * n:012d}\n").encode(), 0)
                time.sleep(0.05)
        finally:
            os.close(fd)

    t = threading.Thread(target=kernel, daemon=True)
    t.start()
    cfg = AgentConfig(lake=tmp_path / "lake", host="vm", root=str(tmp_path), interval_s=0.1, flush_interval_s=1.0,
                      commit_interval_s=2.0, duration_s=9.0, compact_every_s=0, collectors=("cgroup",))
    try:
        Agent(cfg, [LakeSink(tmp_path / "lake")]).run()
    finally:
        stop.set()
        t.join()
    feats = compute_features({"cgroup": lake.read(tmp_path / "lake", "cgroup").lazy()})
    col = "cgroup.throttled_share@job.slice"
    inside = feats.filter(pl.col(col).is_not_null() & (pl.col(col) > 0.9))
    assert inside.height >= 2, feats.select("window_start", col).rows()
    got = _rank1(match_windows(feats, None, load_kb()))
    assert all(got.get(t) == "cgroup_cpu_throttle" for t in inside["window_start"]), got


def test_binomial_noise_of_a_bursty_group_is_not_a_quota_cut() -> None:
    # a healthy job at ~80 % of its quota is throttled in ~3.5 % of the CFS periods (the
    # simulator's realistic profile): a 3-s window counts 30 periods, so its share is
    # k/30 with k ~ Binomial(30, 0.035) - mostly 0-2, now and then 4-6 (0.13-0.2). Those
    # chance windows are no quota change; a real cut throttles most periods and is named.
    rng = np.random.default_rng(1)
    n = 400
    share = (rng.binomial(30, 0.035, n) / 30).tolist()
    for i in range(300, 330):  # the healthy tail, as often as it shows in half an hour
        share[i] = (4 + i % 3) / 30
    f = _frame(n, {"cgroup.throttled_share@workload.slice": share,
                   "cgroup.quota_use_share@workload.slice": [0.82] * n})
    got = _rank1(match_windows(f, None, load_kb()))
    assert "cgroup_cpu_throttle" not in got.values()
    cut = [*share[:300], *(rng.binomial(30, 0.6, 100) / 30).tolist()]
    f2 = _frame(n, {"cgroup.throttled_share@workload.slice": cut,
                    "cgroup.quota_use_share@workload.slice": [0.82] * 300 + [0.97] * 100})
    got2 = _rank1(match_windows(f2, None, load_kb()))
    assert sum(v == "cgroup_cpu_throttle" for t, v in got2.items() if t >= f2["window_start"][300]) >= 95
