"""Pin the interrupts of one or more PCI devices to the CPUs of each one's local NUMA node.

``pci`` is one address or several (comma-separated: every NIC of an incident, each to its own
node). IRQs come from /sys/bus/pci/devices/<pci>/msi_irqs (MSI/MSI-X) or its ``irq`` file
(legacy INTx); the node from its ``numa_node`` (-1 = no NUMA info: then ``cpus`` must be
given, and applies to every device); the node's CPUs from
/sys/devices/system/node/node<N>/cpulist. The state is keyed by IRQ, so several devices are
one state. Managed IRQs (kernel-chosen affinity, e.g. NVMe queues) refuse writes with EIO: the
frame then restores every IRQ already changed.
"""

from __future__ import annotations

import sys
from typing import Any

from remediation import registry
from remediation.errors import ParamError
from remediation.scripts import _base
from remediation.scripts._base import Context, ScriptFailed, State, Unsupported


def _devices(params: dict[str, Any]) -> list[str]:
    pcis = list(dict.fromkeys(str(params["pci"]).split(",")))
    if "irqs" in params and len(pcis) > 1:
        raise ParamError(f"irq_affinity: irqs names the IRQs of one device, not of {len(pcis)}")
    return pcis


def _device_irqs(ctx: Context, params: dict[str, Any], pci: str) -> list[int]:
    if "irqs" in params:
        return registry.expand_cpulist(params["irqs"])
    dev = ctx.path(f"/sys/bus/pci/devices/{pci}")
    if not dev.is_dir():
        raise Unsupported(f"no PCI device {pci} on this host ({dev})")
    msi = dev / "msi_irqs"
    irqs = sorted(int(p.name) for p in msi.iterdir() if p.name.isdigit()) if msi.is_dir() else []
    if not irqs and (dev / "irq").exists():
        legacy = int(_base.read_text(dev / "irq"))
        irqs = [legacy] if legacy > 0 else []
    if not irqs:
        raise Unsupported(f"PCI device {pci} has no IRQs")
    return irqs


def target_cpus(ctx: Context, params: dict[str, Any], pci: str) -> str:
    if "cpus" in params:
        return ",".join(map(str, registry.expand_cpulist(params["cpus"])))
    dev = ctx.path(f"/sys/bus/pci/devices/{pci}")
    node = int(_base.read_text(dev / "numa_node"))
    if node < 0:
        raise Unsupported(f"PCI device {pci} reports no NUMA node (numa_node=-1); give cpus")
    cpulist = _base.read_text(ctx.path(f"/sys/devices/system/node/node{node}/cpulist"))
    return ",".join(map(str, registry.expand_cpulist(cpulist)))


def read(ctx: Context, params: dict[str, Any]) -> State:
    # Normalised to an expanded comma list so kernel "0-3" and "0,1,2,3" compare equal.
    state: State = {}
    for pci in _devices(params):
        for irq in _device_irqs(ctx, params, pci):
            path = ctx.path(f"/proc/irq/{irq}/smp_affinity_list")
            if not path.exists():
                continue  # an MSI vector that is not allocated right now
            state[str(irq)] = ",".join(map(str, registry.expand_cpulist(_base.read_text(path))))
    if not state:
        raise Unsupported(f"none of the IRQs of {params.get('pci')} are present in /proc/irq")
    return state


def plan(ctx: Context, params: dict[str, Any], current: State) -> State:
    online = ctx.path("/sys/devices/system/cpu/online")
    up = set(registry.expand_cpulist(_base.read_text(online))) if online.exists() else None
    out: State = {}
    for pci in _devices(params):
        cpus = target_cpus(ctx, params, pci)
        missing = set(registry.expand_cpulist(cpus)) - up if up is not None else set()
        if missing:
            raise ScriptFailed(f"target CPUs {sorted(missing)} of {pci} are not online")
        out.update({str(irq): cpus for irq in _device_irqs(ctx, params, pci) if str(irq) in current})
    return out


def write(ctx: Context, state: State) -> None:
    for irq, cpus in state.items():
        _base.write_text(ctx.path(f"/proc/irq/{int(irq)}/smp_affinity_list"), str(cpus))


def check_state(script_id: str, state: State) -> State:
    """IRQ number -> CPU list."""

    def cpus(key: str, v: Any) -> str:
        if not isinstance(v, str) or not registry.CPULIST_RE.fullmatch(v):
            raise ParamError(f"{script_id}: IRQ {key}: {v!r} is not a CPU list")
        return v

    return _base.check_keyed_state(script_id, state, r"\d{1,6}", cpus)


def main(argv: list[str] | None = None) -> int:
    return _base.main("irq_affinity", read, plan, write, argv, check_state=check_state)


if __name__ == "__main__":
    sys.exit(main())
