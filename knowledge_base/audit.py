"""Static audit: persistent misconfigurations read from host facts alone.

No window needs to be anomalous: a GPU whose NIC sits on the other NUMA node, IRQs pinned
off their device's node, THP disabled, a power limit below default, a PCIe link trained
below its maximum, a governor holding the clocks low ... are reported from the facts, because a host
misconfigured since boot looks "normal" to its own history.

Checks are declared in the entries (``[[audit]]``, see docs/knowledge_base.md):

* ``fact``: ``category``/``key`` (host-wide or on each device; or a derived fact such as
  ``power.slow_governor``, knowledge_base.facts) compared with ``op``/``value``;
* ``fact_ratio``: on each device of ``category``, ``key < factor * ref_key``;
* ``gpu_nic_numa``: a GPU has no fast NIC (>= 100 Gb/s) on its NUMA node while other nodes
  have some (every GPUDirect transfer crosses the socket link);
* ``irq_off_node``: IRQs of a PCI device whose affinity excludes the device's own node
  (irq facts ``device_node`` and ``affinity_nodes``).

Fact names are those of ingest/collectors/hostfacts.py (and the GPU collector's facts).

``message`` may use ``{device}``, ``{value}``, ``{ref}`` and ``{detail}``.
Output (:data:`AUDIT_SCHEMA`): host, entry_id, check, device, severity, message, evidence.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

import polars as pl

from knowledge_base.facts import HostFacts, _compare, _norm_pci
from knowledge_base.loader import DERIVED, AuditCheck, Entry, KnowledgeBase, load_kb

AUDIT_SCHEMA: dict[str, pl.DataType] = {
    "host": pl.String(),
    "entry_id": pl.String(),
    "check": pl.String(),
    "device": pl.String(),
    "severity": pl.String(),
    "message": pl.String(),
    "evidence": pl.String(),
}


class _SafeDict(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _msg(check: AuditCheck, **kw: Any) -> str:
    shown = {k: f"{v:g}" if isinstance(v, float) else v for k, v in kw.items()}
    return check.message.format_map(_SafeDict(shown))


def _owners(hf: HostFacts) -> dict[str, str]:
    """PCI address -> the name operators know it by (gpu3, ens1np0, nvme0n1)."""
    out: dict[str, str] = {}
    for dev, pci in hf.device_values("gpu", "pci_bus_id").items():
        out[_norm_pci(str(pci))] = f"gpu{dev}"
    for cat in ("nic", "nvme"):
        for dev, pci in hf.device_values(cat, "pci").items():
            out[_norm_pci(str(pci))] = dev
    return out


def _node(v: Any) -> int | None:
    """A NUMA node fact as a node number; None when unknown or negative (no placement)."""
    try:
        node = int(float(v))
    except (TypeError, ValueError):
        return None
    return node if node >= 0 else None


def _run_check(entry: Entry, check: AuditCheck, hf: HostFacts) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(device: str, evidence: str, **kw: Any) -> None:
        out.append({"host": hf.host, "entry_id": entry.id, "check": check.check, "device": device,
                    "severity": check.severity, "message": _msg(check, device=device or "host", **kw),
                    "evidence": evidence})

    if check.check == "fact":
        name = f"{check.category}.{check.key}"
        if name in DERIVED:  # one host-wide value
            targets = {"": hf.derived(name)}
        else:
            host_v = hf.value(check.category, check.key)
            targets = {"": host_v} if host_v is not None else hf.device_values(check.category, check.key)
        bad = {d: v for d, v in sorted(targets.items()) if v is not None and _compare(check.op, v, check.value)}
        if len(bad) > 4:  # e.g. one cpufreq policy per CPU: one row, not 224
            vals = sorted({str(v) for v in bad.values()})
            add("", f"{check.category}.{check.key} {check.op} {check.value!r} on {len(bad)}/{len(targets)} devices "
                    f"({', '.join(list(bad)[:4])} ...)", value=", ".join(vals))
        else:
            for dev, v in bad.items():
                add(dev, f"{check.category}.{check.key} = {v!r} ({check.op} {check.value!r})", value=v)
    elif check.check == "fact_ratio":
        owners = _owners(hf) if check.category == "pcie" else {}
        for dev, v in sorted(hf.device_values(check.category, check.key).items()):
            ref = hf.value(check.category, check.ref_key, dev)
            try:
                low = float(v) < check.factor * float(ref)
            except (TypeError, ValueError):
                continue
            if low:
                name = owners.get(_norm_pci(dev), f"gpu{dev}" if check.category == "gpu" else dev)
                add(name, f"{check.category}.{check.key} = {v!r} < {check.factor:g} x {check.ref_key} = {ref!r}"
                          f"{f' (PCI {dev})' if name != dev else ''}", value=v, ref=ref)
    elif check.check == "gpu_nic_numa":
        # GPUs with no fast NIC (>= 100 Gb/s) on their node while such NICs exist elsewhere:
        # every GPUDirect transfer of that GPU crosses the socket link
        nics = {n: hf.node_of(n) for n, sp in hf.device_values("nic", "speed").items()
                if isinstance(sp, int | float) and sp >= 100_000}
        nic_nodes = {nd for nd in nics.values() if nd is not None}
        for dev in sorted(hf.devices("gpu"), key=lambda d: (len(d), d)):
            g = f"gpu{dev}"
            node = hf.node_of(g)
            if node is not None and nic_nodes and node not in nic_nodes:
                add(g, f"{g} on node {node}; fast NICs only on node(s) {sorted(nic_nodes)}",
                    value=node, ref=",".join(map(str, sorted(nic_nodes))))
    elif check.check == "irq_off_node":
        owners = _owners(hf)
        per_dev: dict[str, list[str]] = defaultdict(list)
        total: dict[str, int] = defaultdict(int)
        home: dict[str, str] = {}
        for irq, pci in hf.device_values("irq", "pci").items():
            dnode = _node(hf.value("irq", "device_node", irq))
            aff = hf.value("irq", "affinity_nodes", irq)
            # node -1 (read back as -1.0): the device has no NUMA placement (one-node VMs),
            # so no affinity can be off it
            if dnode is None or aff is None:
                continue
            name = owners.get(_norm_pci(str(pci)), str(pci))
            total[name] += 1
            home[name] = str(dnode)
            if home[name] not in str(aff).split(","):
                per_dev[name].append(irq)
        for dev, off in sorted(per_dev.items()):
            off = sorted(off, key=lambda s: (len(s), s))
            add(dev, f"{len(off)}/{total[dev]} IRQs of {dev} ({', '.join(off[:8])}{' ...' if len(off) > 8 else ''}) "
                     f"have affinity off node {home[dev]}",
                value=len(off), ref=total[dev], detail=f"{len(off)} of {total[dev]} IRQs")
    return out


def audit(host_facts: pl.DataFrame | None, kb: KnowledgeBase | None = None,
          at: datetime | None = None) -> pl.DataFrame:
    """Run every entry's static checks on every host of ``host_facts`` (the facts in force at
    ``at``; default: the latest). Returns the ``audit`` table, sorted."""
    kb = kb or load_kb()
    if host_facts is None or host_facts.is_empty():
        return pl.DataFrame(schema=AUDIT_SCHEMA)
    recs: list[dict[str, Any]] = []
    for host in sorted(host_facts["host"].unique().to_list()):
        hf = HostFacts.from_frame(host_facts, host, at)
        for entry in kb:
            for check in entry.audit:
                recs.extend(_run_check(entry, check, hf))
    if not recs:
        return pl.DataFrame(schema=AUDIT_SCHEMA)
    return pl.DataFrame(recs, schema=AUDIT_SCHEMA).sort("host", "entry_id", "device", "check")
