"""Static audit on host facts alone (the simulator's fact rows use the real collectors' names)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from ingest.simulator.topology import build_host, fact_rows, healthy_facts
from knowledge_base import AUDIT_SCHEMA, audit, load_kb

DATA = Path(__file__).parent / "data" / "knowledge_base"
T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)


def _facts(host: str, st: object, t: datetime = T0) -> pl.DataFrame:
    spec = build_host(host, 0)
    rows = fact_rows(spec, st)  # type: ignore[arg-type]
    return pl.DataFrame([(t, host, *r) for r in rows], orient="row",
                        schema=["time", "host", "category", "device", "key", "value", "value_num"])


def test_healthy_host_passes_the_audit() -> None:
    spec = build_host("ok", 0)
    out = audit(_facts("ok", healthy_facts(spec)), load_kb())
    assert out.schema == pl.Schema(AUDIT_SCHEMA)
    assert out.is_empty(), out.rows()


def test_each_misconfiguration_is_reported_with_device_and_entry() -> None:
    spec = build_host("bad", 0)
    st = healthy_facts(spec)
    st.power_limit_w[3] = 400.0
    st.pcie_gen[2] = 3
    st.pcie_width[6] = 8
    st.thp_enabled = "never"
    st.governor = "powersave"
    st.irq_far["mlx5_1"] = 4  # every queue of that NIC moved to the far node
    out = audit(_facts("bad", st), load_kb())
    got = {(r["entry_id"], r["device"]) for r in out.iter_rows(named=True)}
    assert ("gpu_power_throttle", "gpu3") in got
    assert ("pcie_link_degraded", "gpu2") in got and ("pcie_link_degraded", "gpu6") in got
    assert ("thp_coverage_loss", "") in got
    assert ("cpu_governor_powersave", "") in got
    irq = out.filter(pl.col("entry_id") == "irq_locality_miss")
    assert irq["device"].to_list() == ["ens2np0"], irq.rows()
    assert "4 of 4 IRQs" in irq["message"][0]
    power = out.filter(pl.col("entry_id") == "gpu_power_throttle").row(0, named=True)
    assert power["message"] == "gpu3 power limit 400 W is below its default 700 W"
    # nothing else is reported
    assert len(got) == 6, sorted(got)


def test_gpu_without_a_local_nic() -> None:
    spec = build_host("skew", 0)
    df = _facts("skew", healthy_facts(spec))
    # move every fast NIC to node 0: GPUs 4-7 (node 1) have none left
    df = df.with_columns(pl.when((pl.col("category") == "nic") & (pl.col("key") == "numa_node"))
                         .then(pl.lit(0.0)).otherwise(pl.col("value_num")).alias("value_num"))
    out = audit(df, load_kb()).filter(pl.col("entry_id") == "gpu_nic_numa_misplacement")
    assert out["device"].to_list() == ["gpu4", "gpu5", "gpu6", "gpu7"]


def test_audit_reads_the_facts_in_force_at_a_time() -> None:
    facts = pl.read_parquet(DATA / "host_facts.parquet")
    labels = pl.read_parquet(DATA / "labels.parquet").row(0, named=True)
    kb = load_kb()
    during = audit(facts, kb, at=labels["time"] + timedelta(seconds=10))
    assert set(during.filter(pl.col("entry_id") == "gpu_power_throttle")["device"]) == {"gpu3", "gpu5"}
    assert audit(facts, kb).is_empty()  # latest facts: the limit was restored


def test_one_node_vm_with_devices_on_node_minus_one_passes_the_irq_check() -> None:
    # The recorded one-node VM (tests/data/proc/normal): its PCI devices report NUMA node -1
    # ("no placement"), which the facts carry as value "-1" / value_num -1.0. No IRQ of such a
    # device can be off its node.
    from ingest.collectors.hostfacts import HostFactsCollector

    r = HostFactsCollector(Path(__file__).parent / "data" / "proc" / "normal").facts()
    df = pl.DataFrame({"time": [T0] * r.n_rows, "host": ["vm"] * r.n_rows, **r.tags, **r.fields})
    assert df.filter((pl.col("key") == "device_node") & (pl.col("value_num") == -1.0)).height > 0
    out = audit(df, load_kb())
    assert out.filter(pl.col("entry_id") == "irq_locality_miss").is_empty(), out.rows()


def test_irq_check_still_flags_a_known_node_given_as_a_number() -> None:
    # Control for the -1 fix: a device on node 1 (value_num 1.0) whose IRQs sit on node 0.
    rows = [("irq", "90", "pci", "0000:ca:00.0", None), ("irq", "90", "device_node", "1", 1.0),
            ("irq", "90", "affinity_nodes", "0", None), ("numa", "", "nodes", "2", 2.0)]
    df = pl.DataFrame([(T0, "h", *r) for r in rows], orient="row",
                      schema=["time", "host", "category", "device", "key", "value", "value_num"])
    out = audit(df, load_kb()).filter(pl.col("entry_id") == "irq_locality_miss")
    assert out["device"].to_list() == ["0000:ca:00.0"] and "off node 1" in out["evidence"][0]


def test_governor_audit_reads_the_derived_fact() -> None:
    """powersave pins the clocks under a generic cpufreq driver (the simulator's
    acpi-cpufreq) and is reported; under intel_pstate it is the driver's own dynamic
    default and is not; conservative is reported under any driver."""
    spec = build_host("gov", 0)
    st = healthy_facts(spec)
    st.governor = "powersave"

    def governor_rows(df: pl.DataFrame) -> list[dict[str, object]]:
        return audit(df, load_kb()).filter(pl.col("entry_id") == "cpu_governor_powersave").rows(named=True)

    def driver(df: pl.DataFrame, name: str) -> pl.DataFrame:
        return df.with_columns(pl.when(pl.col("key") == "scaling_driver").then(pl.lit(name))
                               .otherwise(pl.col("value")).alias("value"))

    [row] = governor_rows(_facts("gov", st))
    assert row["evidence"] == "power.slow_governor = True (== True)"
    assert "holds the clocks low" in row["message"]
    assert governor_rows(driver(_facts("gov", st), "intel_pstate")) == []
    st.governor = "conservative"
    assert len(governor_rows(driver(_facts("gov", st), "intel_pstate"))) == 1
