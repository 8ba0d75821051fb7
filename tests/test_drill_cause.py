"""The drill's real faults named by their cause, and quiet once removed (issue 15, drill targets).

Two kinds of data:

* a recording: ``tests/data/drill/s6_*.parquet`` are the features, host facts and fault
  windows of a real ``unveil drill --yes`` on this project's 2-core VM (2026-12-02 18:15-18:31
  UTC, the TUNING recording of benchmarks/drill_replay.py; see tests/data/drill/README.md).
  Windows are judged as the scheduler's analysis steps judge them: per minute, each against
  the host's past only;
* small frames shaped like a measured fault where the recording lacks it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from knowledge_base import load_kb, match_windows
from knowledge_base.matcher import MatchConfig, match_findings

DATA = Path(__file__).parent / "data" / "drill"
T0 = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
L = timedelta(seconds=3)  # the analytics' window length
US = timedelta(microseconds=1)


def _frame(n: int, cols: dict[str, list[float | None]]) -> pl.DataFrame:
    starts = [T0 + timedelta(seconds=3 * i) for i in range(n)]
    return pl.DataFrame({"host": ["vm"] * n, "window_start": starts,
                         "window_end": [s + L for s in starts], **cols},
                        schema_overrides={c: pl.Float64 for c in cols})


def _rank1(m: pl.DataFrame) -> dict[datetime, str]:
    return dict(m.filter(pl.col("rank") == 1).select("window_start", "entry_id").iter_rows())


#: features, host facts, fault -> (onset, restored)
Recording = tuple[pl.DataFrame, pl.DataFrame, dict[str, tuple[datetime, datetime]]]


@pytest.fixture(scope="module")
def s6() -> Recording:
    feats = pl.read_parquet(DATA / "s6_features.parquet")
    facts = pl.read_parquet(DATA / "s6_facts.parquet")
    card = pl.read_parquet(DATA / "s6_card.parquet")
    return feats, facts, {f: (o, r) for f, o, r in card.select("fault", "onset", "restored").iter_rows()}


def stepped(feats: pl.DataFrame, facts: pl.DataFrame | None, lo: datetime, hi: datetime) -> dict[datetime, str]:
    """Rank-1 matched entry of each window starting in [lo, hi), judged as the scheduler's
    minute steps judge it (jobs.step: the windows ending in (b, b + 1 min], against the
    host's windows ending by b)."""
    kb = load_kb()
    wins = feats.filter((pl.col("window_start") >= lo) & (pl.col("window_start") < hi))
    step = (pl.col("window_end") - US).dt.truncate("1m")
    out: dict[datetime, str] = {}
    for (b,), keys in wins.with_columns(step.alias("_b")).group_by("_b", maintain_order=True):
        assert isinstance(b, datetime)
        part = feats.filter(pl.col("window_end") <= b + timedelta(minutes=1))
        m = match_findings(keys.select("host", "window_start", "window_end"), part, facts, kb,
                           MatchConfig(reference_before=b - L + US), only_matched=True)
        out |= _rank1(m)
    return out


# ----------------------------------------------------------------------- packet loss
def test_loss_on_a_host_without_tcp_history_is_named() -> None:
    # the drill's VM sends no TCP at all before the fault (the recording: 1 window in 783 has
    # any segment), so retrans_share has no history and no z. Then 5 % random loss each way
    # (nft numgen in the drill's namespace), a paced stream of ~2000 segments/s: measured on
    # this VM 2.4-7.4 % of segments resent, 50-150 retransmissions/s
    rng = np.random.default_rng(5)
    n, onset = 80, 60
    share: list[float | None] = [None] * onset + rng.uniform(0.024, 0.074, n - onset).tolist()
    rate = [0.0] * onset + rng.uniform(50, 150, n - onset).tolist()
    got = _rank1(match_windows(_frame(n, {"net.retrans_share": share, "net.retrans_rate": rate}), None, load_kb()))
    loss = [T0 + timedelta(seconds=3 * i) for i in range(onset, n)]
    assert all(got.get(t) == "tcp_retransmissions" for t in loss), {t: got.get(t) for t in loss[:5]}
    assert not any(t < loss[0] for t in got)


def test_a_few_resent_segments_are_no_loss() -> None:
    # healthy minutes of the drill's VM: now and then one segment of a short connection is
    # resent (recorded: 1-2 retransmissions in a 3 s window, 0.1-3 % of the few segments sent)
    n = 40
    share: list[float | None] = [None] * n
    rate = [0.0] * n
    for i, (s, r) in zip(range(5, n, 6), [(0.026, 0.33), (0.017, 0.33), (0.033, 0.67), (0.012, 0.67),
                                          (0.0054, 0.33), (0.0028, 0.33)], strict=False):
        share[i], rate[i] = s, r
    m = match_windows(_frame(n, {"net.retrans_share": share, "net.retrans_rate": rate}), None, load_kb())
    assert m.filter(pl.col("entry_id") == "tcp_retransmissions").is_empty()


def _stream_counters(dst: str) -> dict[str, tuple[int, int]]:
    """Data segments sent and segments resent by each TCP socket to ``dst``, by local port
    (``ss -ti``): the stream's own counters, which other TCP on the host does not move."""
    text = subprocess.run(["ss", "-tinH", "dst", dst], capture_output=True, text=True, check=True).stdout
    counters: dict[str, tuple[int, int]] = {}
    for head, info in re.findall(r"^(\S.*)\n\s+(.*)$", text, flags=re.M):
        sent = re.search(r"\bdata_segs_out:(\d+)", info)
        resent = re.search(r"\bretrans:\d+/(\d+)", info)
        counters[head.split()[3]] = (int(sent.group(1)) if sent else 0, int(resent.group(1)) if resent else 0)
    return counters


def _dropped_in(ns: str) -> int:
    """Packets the drill's loss table dropped on their way into the namespace (the stream's data)."""
    from jobs import drill as d

    rules = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "chain", "inet", d.LINK_PREFIX, "input"],
                           capture_output=True, text=True, check=True).stdout
    m = re.search(r"counter packets (\d+)", rules)
    return int(m.group(1)) if m else 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace and veth pair: root only")
