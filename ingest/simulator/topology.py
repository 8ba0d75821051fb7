"""The simulated host: an 8-GPU server with 2 NUMA nodes, its devices and its static facts.

The layout follows an HGX H100 8-GPU board in a 2-socket server: GPUs 0-3 and their NICs on
node 0, GPUs 4-7 and theirs on node 1, one ConnectX NIC per GPU (GPUDirect RDMA pairs), a
management NIC and the NVMe data disks split over both nodes. The CPU count is smaller than
a real host's (2 x 56 cores, 224 threads) because the fast tier writes one ``cpu`` row per
CPU every 100 ms: 32 logical CPUs keep a host-hour under the 2 s budget while preserving
what the detectors need (per-node CPU sets, far/near node, per-CPU imbalance).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# H100 SXM5 80 GB (NVIDIA H100 datasheet / nvidia-smi -q of an HGX H100).
GPU_MODEL = "NVIDIA H100 80GB HBM3"
GPU_POWER_DEFAULT_W = 700.0
GPU_POWER_MIN_W = 200.0
GPU_POWER_IDLE_W = 72.0
GPU_SM_MAX_MHZ = 1980.0
GPU_SM_IDLE_MHZ = 345.0
GPU_MEM_MAX_MHZ = 2619.0
GPU_MEM_TOTAL = 85_520_809_984  # 81559 MiB as NVML reports it
GPU_PCIE_GEN = 5
GPU_PCIE_WIDTH = 16
GPU_SLOWDOWN_C = 87.0  # SW thermal slowdown target
GPU_HW_SLOWDOWN_C = 92.0


@dataclass(frozen=True)
class GpuModel:
    """What differs between GPU models as NVML reports it (sources: docs/simulator.md)."""

    key: str  # scenario name
    name: str  # nvmlDeviceGetName
    power_default_w: float
    power_min_w: float
    idle_w: float
    sm_max_mhz: float
    mem_max_mhz: float
    mem_total: int
    pcie_gen: int
    nvlinks: int


GPU_MODELS: dict[str, GpuModel] = {m.key: m for m in (
    GpuModel("h100_sxm", GPU_MODEL, GPU_POWER_DEFAULT_W, GPU_POWER_MIN_W, GPU_POWER_IDLE_W, GPU_SM_MAX_MHZ,
             GPU_MEM_MAX_MHZ, GPU_MEM_TOTAL, GPU_PCIE_GEN, 18),
    # H200 SXM 141 GB: same GH100 die and 700 W limit, more and faster HBM3e
    GpuModel("h200_sxm", "NVIDIA H200", 700.0, 200.0, 75.0, 1980.0, 3201.0, 150_754_820_096, 5, 18),
    # A100 SXM4 80 GB: 400 W limit, 1410 MHz boost, PCIe gen4, 12 NVLinks (NVLink 3)
    GpuModel("a100_sxm", "NVIDIA A100-SXM4-80GB", 400.0, 100.0, 55.0, 1410.0, 1593.0, 85_899_345_920, 4, 12),
)}

# Usable PCIe bandwidth per direction for one x16 link, by generation (bytes/s, ~85 % of raw).
PCIE_X16_BPS = {1: 3.4e9, 2: 6.8e9, 3: 13.4e9, 4: 26.8e9, 5: 53.6e9}
NIC_BPS = 50e9  # ConnectX-7 400 Gb/s

CPU_MODEL = "Intel(R) Xeon(R) Platinum 8480+"
CPU_BASE_MHZ = 2000.0
CPU_TURBO_MHZ = 3000.0  # all-core turbo under load
CPU_MIN_MHZ = 800.0

HOST_MEM_TOTAL = 2_113_224_245_248  # MemTotal of a 2 TiB host (kernel reserves the rest)
SWAP_TOTAL = 8 * 2**30
HUGEPAGE_SIZE = 2 * 2**20
PAGE = 4096


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str  # "3": the ``gpu`` tag and the host_facts device, as NVML indexes it
    uuid: str
    node: int
    pci: str
    nic: str  # the NIC it pairs with for GPUDirect RDMA


@dataclass(frozen=True)
class Nic:
    index: int
    name: str  # "mlx5_0": the RDMA device (IRQ action names start with mlx5_comp)
    netdev: str  # the interface: ``net`` table tag and host_facts ``nic`` device
    node: int
    pci: str


@dataclass(frozen=True)
class Disk:
    index: int
    name: str  # "nvme0n1": diskstats name (``disk`` table tag)
    ctrl: str  # "nvme0": controller (IRQ action names nvme0q<k>)
    node: int
    pci: str


@dataclass(frozen=True)
class Irq:
    number: int
    device: str  # "mlx5_0" / "nvme0": the device the injections name
    queue: int
    node: int  # home node (the device's node)
    pci: str

    @property
    def slot(self) -> int:
        """Position of the line among its device's lines (0-based)."""
        return self.queue if self.device.startswith("mlx5") else self.queue - 1

    @property
    def action(self) -> str:
        """The action name /proc/interrupts shows (``interrupts`` device tag, irq ``device`` fact)."""
        if self.device.startswith("mlx5"):
            return f"mlx5_comp{self.queue}@pci:{self.pci}"
        return f"{self.device}q{self.queue}"


