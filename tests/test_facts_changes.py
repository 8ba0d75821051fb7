"""knowledge_base.facts.changes_only: a sweep keeps the rows where a host fact changed, not
every snapshot, and must read the same facts from them at every time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from knowledge_base.facts import FactsIndex, HostFacts, changes_only
from knowledge_base.matcher import fact_changes

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)


def _snapshots() -> pl.DataFrame:
    """Two hosts, eight minute snapshots of every fact, written in fleet order (hosts
    interleaved): THP flips to never and back, a power limit is lowered (the text stays,
    the number moves), a NIC appears at the fourth snapshot, one fact has no value."""
    rows = []
    for i in range(8):
        t = T0 + timedelta(minutes=i)
        for h in ("gpu-b", "gpu-a"):
            thp = "never" if h == "gpu-a" and 2 <= i < 5 else "always"
            rows += [
                (t, h, "thp", "", "enabled", thp, None),
                (t, h, "gpu", "gpu0", "power_limit", "W", 700.0 if i < 6 or h == "gpu-b" else 500.0),
                (t, h, "gpu", "gpu0", "name", "NVIDIA H100", None),
                (t, h, "cpu", "", "model", None, None),
            ]
            if i >= 3:
                rows.append((t, h, "nic", "eth1", "numa_node", "1", 1.0))
    return pl.DataFrame(rows, schema={"time": pl.Datetime("us", "UTC"), "host": pl.String, "category": pl.String,
                                      "device": pl.String, "key": pl.String, "value": pl.String,
                                      "value_num": pl.Float64}, orient="row")


def test_changes_only_reads_the_same_facts_at_every_time() -> None:
    full = _snapshots()
    few = changes_only(full)
    assert few.height < full.height / 3
    # host by host, in time order
    assert few.select(pl.col("host").rle_id().max()).item() == 1
    times = [T0 - timedelta(minutes=1), *(T0 + timedelta(minutes=i, seconds=s) for i in range(9) for s in (0, 30))]
    for h in ("gpu-a", "gpu-b"):
        for t in (*times, None):
            want, got = HostFacts.from_frame(full, h, t), HostFacts.from_frame(few, h, t)
            assert got.facts == want.facts, (h, t)
            assert got.before == want.before, (h, t)
        for t in times[1:]:
            assert HostFacts.from_frame(few, h, None, onset=t).history == \
                HostFacts.from_frame(full, h, None, onset=t).history
        a, b = FactsIndex(full), FactsIndex(few)
        for t in times:
            assert a.at(h, t).facts == b.at(h, t).facts
    want = fact_changes(full, frozenset({"thp.enabled", "gpu.power_limit", "nic.numa_node"}))
    assert want["gpu-a"] and "gpu-b" not in want  # (a's changes; b's first readings are none)
    assert fact_changes(few, frozenset({"thp.enabled", "gpu.power_limit", "nic.numa_node"})) == want
    # the moments gpu-a's THP and its power limit changed are there; an unchanged fact once per host
    a = few.filter(pl.col("host") == "gpu-a")
    assert a.filter(pl.col("key") == "enabled")["value"].to_list() == ["always", "never", "always"]
    assert a.filter(pl.col("key") == "power_limit")["value_num"].to_list() == [700.0, 500.0]
    assert a.filter(pl.col("key") == "model").height == 1


def test_changes_only_leaves_frames_without_facts_columns_alone() -> None:
    empty = pl.DataFrame(schema={"host": pl.String, "time": pl.Datetime("us", "UTC")})
    assert changes_only(empty).equals(empty)
    odd = pl.DataFrame({"host": ["a"], "value": ["x"]})
    assert changes_only(odd).equals(odd)
