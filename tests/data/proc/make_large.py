"""Generate tests/data/proc/large: a 192-CPU, 2-socket GPU-server-like host.

    .venv/bin/python tests/data/proc/make_large.py        # rewrites tests/data/proc/large

Deterministic (seeded). Layout, in the kernel's own formats:
- NUMA node 0 = CPUs 0-47,96-143, node 1 = 48-95,144-191 (SMT siblings +96);
- two ConnectX NICs (mlx5): ens1f0np0 at 0000:17:00.0 on node 0 with its completion
  IRQs pinned to node-0 CPUs (good locality), ens2f0np0 at 0000:ca:00.0 on node 1 with
  its completion IRQs *also* pinned to node-0 CPUs (the IRQ-locality miss to detect);
- four NVMe drives (two per node), 33 MSI-X vectors each with managed affinity spread
  over all CPUs; nvme3 has its PCIe link trained down (8 GT/s x4 of 16 GT/s x4);
- ~300 lines in /proc/interrupts, incl. multi-action and named (NMI, LOC ...) lines;
- cgroup v2 with init.scope, system.slice, user.slice and a CPU-throttled kubepods.slice;
- cpufreq with one policy per CPU, THP always.
The host facts and collector tests derive their expected values from these choices.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

OUT = Path(__file__).with_name("large")
NCPU = 192
NODE_CPUS = {
    0: list(range(0, 48)) + list(range(96, 144)),
    1: list(range(48, 96)) + list(range(144, 192)),
}
CPU_NODE = {c: n for n, cs in NODE_CPUS.items() for c in cs}
PREC = 4  # width of IRQ numbers (nr_irqs >= 1000 on such hosts)

NICS = [  # name, pci, root port, node, irq base, completion-IRQ CPUs
    ("ens1f0np0", "0000:17:00.0", "0000:16:02.0", 0, 200, NODE_CPUS[0][:48]),
    ("ens2f0np0", "0000:ca:00.0", "0000:c9:02.0", 1, 300, NODE_CPUS[0][:48]),  # misplaced
]
NVMES = [  # index, pci, root port, node, irq base, link (speed, width) current / max
    (0, "0000:31:00.0", "0000:30:02.0", 0, 400, ("16.0 GT/s PCIe", "4"), ("16.0 GT/s PCIe", "4")),
    (1, "0000:32:00.0", "0000:30:03.0", 0, 440, ("16.0 GT/s PCIe", "4"), ("16.0 GT/s PCIe", "4")),
    (2, "0000:b1:00.0", "0000:b0:02.0", 1, 480, ("16.0 GT/s PCIe", "4"), ("16.0 GT/s PCIe", "4")),
    (3, "0000:b2:00.0", "0000:b0:03.0", 1, 520, ("8.0 GT/s PCIe", "4"), ("16.0 GT/s PCIe", "4")),
]


def cpulist(cpus: list[int]) -> str:
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def w(rel: str, text: str) -> None:
    p = OUT / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def link(rel: str, target: str) -> None:
    p = OUT / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, p)


def counts_on(rng: random.Random, cpus: list[int], big: bool = False) -> list[int]:
    row = [0] * NCPU
    for c in cpus:
        row[c] = rng.randrange(3_000_000_000, 4_294_967_295) if big else rng.randrange(0, 2_000_000)
    return row


def irq_line(irq: int, row: list[int], chip: str, hwirq: int, trig: str, action: str) -> str:
    return (
        f"{irq:>{PREC}}:"
        + "".join(f" {v:10d}" for v in row)
        + f" {chip:>8} {hwirq:>{PREC}}-{trig:<8}  {action}"
    )


def interrupts(rng: random.Random) -> tuple[list[str], dict[int, list[int]], dict[str, list[int]]]:
    """Lines of /proc/interrupts, IRQ -> affinity CPUs, PCI address -> its MSI IRQs."""
    lines: list[str] = []
    aff: dict[int, list[int]] = {}
    msi: dict[str, list[int]] = {}
    every = list(range(NCPU))
    legacy = [
        (0, "IO-APIC", 2, "edge", "timer"),
        (1, "IO-APIC", 1, "edge", "i8042"),
        (4, "IO-APIC", 4, "edge", "ttyS0"),
        (8, "IO-APIC", 8, "edge", "rtc0"),
        (9, "IO-APIC", 9, "fasteoi", "acpi"),
        (12, "IO-APIC", 12, "edge", "i8042"),
        (16, "IO-APIC", 16, "fasteoi", "i801_smbus"),
        (18, "IO-APIC", 18, "fasteoi", "ehci_hcd:usb1"),
    ]
    for irq, chip, hw, trig, act in legacy:
        cpu = rng.choice(every)
        lines.append(irq_line(irq, counts_on(rng, [cpu]), chip, hw, trig, act))
        aff[irq] = every
    for k in range(4):
        irq = 24 + k
        lines.append(irq_line(irq, counts_on(rng, [0]), "DMAR-MSI", k, "edge", f"dmar{k}"))
        aff[irq] = [0]
    for k, port in enumerate(
        [
            "0000:00:01.0",
            "0000:16:02.0",
            "0000:30:02.0",
            "0000:30:03.0",
            "0000:b0:02.0",
            "0000:b0:03.0",
            "0000:c9:02.0",
            "0000:00:1c.0",
        ]
    ):
        irq = 30 + k
        lines.append(
            irq_line(irq, counts_on(rng, [k]), f"PCI-MSI-{port}", 0, "edge", "PCIe PME, aerdrv")
        )
        aff[irq] = every
    for _name, pci, _port, _node, base, comp_cpus in NICS:
        lines.append(
            irq_line(
                base,
                counts_on(rng, [comp_cpus[0]]),
                f"IR-PCI-MSIX-{pci}",
                0,
                "edge",
                f"mlx5_async0@pci:{pci}",
            )
        )
        aff[base] = comp_cpus[:1]
        msi[pci] = [base]
        for q in range(63):
            irq = base + 1 + q
            cpu = comp_cpus[q % len(comp_cpus)]
            lines.append(
                irq_line(
                    irq,
                    counts_on(rng, [cpu], big=True),
                    f"IR-PCI-MSIX-{pci}",
                    q + 1,
                    "edge",
                    f"mlx5_comp{q}@pci:{pci}",
                )
            )
            aff[irq] = [cpu]
            msi[pci].append(irq)
    for idx, pci, _port, _node, base, _cur, _max in NVMES:
        lines.append(
            irq_line(base, counts_on(rng, [0]), f"IR-PCI-MSIX-{pci}", 0, "edge", f"nvme{idx}q0")
        )
        aff[base] = every
        msi[pci] = [base]
        for q in range(1, 33):
            irq = base + q
            cpus = list(range((q - 1) * 6, q * 6))  # managed affinity: 6 CPUs per queue
            lines.append(
                irq_line(
                    irq, counts_on(rng, cpus), f"IR-PCI-MSIX-{pci}", q, "edge", f"nvme{idx}q{q}"
                )
            )
            aff[irq] = cpus
            msi[pci].append(irq)
    named = [
        ("NMI", "Non-maskable interrupts"),
        ("LOC", "Local timer interrupts"),
        ("SPU", "Spurious interrupts"),
        ("PMI", "Performance monitoring interrupts"),
        ("IWI", "IRQ work interrupts"),
        ("RTR", "APIC ICR read retries"),
        ("RES", "Rescheduling interrupts"),
        ("CAL", "Function call interrupts"),
        ("TLB", "TLB shootdowns"),
        ("TRM", "Thermal event interrupts"),
        ("THR", "Threshold APIC interrupts"),
        ("DFR", "Deferred Error APIC interrupts"),
        ("MCE", "Machine check exceptions"),
        ("MCP", "Machine check polls"),
    ]
    for label, desc in named:
        row = [
            rng.randrange(0, 900_000_000)
            if label in ("LOC", "RES", "CAL", "TLB")
            else rng.randrange(0, 50)
            for _ in range(NCPU)
        ]
        lines.append(f"{label:>{PREC}}:" + "".join(f" {v:10d}" for v in row) + f"   {desc}")
    lines.append(f"{'ERR':>{PREC}}: {7:10d}")
    lines.append(f"{'MIS':>{PREC}}: {0:10d}")
    for label, desc in [
        ("PIN", "Posted-interrupt notification event"),
        ("NPI", "Nested posted-interrupt event"),
        ("PIW", "Posted-interrupt wakeup event"),
    ]:
        lines.append(f"{label:>{PREC}}:" + "".join(f" {0:10d}" for _ in range(NCPU)) + f"   {desc}")
    return lines, aff, msi


def main() -> None:
    rng = random.Random(20240601)
    if OUT.exists():
        shutil.rmtree(OUT)
    header = " " * (PREC + 8) + "".join(f"CPU{c:<8d}" for c in range(NCPU)).rstrip()
    # ------------------------------------------------------------------ /proc/stat
    cpu_rows = []
    for c in range(NCPU):
        busy = 1 if CPU_NODE[c] == 0 else 3
        cpu_rows.append(
            [
                rng.randrange(10**6, 10**7) * busy,
                rng.randrange(0, 1000),
                rng.randrange(10**5, 10**6),
                rng.randrange(10**7, 10**8),
                rng.randrange(0, 10**4),
                0,
                rng.randrange(0, 10**5),
                0,
                0,
                0,
            ]
        )
    tot = [sum(r[j] for r in cpu_rows) for j in range(10)]
    stat = ["cpu  " + " ".join(map(str, tot))]
    stat += [f"cpu{c} " + " ".join(map(str, r)) for c, r in enumerate(cpu_rows)]
    stat += [
        "intr 98765432101 0 9 0 0",
        "ctxt 123456789012",
        "btime 1717200000",
        "processes 4567890",
        "procs_running 97",
        "procs_blocked 3",
        "softirq 5555555 0 1 2 3 4 5 6 7 8 9",
    ]
    w("proc/stat", "\n".join(stat) + "\n")
    w("proc/loadavg", "95.12 93.40 90.07 97/3120 4567890\n")
    w("proc/sys/kernel/osrelease", "5.15.0-105-generic\n")
    w(
        "proc/cpuinfo",
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8468\n\n",
    )
    # ------------------------------------------------------------ interrupts / irq
    lines, aff, msi = interrupts(rng)
    w("proc/interrupts", header + "\n" + "\n".join(lines) + "\n")
    for irq, cpus in aff.items():
        w(f"proc/irq/{irq}/smp_affinity_list", cpulist(cpus) + "\n")
        w(f"proc/irq/{irq}/effective_affinity_list", str(cpus[0]) + "\n")
    soft = [
        "HI",
        "TIMER",
        "NET_TX",
        "NET_RX",
        "BLOCK",
        "IRQ_POLL",
        "TASKLET",
        "SCHED",
        "HRTIMER",
        "RCU",
    ]
    srows = [
        f"{s:>12}:" + "".join(f" {rng.randrange(0, 4_000_000_000):10d}" for _ in range(NCPU))
        for s in soft
    ]
    w(
        "proc/softirqs",
        " " * 20
        + "".join(f"CPU{c:<8d}" for c in range(NCPU)).rstrip()
        + "\n"
        + "\n".join(srows)
        + "\n",
    )
    # ------------------------------------------------------------------- NUMA, cpu
    for n, cpus in NODE_CPUS.items():
        w(f"sys/devices/system/node/node{n}/cpulist", cpulist(cpus) + "\n")
        w(
            f"sys/devices/system/node/node{n}/numastat",
            f"numa_hit {10**9 + n}\nnuma_miss {2 * 10**6 + n}\nnuma_foreign {3 * 10**6 + n}\n"
            f"interleave_hit {4000 + n}\nlocal_node {9 * 10**8 + n}\nother_node {10**8 + n}\n",
        )
        w(
            f"sys/devices/system/node/node{n}/meminfo",
            f"Node {n} MemTotal:       1056462848 kB\nNode {n} MemFree:        {123456789 + n} kB\n"
            f"Node {n} MemUsed:        932006059 kB\nNode {n} AnonPages:      {700000000 + n} kB\n"
            f"Node {n} AnonHugePages:  {500000000 + n} kB\nNode {n} HugePages_Total:     0\n"
            f"Node {n} HugePages_Free:      0\nNode {n} HugePages_Surp:      0\n",
        )
    w("sys/devices/system/cpu/online", f"0-{NCPU - 1}\n")
    for c in range(NCPU):
        w(
            f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq",
            f"{2100000 + 1000 * (c % 7)}\n",
        )
        pol = f"sys/devices/system/cpu/cpufreq/policy{c}"
        w(f"{pol}/scaling_governor", ("powersave" if c == 150 else "performance") + "\n")
        w(f"{pol}/scaling_driver", "intel_pstate\n")
        w(f"{pol}/related_cpus", f"{c}\n")
    w("sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never\n")
    w("sys/kernel/mm/transparent_hugepage/defrag", "always defer defer+madvise [madvise] never\n")

    # ---------------------------------------------------------------- PCI devices
    def pci_dev(
        pci: str, port: str, node: int, driver: str, cur: tuple[str, str], mx: tuple[str, str]
    ) -> str:
        dom = "pci" + port[:7]  # host bridge of the root port, e.g. pci0000:16
        rel = f"sys/devices/{dom}/{port}/{pci}"
        w(f"{rel}/numa_node", f"{node}\n")
        w(f"{rel}/current_link_speed", cur[0] + "\n")
        w(f"{rel}/current_link_width", cur[1] + "\n")
        w(f"{rel}/max_link_speed", mx[0] + "\n")
        w(f"{rel}/max_link_width", mx[1] + "\n")
        for irq in msi[pci]:
            w(f"{rel}/msi_irqs/{irq}", "msix\n")
        link(f"{rel}/driver", f"../../../../bus/pci/drivers/{driver}")
        link(f"sys/bus/pci/devices/{pci}", f"../../../devices/{dom}/{port}/{pci}")
        return rel

    for name, pci, port, node, _base, _cpus in NICS:
        rel = pci_dev(
            pci, port, node, "mlx5_core", ("32.0 GT/s PCIe", "16"), ("32.0 GT/s PCIe", "16")
        )
        w(f"{rel}/net/{name}/speed", "200000\n")
        link(f"{rel}/net/{name}/device", "../../../" + pci)
        link(f"sys/class/net/{name}", f"../../devices/{rel[len('sys/devices/') :]}/net/{name}")
    for name in ("lo", "docker0"):
        (OUT / f"sys/devices/virtual/net/{name}").mkdir(parents=True)
        link(f"sys/class/net/{name}", f"../../devices/virtual/net/{name}")
    for idx, pci, port, node, _base, cur, mx in NVMES:
        rel = pci_dev(pci, port, node, "nvme", cur, mx)
        (OUT / f"{rel}/nvme/nvme{idx}/nvme{idx}n1").mkdir(parents=True)
        link(f"{rel}/nvme/nvme{idx}/nvme{idx}n1/device", f"../../nvme{idx}")
        link(
            f"sys/block/nvme{idx}n1",
            f"../devices/{rel[len('sys/devices/') :]}/nvme/nvme{idx}/nvme{idx}n1",
        )
    for name in ("dm-0", "loop0"):
        (OUT / f"sys/devices/virtual/block/{name}").mkdir(parents=True)
        link(f"sys/block/{name}", f"../devices/virtual/block/{name}")
    disk = []
    for i, name in enumerate(
        ["loop0", "nvme0n1", "nvme0n1p1", "nvme0n1p2", "nvme1n1", "nvme2n1", "nvme3n1", "dm-0"]
    ):
        major, minor = (7, 0) if name == "loop0" else (253, 0) if name == "dm-0" else (259, i)
        v = [1000 * (i + 1) + k for k in range(17)]
        disk.append(f"{major:4d} {minor:7d} {name} " + " ".join(map(str, v)))
    w("proc/diskstats", "\n".join(disk) + "\n")
    # ---------------------------------------------------------------- net, memory
    dev = [
        "Inter-|   Receive                                                |  Transmit",
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed",
    ]
    for k, name in enumerate(["lo", "ens1f0np0", "ens2f0np0", "docker0"]):
        v = [
            10**12 * (k + 1),
            10**9 * (k + 1),
            k,
            10 * k,
            100 * k,
            0,
            0,
            5,
            2 * 10**12 * (k + 1),
            2 * 10**9 * (k + 1),
            0,
            3 * k,
            0,
            0,
            0,
            0,
        ]
        dev.append(f"{name:>6}: " + " ".join(f"{x:>8d}" for x in v))
    w("proc/net/dev", "\n".join(dev) + "\n")
    w(
        "proc/net/snmp",
        "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n"
        "Tcp: 1 200 120000 -1 5551234 778899 1200 3400 812 98765432109 87654321098 123456789 42 56789 0\n",
    )
    normal = Path(__file__).with_name("normal") / "proc"
    w("proc/meminfo", (normal / "meminfo").read_text())
    w("proc/vmstat", (normal / "vmstat").read_text())
    psi = {"cpu": "12.50", "memory": "0.75", "io": "3.10"}
    for r, avg in psi.items():
        w(
            f"proc/pressure/{r}",
            f"some avg10={avg} avg60=0.90 avg300=0.40 total={1000000 + len(r)}\n"
            f"full avg10=0.00 avg60=0.00 avg300=0.00 total={len(r)}\n",
        )
    # ------------------------------------------------------------------ cgroup v2
    cg = "sys/fs/cgroup"
    w(f"{cg}/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
    w(
        f"{cg}/cpu.stat",
        "usage_usec 999999999999\nuser_usec 800000000000\nsystem_usec 199999999999\n",
    )
    groups = {
        "init.scope": None,
        "system.slice": ("max 100000", 1234567890, 0, 0, 0, 8_589_934_592, "max"),
        "user.slice": ("max 100000", 222222222, 0, 0, 0, 1_073_741_824, "max"),
        "kubepods.slice": (
            "4000000 100000",
            98765432100,
            120000,
            30000,
            987654321,
            805_306_368_000,
            "858993459200",
        ),
        "kubepods.slice/kubepods-burstable.slice": (
            "max 100000",
            5555555555,
            100,
            10,
            12345,
            107_374_182_400,
            "max",
        ),
    }
    for g, spec in groups.items():
        if spec is None:  # controllers not enabled for it: only cpu.stat's usage exists
            w(f"{cg}/{g}/cpu.stat", "usage_usec 4242\nuser_usec 4000\nsystem_usec 242\n")
            continue
        cpu_max, usage, periods, throttled, tusec, cur, mmax = spec
        w(
            f"{cg}/{g}/cpu.stat",
            f"usage_usec {usage}\nuser_usec {usage - 1}\nsystem_usec 1\nnr_periods {periods}\n"
            f"nr_throttled {throttled}\nthrottled_usec {tusec}\nnr_bursts 0\nburst_usec 0\n",
        )
        w(f"{cg}/{g}/cpu.max", cpu_max + "\n")
        w(f"{cg}/{g}/memory.current", f"{cur}\n")
        w(f"{cg}/{g}/memory.max", f"{mmax}\n")
        w(
            f"{cg}/{g}/cpu.pressure",
            f"some avg10=2.50 avg60=2.00 avg300=1.00 total={usage // 7}\n"
            "full avg10=1.00 avg60=1.00 avg300=0.50 total=77\n",
        )
        w(
            f"{cg}/{g}/memory.pressure",
            f"some avg10=0.00 avg60=0.00 avg300=0.00 total={usage // 11}\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        )


if __name__ == "__main__":
    main()