def test_drill_loss_without_netem_is_random_loss(tmp_path: Path) -> None:
    # the drill's netem fault on a kernel without sch_netem (this VM): real random loss in its
    # own namespace (nftables), so TCP resends about the lost share, not a bottleneck's ~1 %
    from jobs import drill as d

    f = d.NetemFault()
    if f.available() or shutil.which("nft") is None:
        pytest.skip(f.available() or "no nft command")
    if Path("/run/netns", f.NS).exists():
        pytest.skip(f"{f.NS} exists: a drill is running on this host")
    drill_dir = tmp_path / d.STATE_DIR
    drill_dir.mkdir(mode=0o700)
    state = d.State(drill_dir / d.STATE_FILE, "0123456789abcdef")
    state.save()
    ctx = d.Context(state, d.Procs(state), drill_dir)
    try:
        f.apply(ctx)
        time.sleep(1.0)  # the stream connects and settles
        before, latest = _stream_counters(f.NS_IP), {}
        t0 = time.monotonic()
        # until 60 of the stream's packets were dropped (~17 s here), at least 5 s, at most 30 s:
        # a packet is a GSO burst of ~25 segments, ~3.5 of them dropped a second, so 5 s holds
        # ~18 drops and the resent share varied 2.4-6.7 % in 10 runs. Per socket: the client
        # reconnects after a 5 s stall, and a new socket starts from 0
        while True:
            time.sleep(1.0)
            latest.update(_stream_counters(f.NS_IP))
            sent = sum(n - before.get(port, (0, 0))[0] for port, (n, _) in latest.items())
            resent = sum(n - before.get(port, (0, 0))[1] for port, (_, n) in latest.items())
            took = time.monotonic() - t0
            if took >= 30.0 or (took >= 5.0 and _dropped_in(f.NS) >= 60):
                break
        rules = subprocess.run(["ip", "netns", "exec", f.NS, "nft", "list", "table", "inet", d.LINK_PREFIX],
                               capture_output=True, text=True, check=True).stdout
    finally:
        errors = d.restore(state, ctx.procs)
    assert errors == []
    assert not Path("/run/netns", f.NS).exists() and not Path("/sys/class/net", f.HOST_LINK).exists()
    if f.method.startswith("tc netem"):
        return  # a kernel with netem: its loss is tc's (tests/test_drill.py checks the qdisc)
    assert "nftables random loss 5%" in f.method
    assert "numgen random mod 10000 < 500" in rules and "counter packets 0 " not in rules
    # ~2000 segments/s of the stream, ~5 % of them resent (a CI run read 1.8 % from the host-wide
    # /proc/net/snmp over 5 s: the host's other TCP in the denominator, and few drops in 5 s)
    assert resent >= 100, (sent, resent)
    assert resent / took > 1.0 and resent / max(sent, 1) > 0.02, (sent, resent, took)