@dataclass(frozen=True)
class HostSpec:
    name: str
    index: int
    cpus_per_node: int = 16
    nodes: int = 2
    n_gpus: int = 8
    nic_queues: int = 4
    disk_queues: int = 2
    gpus: tuple[Gpu, ...] = field(default=(), compare=False)
    nics: tuple[Nic, ...] = field(default=(), compare=False)
    disks: tuple[Disk, ...] = field(default=(), compare=False)
    irqs: tuple[Irq, ...] = field(default=(), compare=False)
    gpu_model: GpuModel = field(default_factory=lambda: GPU_MODELS["h100_sxm"], compare=False)
    # benign diversity (scenario options; zeros keep the uniform host of earlier versions)
    inlet_offsets_c: tuple[float, ...] = field(default=(), compare=False)  # per GPU: rack inlet + slot preheat
    baseline_drops: float = 0.0  # share of received packets a healthy RDMA NIC drops (bursty)
    smooth_throttle: bool = False  # CFS throttling from per-period demand bursts (not a 0/1 step)

    @property
    def n_cpus(self) -> int:
        return self.cpus_per_node * self.nodes

    def cpu_node(self, cpu: int) -> int:
        return cpu // self.cpus_per_node

    def node_cpus(self, node: int) -> range:
        return range(node * self.cpus_per_node, (node + 1) * self.cpus_per_node)

    def cpulist(self, node: int) -> str:
        r = self.node_cpus(node)
        return f"{r.start}-{r.stop - 1}"

    @property
    def all_netdevs(self) -> tuple[str, ...]:
        return (*(n.netdev for n in self.nics), MGMT_NETDEV)


MGMT_NETDEV = "eno1"  # management / frontend (request traffic of serving hosts)
MGMT_PCI = "0000:03:00.0"