# ----------------------------------------------------------------------- disk
def test_disk_fault_is_storage_contention_not_a_busy_cpu(s6: Recording) -> None:
    # the recording's disk fault: two fsync'd writers keep the VM's disk 70 % busy, tasks
    # stall on I/O a third of the time (PSI io), and the writers' CPU time raises CPU pressure
    # too; latency and queue depth of a virtio disk stay small (1.4 ms, 1.7)
    feats, facts, card = s6
    onset, restored = card["disk"]
    got = stepped(feats, facts, onset + L, restored - L)
    n = feats.filter((pl.col("window_start") >= onset + L) & (pl.col("window_start") < restored - L)).height
    assert "cpu_noisy_neighbour" not in got.values(), sorted(set(got.values()))
    assert sum(v == "storage_contention" for v in got.values()) >= 0.9 * n, (n, sorted(set(got.values())))


def test_cpu_fault_is_still_a_neighbour(s6: Recording) -> None:
    # two busy processes and no I/O: the neighbour entry still names them
    feats, facts, card = s6
    onset, restored = card["cpu"]
    got = stepped(feats, facts, onset + L, restored - L)
    n = feats.filter((pl.col("window_start") >= onset + L) & (pl.col("window_start") < restored - L)).height
    assert sum(v == "cpu_noisy_neighbour" for v in got.values()) >= 0.9 * n, (n, sorted(set(got.values())))


# ----------------------------------------------------------------------- recovery
def flagged(feats: pl.DataFrame, facts: pl.DataFrame, lo: datetime, hi: datetime) -> set[datetime]:
    """Windows starting in [lo, hi) the statistical detectors flag, judged per minute step on
    the step's past as jobs.step does (the analytics of the sweep's default config)."""
    from analytics.pipeline import analyze
    from jobs.config import SweepConfig

    a = SweepConfig().analytics
    wins = feats.filter((pl.col("window_start") >= lo) & (pl.col("window_start") < hi))
    out: set[datetime] = set()
    for b in sorted(set(wins.select((pl.col("window_end") - US).dt.truncate("1m"))["window_end"].to_list())):
        part = feats.filter((pl.col("window_start") >= b - a.history) & (pl.col("window_end") <= b + timedelta(minutes=1)))
        res = analyze({}, a, host_facts=facts, score_since=b - L + US, features=part)
        out |= {t for t in res.findings["window_start"].to_list() if lo <= t < hi}
    return out


@pytest.mark.parametrize("fault", ["quota", "disk"])
def test_psi_echo_after_a_fault_is_no_anomaly(s6: Recording, fault: str) -> None:
    # once a fault that stalled tasks is gone, the exact PSI shares are back at once, but the
    # kernel's avg10 decays for tens of seconds: the recording raised an unmatched incident
    # of 14-19 s after each of these faults, from that echo alone
    feats, facts, card = s6
    onset, restored = card[fault]
    assert flagged(feats, facts, onset + L, onset + 20 * L)  # the fault itself is an anomaly
    after = flagged(feats, facts, restored + L, restored + timedelta(seconds=40))
    assert not after, sorted(after)