def build_host(name: str, index: int, *, cpus_per_node: int = 16, n_nics: int = 8, n_disks: int = 4,
               nic_queues: int = 4, gpu_model: str = "h100_sxm", inlet_offsets_c: tuple[float, ...] = (),
               baseline_drops: float = 0.0, smooth_throttle: bool = False) -> HostSpec:
    """The standard simulated host; ``index`` makes UUIDs unique across the fleet. The
    keyword options are the scenario's host options (docs/simulator.md)."""
    if cpus_per_node < 4:
        raise ValueError(f"host {name}: cpus_per_node must be >= 4, got {cpus_per_node}")
    if n_nics not in (4, 8):
        raise ValueError(f"host {name}: nics must be 4 or 8, got {n_nics}")
    if not 1 <= nic_queues <= 128:
        raise ValueError(f"host {name}: nic_queues must be 1..128, got {nic_queues}")
    if gpu_model not in GPU_MODELS:
        raise ValueError(f"host {name}: unknown gpu_model {gpu_model!r}; known: {', '.join(GPU_MODELS)}")
    if inlet_offsets_c and len(inlet_offsets_c) != 8:
        raise ValueError(f"host {name}: inlet_offsets_c needs one value per GPU (8), got {len(inlet_offsets_c)}")
    n_gpus, nodes = 8, 2
    nics = tuple(
        Nic(i, f"mlx5_{i}", f"ens{i + 1}np0", i * nodes // n_nics, f"0000:{0x1A + 0x10 * i:02x}:00.0")
        for i in range(n_nics)
    )
    gpus = tuple(
        Gpu(
            i,
            str(i),
            f"GPU-{index:04x}{i:04x}-5ee1-4a11-8c{i:02d}-{index:012x}",
            i * nodes // n_gpus,
            f"0000:{0x18 + 0x10 * i:02x}:00.0",
            nics[i * n_nics // n_gpus].name,
        )
        for i in range(n_gpus)
    )
    disks = tuple(
        Disk(i, f"nvme{i}n1", f"nvme{i}", i * nodes // n_disks, f"0000:{0x1C + 0x10 * i:02x}:00.0")
        for i in range(n_disks)
    )
    irqs: list[Irq] = []
    number = 120
    q = nic_queues
    for nic in nics:
        for k in range(q):
            irqs.append(Irq(number, nic.name, k, nic.node, nic.pci))
            number += 1
    for d in disks:
        for k in range(2):
            irqs.append(Irq(number, d.ctrl, k + 1, d.node, d.pci))
            number += 1
    return HostSpec(name, index, cpus_per_node, nodes, n_gpus, q, 2, gpus, nics, disks, tuple(irqs),
                    GPU_MODELS[gpu_model], tuple(inlet_offsets_c), float(baseline_drops), bool(smooth_throttle))


# ------------------------------------------------------------------------ host facts

#: Fact state an injection may change; everything else in the facts is fixed by the topology.
@dataclass
class FactState:
    power_limit_w: list[float]
    pcie_gen: list[int]
    pcie_width: list[int]
    irq_far: dict[str, int]  # device -> how many of its IRQ lines (the first ones) moved to the far node
    thp_enabled: str = "always"
    thp_defrag: str = "madvise"
    governor: str = "performance"
    numa_balancing: int = 1


def healthy_facts(host: HostSpec) -> FactState:
    return FactState(
        power_limit_w=[host.gpu_model.power_default_w] * host.n_gpus,
        pcie_gen=[host.gpu_model.pcie_gen] * host.n_gpus,
        pcie_width=[GPU_PCIE_WIDTH] * host.n_gpus,
        irq_far={},
    )


FactRow = tuple[str, str, str, str, float | None]

_GTS = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0"}


def link_speed(gen: int) -> str:
    """sysfs ``current_link_speed`` text of a PCIe generation."""
    return f"{_GTS[gen]} GT/s PCIe"


def fact_rows(host: HostSpec, st: FactState) -> list[FactRow]:
    """(category, device, key, value, value_num) rows with the names the real collectors use
    (ingest/collectors/hostfacts.py, GpuCollector.facts): documented in docs/simulator.md."""
    rows: list[FactRow] = []

    def add(cat: str, dev: str, key: str, value: object, num: bool = True) -> None:
        text = f"{value:g}" if isinstance(value, float) else str(value)
        v: float | None = None
        if num:
            try:
                v = float(text.split()[0])
            except (ValueError, IndexError):
                v = None
        rows.append((cat, dev, key, text, v))

    add("system", "", "kernel", "6.8.0-sim")
    add("cpu", "", "online", f"0-{host.n_cpus - 1}", False)
    add("cpu", "", "count", host.n_cpus)
    add("cpu", "", "model", CPU_MODEL)
    add("numa", "", "nodes", host.nodes)
    for n in range(host.nodes):
        add("numa", str(n), "cpulist", host.cpulist(n), False)
        add("numa", str(n), "cpus", host.cpus_per_node)
    for nic in host.nics:
        add("nic", nic.netdev, "driver", "mlx5_core")
        add("nic", nic.netdev, "pci", nic.pci)
        add("nic", nic.netdev, "numa_node", nic.node)
        add("nic", nic.netdev, "speed", 400000)
    add("nic", MGMT_NETDEV, "driver", "igb")
    add("nic", MGMT_NETDEV, "pci", MGMT_PCI)
    add("nic", MGMT_NETDEV, "numa_node", 0)
    add("nic", MGMT_NETDEV, "speed", 1000)
    for d in host.disks:
        add("nvme", d.name, "driver", "nvme")
        add("nvme", d.name, "pci", d.pci)
        add("nvme", d.name, "numa_node", d.node)
    # PCIe link of every PCI function (the real collector lists NICs and disks; GPUs added
    # here because a GPU's trained-down link is exactly what the audit should see)
    links = [(n.pci, 4, 16, 4, 16) for n in host.nics] + [(d.pci, 4, 4, 4, 4) for d in host.disks]
    gm = host.gpu_model
    links += [(g.pci, st.pcie_gen[g.index], st.pcie_width[g.index], gm.pcie_gen, GPU_PCIE_WIDTH) for g in host.gpus]
    for addr, gen, width, gmax, wmax in links:
        add("pcie", addr, "current_link_speed", link_speed(gen))
        add("pcie", addr, "max_link_speed", link_speed(gmax))
        add("pcie", addr, "current_link_width", width)
        add("pcie", addr, "max_link_width", wmax)
    for q in host.irqs:
        node = 1 - q.node if q.slot < st.irq_far.get(q.device, 0) else q.node
        dev = str(q.number)
        add("irq", dev, "device", q.action)
        add("irq", dev, "smp_affinity_list", host.cpulist(node), False)
        add("irq", dev, "effective_affinity_list", str(host.node_cpus(node).start + q.queue % host.cpus_per_node),
            False)
        add("irq", dev, "affinity_nodes", str(node), False)
        add("irq", dev, "pci", q.pci)
        add("irq", dev, "device_node", q.node)
    add("thp", "", "enabled", st.thp_enabled)
    add("thp", "", "defrag", st.thp_defrag)
    for c in range(host.n_cpus):
        add("power", f"policy{c}", "scaling_governor", st.governor)
        add("power", f"policy{c}", "related_cpus", str(c), False)
    add("power", "", "scaling_driver", "acpi-cpufreq")
    for g in host.gpus:
        dev = str(g.index)
        add("gpu", dev, "uuid", g.uuid)
        add("gpu", dev, "name", gm.name)
        add("gpu", dev, "pci_bus_id", g.pci)
        add("gpu", dev, "numa_node", g.node)
        add("gpu", dev, "power_limit_default_w", gm.power_default_w)
        add("gpu", dev, "power_limit_w", st.power_limit_w[g.index])
        add("gpu", dev, "power_limit_min_w", gm.power_min_w)
        add("gpu", dev, "power_limit_max_w", gm.power_default_w)
        add("gpu", dev, "pcie_link_gen_max", gm.pcie_gen)
        add("gpu", dev, "pcie_link_width_max", GPU_PCIE_WIDTH)
        add("gpu", dev, "persistence_mode", 1)
        add("gpu", dev, "nvlinks_active", gm.nvlinks)
    add("gpu", "", "driver_version", "550.90.07", False)
    add("gpu", "", "cuda_driver_version", "12.4", False)
    return rows
