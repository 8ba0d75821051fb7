"""GPU state from NVML (the ``pynvml`` module of nvidia-ml-py): measurement ``gpu``.

One in-process NVML session, opened once; no ``nvidia-smi`` fork per poll. Every query is
named in :data:`TICK_QUERIES` (read every tick) or :data:`STATIC_QUERIES` (read when the
collector starts and again in :meth:`GpuCollector.facts`). The same tables drive the live
collector, :func:`record_nvml` (writes a recording of a real GPU) and :class:`ReplayNvml`
(plays a recording back through the same code path, for tests).

Cost control: a query that raises ``NVMLError_NotSupported`` (or ``FunctionNotFound`` on an
old driver) for a device is remembered and never issued again for that device: the field
stays null. Any other NVML error nulls the field for that tick only and is logged once per
(device, query). Static values (max clocks, default power limit, maximum PCIe link, UUID)
are cached, not re-read every tick.

Counter fields (``energy``, ``power_violation``, ``thermal_violation``, ``nvlink_tx``,
``nvlink_rx``, ``ecc_*``, ``xid_events``) are the raw cumulative values;
:class:`ingest.counters.CounterTracker` turns them into deltas. ``xid_events`` is a count
kept by this collector since it started (NVML delivers XIDs as events, not as a counter).
"""

from __future__ import annotations

import ctypes
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ingest.atomic import write_atomic
from ingest.collectors.base import Reading, SourceUnavailable, proc_path
from ingest.schema import GPU, Tier

log = logging.getLogger(__name__)

# NVML constants, copied so that this module imports (and ReplayNvml works) without pynvml.
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138  # cumulative KiB, scopeId = link
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_NVLINK_MAX_LINKS = 36
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
nvmlEventTypeXidCriticalError = 0x8

#: Errors meaning "this device/driver will never answer this query": remembered, not retried.
_PERMANENT = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})

#: At most this many XID events are drained per device per tick (a storm must not stall a tick).
_MAX_EVENTS_PER_TICK = 64

#: Per-tick queries: key -> (pynvml function, extra arguments after the handle).
TICK_QUERIES: dict[str, tuple[str, tuple[int, ...]]] = {
    "utilization": ("nvmlDeviceGetUtilizationRates", ()),
    "memory": ("nvmlDeviceGetMemoryInfo", ()),
    "power_usage_mw": ("nvmlDeviceGetPowerUsage", ()),
    "enforced_power_limit_mw": ("nvmlDeviceGetEnforcedPowerLimit", ()),
    "energy_mj": ("nvmlDeviceGetTotalEnergyConsumption", ()),
    "clock_sm_mhz": ("nvmlDeviceGetClockInfo", (NVML_CLOCK_SM,)),
    "clock_mem_mhz": ("nvmlDeviceGetClockInfo", (NVML_CLOCK_MEM,)),
    "temperature_c": ("nvmlDeviceGetTemperature", (NVML_TEMPERATURE_GPU,)),
    "clock_event_reasons": ("nvmlDeviceGetCurrentClocksEventReasons", ()),
    "violation_power_ns": ("nvmlDeviceGetViolationStatus", (NVML_PERF_POLICY_POWER,)),
    "violation_thermal_ns": ("nvmlDeviceGetViolationStatus", (NVML_PERF_POLICY_THERMAL,)),
    "pcie_tx_kbs": ("nvmlDeviceGetPcieThroughput", (NVML_PCIE_UTIL_TX_BYTES,)),
    "pcie_rx_kbs": ("nvmlDeviceGetPcieThroughput", (NVML_PCIE_UTIL_RX_BYTES,)),
    "pcie_link_gen": ("nvmlDeviceGetCurrPcieLinkGeneration", ()),
    "pcie_link_width": ("nvmlDeviceGetCurrPcieLinkWidth", ()),
    "ecc_corrected": (
        "nvmlDeviceGetTotalEccErrors",
        (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
    ),
    "ecc_uncorrected": (
        "nvmlDeviceGetTotalEccErrors",
        (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
    ),
}
#: Tick queries that cost milliseconds on a real GPU: asked every ``polled_every`` ticks.
POLLED_QUERIES = ("energy_mj", "violation_power_ns", "violation_thermal_ns")
#: Drivers older than 535 only have the "throttle" name of the clock-event reasons query.
LEGACY_REASONS_FN = "nvmlDeviceGetCurrentClocksThrottleReasons"

#: Static queries, refreshed by facts(): key -> (pynvml function, extra arguments).
STATIC_QUERIES: dict[str, tuple[str, tuple[int, ...]]] = {
    "uuid": ("nvmlDeviceGetUUID", ()),
    "name": ("nvmlDeviceGetName", ()),
    "pci_bus_id": ("nvmlDeviceGetPciInfo", ()),
    "memory_numa_node": ("nvmlDeviceGetNumaNodeId", ()),
    "power_limit_default_mw": ("nvmlDeviceGetPowerManagementDefaultLimit", ()),
    "power_limit_constraints_mw": ("nvmlDeviceGetPowerManagementLimitConstraints", ()),
    "max_clock_sm_mhz": ("nvmlDeviceGetMaxClockInfo", (NVML_CLOCK_SM,)),
    "max_clock_mem_mhz": ("nvmlDeviceGetMaxClockInfo", (NVML_CLOCK_MEM,)),
    "max_pcie_link_gen": ("nvmlDeviceGetMaxPcieLinkGeneration", ()),
    "max_pcie_link_width": ("nvmlDeviceGetMaxPcieLinkWidth", ()),
    "persistence_mode": ("nvmlDeviceGetPersistenceMode", ()),
}


def _turns(count: int, every: int, offset: int = 0) -> list[int]:
    """The tick (mod ``every``) at which each of ``count`` GPUs takes a slow query: spread."""
    return [(i * every // count + offset) % every for i in range(count)]


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _plain(key: str, v: Any) -> Any:
    """An NVML result as a JSON-able value (the form recordings store)."""
    if key == "utilization":
        return [int(v.gpu), int(v.memory)]
    if key == "memory":
        return [int(v.used), int(v.total)]
    if key.startswith("violation_"):
        return int(v.violationTime)
    if key == "pci_bus_id":
        return _text(v.busId)
    if key in ("uuid", "name"):
        return _text(v)
    if key == "power_limit_constraints_mw":
        return [int(v[0]), int(v[1])]
    return int(v)


def _error_name(e: Exception) -> str:
    return type(e).__name__.removeprefix("NVMLError_")


def _handle_key(h: Any) -> int:
    """A hashable identity of a device handle (ctypes pointers compare by object, not value)."""
    if isinstance(h, int):
        return h
    return int(ctypes.cast(h, ctypes.c_void_p).value or 0)


def sysfs_pci_address(bus_id: str) -> str:
    """NVML's ``00000000:01:00.0`` -> sysfs ``0000:01:00.0`` (4-digit domain, lower case)."""
    domain, _, rest = bus_id.strip().partition(":")
    if not rest:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return f"{domain[-4:]}:{rest}".lower()


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a declared dependency
        raise SourceUnavailable(f"no NVIDIA GPU/driver: pynvml not importable ({e})") from e
    return pynvml


def _load_pynvml() -> Any:
    """The real NVML backend. The library is loaded first, as nvmlInit's first step would
    (same name, same message): on a host without an NVIDIA driver the pynvml module (1.7 MiB
    of the agent's resident memory) is then not imported at all."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        log.debug("cannot load libnvidia-ml.so.1: %s", e)
        raise SourceUnavailable("no NVIDIA GPU/driver: nvmlInit failed: NVML Shared Library Not Found") from e
    return _import_pynvml()


class GpuCollector:
    """Per-GPU NVML telemetry (measurement ``gpu``) and GPU facts (``host_facts``).

    ``nvml`` is the NVML backend: ``None`` for the real ``pynvml`` module, or any object with
    the same functions (:class:`ReplayNvml` in tests). ``pcie_throughput=False`` skips the
    PCIe throughput queries. NVML measures PCIe throughput over a 20 ms window per call and
    blocks meanwhile: 8 GPUs queried at every 100 ms tick would take 160 ms. So each GPU is
    asked every ``pcie_every`` ticks (1 s at 100 ms), the GPUs' turns spread over those
    ticks (one GPU per tick on an 8-GPU host); its ``pcie_tx``/``pcie_rx`` are null in the
    ticks between (no value is repeated). ``pcie_every=1`` asks every GPU every tick.

    The energy and violation-time counters cost milliseconds a call on a real GPU (H200,
    driver 580: ~3.4 ms for the energy, ~1 ms for each violation time, against ~0.1 ms for
    the other queries), so they are read every ``polled_every`` ticks, the GPUs' turns spread
    the same way and half a period away from their PCIe turns; null between reads. They are
    counters the schema marks *polled*: the next read's delta covers the time since the last.
    """

    name = "gpu"
    measurements: tuple[str, ...] = ("gpu",)
    tier: Tier = "fast"

    def __init__(
        self,
        root: str | Path = "/",
        nvml: Any = None,
        *,
        pcie_throughput: bool = True,
        pcie_every: int = 10,
        polled_every: int = 10,
        xid_events: bool = True,
    ) -> None:
        for name, every in (("pcie_every", pcie_every), ("polled_every", polled_every)):
            if every < 1:
                raise ValueError(f"gpu collector: {name} must be >= 1, got {every}")
        self.root = Path(root)
        self._nvml = _load_pynvml() if nvml is None else nvml
        nv = self._nvml
        self._NVMLError: type[Exception] = nv.NVMLError
        try:
            nv.nvmlInit()
        except self._NVMLError as e:
            raise SourceUnavailable(f"no NVIDIA GPU/driver: nvmlInit failed: {e}") from e
        self._open = True
        try:
            count = int(nv.nvmlDeviceGetCount())
            if count == 0:
                raise SourceUnavailable("no NVIDIA GPU/driver: NVML reports 0 devices")
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self._NVMLError as e:
            self.close()
            raise SourceUnavailable(f"no NVIDIA GPU/driver: cannot enumerate devices: {e}") from e
        except SourceUnavailable:
            self.close()
            raise
        self._index_by_handle = {_handle_key(h): i for i, h in enumerate(self._handles)}
        self._unsupported: set[tuple[int, str]] = set()
        self._logged: set[tuple[int, str]] = set()
        self._reasons_fn = [TICK_QUERIES["clock_event_reasons"][0]] * count
        self._tick_queries = [
            (k, fn, args)
            for k, (fn, args) in TICK_QUERIES.items()
            if (not k.startswith("pcie_") or k.startswith("pcie_link")) and k not in POLLED_QUERIES
        ]
        self._polled_queries = [(k, *TICK_QUERIES[k]) for k in POLLED_QUERIES]
        self._polled_every = polled_every
        self._polled_turn = _turns(count, polled_every, offset=polled_every // 2)
        self._pcie_queries = [
            (k, fn, args)
            for k, (fn, args) in TICK_QUERIES.items()
            if pcie_throughput and k.startswith("pcie_") and not k.startswith("pcie_link")
        ]
        self._pcie_every = pcie_every
        self._pcie_turn = _turns(count, pcie_every)
        self._tick = 0
        self._static: list[dict[str, Any]] = [{} for _ in range(count)]
        self._nvlinks: list[list[tuple[int, int]]] = [[] for _ in range(count)]
        # XID events: one event set for all devices; a device that cannot register keeps nulls.
        self._event_set: Any = None
        self._xid_ok = [False] * count
        self._xid_count = [0] * count
        self._last_xid = [0] * count
        try:
            self._refresh_static()
            if xid_events:
                self._setup_events()
        except BaseException:
            self.close()  # never leave an NVML session (or event set) behind a failed start
            raise

    # ------------------------------------------------------------------ queries
    def _fail(self, i: int, key: str, e: Exception) -> None:
        if getattr(e, "value", None) in _PERMANENT:
            self._unsupported.add((i, key))
            log.info("gpu %d: %s not supported (%s); not queried again", i, key, e)
        elif (i, key) not in self._logged:
            self._logged.add((i, key))
            log.warning("gpu %d: NVML query %s failed: %s (null this tick)", i, key, e)

    def _query(self, i: int, key: str, fn: str, args: tuple[int, ...]) -> Any:
        """One NVML query as a plain value; None when unsupported or failed."""
        if (i, key) in self._unsupported:
            return None
        try:
            return _plain(key, getattr(self._nvml, fn)(self._handles[i], *args))
        except self._NVMLError as e:
            self._fail(i, key, e)
            return None

    def _reasons(self, i: int) -> int | None:
        key = "clock_event_reasons"
        if (i, key) in self._unsupported:
            return None
        try:
            return int(getattr(self._nvml, self._reasons_fn[i])(self._handles[i]))
        except (self._NVMLError, AttributeError) as e:
            if self._reasons_fn[i] != LEGACY_REASONS_FN and (
                isinstance(e, AttributeError)
                or getattr(e, "value", None) == NVML_ERROR_FUNCTION_NOT_FOUND
            ):
                self._reasons_fn[i] = LEGACY_REASONS_FN  # driver < 535: old name, same bitmask
                return self._reasons(i)
            if isinstance(e, AttributeError):
                e = self._nvml.NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
            self._fail(i, key, e)
            return None

    def _refresh_static(self) -> None:
        for i in range(len(self._handles)):
            st = self._static[i]
            for key, (fn, args) in STATIC_QUERIES.items():
                st[key] = self._query(i, key, fn, args)
            self._nvlinks[i] = self._active_nvlinks(i)

    def _active_nvlinks(self, i: int) -> list[tuple[int, int]]:
        """(field id, link) pairs of the NVLink throughput counters of the active links."""
        if (i, "nvlink") in self._unsupported:
            return []
        fields: list[tuple[int, int]] = []
        for link in range(NVML_NVLINK_MAX_LINKS):
            try:
                active = self._nvml.nvmlDeviceGetNvLinkState(self._handles[i], link)
            except self._NVMLError as e:
                if link == 0:
                    self._fail(i, "nvlink", e)
                break  # past the last link of this GPU
            if active:
                fields += [
                    (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link),
                    (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link),
                ]
        if not fields:
            self._unsupported.add((i, "nvlink"))
        return fields

    def _nvlink(self, i: int) -> tuple[int | None, int | None]:
        """(tx, rx) KiB summed over the active links, one field-values call per device."""
        fields = self._nvlinks[i]
        if not fields or (i, "nvlink") in self._unsupported:
            return None, None
        try:
            values = self._nvml.nvmlDeviceGetFieldValues(self._handles[i], fields)
        except self._NVMLError as e:
            self._fail(i, "nvlink", e)
            return None, None
        sums = {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 0, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 0}
        for (fid, _link), v in zip(fields, values, strict=True):
            if v.nvmlReturn != NVML_SUCCESS:
                # one link failing makes the sum wrong: null the tick rather than under-count
                self._fail(i, "nvlink", self._nvml.NVMLError(v.nvmlReturn))
                return None, None
            sums[fid] += int(v.value.ullVal)
        return sums[NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX], sums[
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
        ]

    # ------------------------------------------------------------------- events
    def _setup_events(self) -> None:
        nv = self._nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except self._NVMLError as e:
            log.warning("NVML event set unavailable (%s): xid fields stay null", e)
            return
        for i, h in enumerate(self._handles):
            try:
                nv.nvmlDeviceRegisterEvents(h, nvmlEventTypeXidCriticalError, self._event_set)
                self._xid_ok[i] = True
            except self._NVMLError as e:
                log.info("gpu %d: XID events not available (%s)", i, e)

    def _drain_events(self) -> None:
        if self._event_set is None or not any(self._xid_ok):
            return
        limit = _MAX_EVENTS_PER_TICK * len(self._handles)
        for _ in range(limit):
            try:
                data = self._nvml.nvmlEventSetWait(self._event_set, 0)
            except self._NVMLError as e:
                if getattr(e, "value", None) != NVML_ERROR_TIMEOUT:
                    self._fail(-1, "xid_events", e)
                return  # timeout = no more events queued
            if not data.eventType & nvmlEventTypeXidCriticalError:
                continue
            i = self._index_by_handle.get(_handle_key(data.device))
            if i is not None:
                self._xid_count[i] += 1
                self._last_xid[i] = int(data.eventData)

    # ------------------------------------------------------------------ collect
    def collect(self) -> list[Reading]:
        self._drain_events()
        n = len(self._handles)
        cols: dict[str, list[Any]] = {f.name: [None] * n for f in GPU.fields}
        phase = self._tick % self._pcie_every
        polled_phase = self._tick % self._polled_every
        self._tick += 1
        for i in range(n):
            r = {
                k: self._query(i, k, fn, args)
                for k, fn, args in self._tick_queries
                if k != "clock_event_reasons"
            }
            if self._pcie_turn[i] == phase:
                for k, fn, args in self._pcie_queries:
                    r[k] = self._query(i, k, fn, args)
            if self._polled_turn[i] == polled_phase:
                for k, fn, args in self._polled_queries:
                    r[k] = self._query(i, k, fn, args)
            st = self._static[i]
            util, mem = r["utilization"], r["memory"]
            if util is not None:
                cols["util_gpu"][i], cols["util_mem"][i] = float(util[0]), float(util[1])
            if mem is not None:
                cols["mem_used"][i], cols["mem_total"][i] = mem[0], mem[1]
            cols["power_w"][i] = _watts(r["power_usage_mw"])
            cols["power_limit_w"][i] = _watts(r["enforced_power_limit_mw"])
            cols["power_limit_default_w"][i] = _watts(st["power_limit_default_mw"])
            cols["energy"][i] = r.get("energy_mj")
            cols["sm_clock_mhz"][i] = _float(r["clock_sm_mhz"])
            cols["sm_clock_max_mhz"][i] = _float(st["max_clock_sm_mhz"])
            cols["mem_clock_mhz"][i] = _float(r["clock_mem_mhz"])
            cols["mem_clock_max_mhz"][i] = _float(st["max_clock_mem_mhz"])
            cols["temperature_c"][i] = _float(r["temperature_c"])
            cols["clock_event_reasons"][i] = self._reasons(i)
            cols["power_violation"][i] = r.get("violation_power_ns")
            cols["thermal_violation"][i] = r.get("violation_thermal_ns")
            cols["pcie_tx"][i] = _float(r.get("pcie_tx_kbs"))
            cols["pcie_rx"][i] = _float(r.get("pcie_rx_kbs"))
            cols["pcie_link_gen"][i] = _float(r["pcie_link_gen"])
            cols["pcie_link_gen_max"][i] = _float(st["max_pcie_link_gen"])
            cols["pcie_link_width"][i] = _float(r["pcie_link_width"])
            cols["pcie_link_width_max"][i] = _float(st["max_pcie_link_width"])
            cols["nvlink_tx"][i], cols["nvlink_rx"][i] = self._nvlink(i)
            cols["ecc_corrected"][i] = r["ecc_corrected"]
            cols["ecc_uncorrected"][i] = r["ecc_uncorrected"]
            if self._xid_ok[i]:
                cols["xid_events"][i] = self._xid_count[i]
                cols["last_xid"][i] = self._last_xid[i]
        tags = {
            "gpu": [str(i) for i in range(n)],
            "uuid": [st["uuid"] or "" for st in self._static],
        }
        return [Reading("gpu", tags, cols)]

    # -------------------------------------------------------------------- facts
    def facts(self) -> Reading | None:
        """Static GPU facts (``host_facts`` rows); also refreshes the cached static values."""
        self._refresh_static()
        rows: list[tuple[str, str, Any]] = []
        for i, st in enumerate(self._static):
            dev = str(i)
            lim = st["power_limit_constraints_mw"] or [None, None]
            numa = self._sysfs_numa(st["pci_bus_id"])
            enforced = self._query(
                i, "enforced_power_limit_mw", *TICK_QUERIES["enforced_power_limit_mw"]
            )
            for key, val in (
                ("uuid", st["uuid"]),
                ("name", st["name"]),
                ("pci_bus_id", st["pci_bus_id"]),
                ("numa_node", numa),
                ("memory_numa_node", st["memory_numa_node"]),
                ("power_limit_default_w", _watts(st["power_limit_default_mw"])),
                ("power_limit_w", _watts(enforced)),
                ("power_limit_min_w", _watts(lim[0])),
                ("power_limit_max_w", _watts(lim[1])),
                ("pcie_link_gen_max", st["max_pcie_link_gen"]),
                ("pcie_link_width_max", st["max_pcie_link_width"]),
                ("persistence_mode", st["persistence_mode"]),
                ("nvlinks_active", len(self._nvlinks[i]) // 2),
            ):
                if val is not None:
                    rows.append((dev, key, val))
        for key, fn, fmt in (
            ("driver_version", "nvmlSystemGetDriverVersion", _text),
            ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion", _cuda_version),
        ):
            try:
                rows.append(("", key, fmt(getattr(self._nvml, fn)())))
            except self._NVMLError as e:
                self._fail(-1, key, e)
        if not rows:
            return None
        return Reading(
            "host_facts",
            {
                "category": ["gpu"] * len(rows),
                "device": [r[0] for r in rows],
                "key": [r[1] for r in rows],
            },
            {
                "value": [_fact_text(r[2]) for r in rows],
                "value_num": [_fact_num(r[2]) for r in rows],
            },
        )

    def _sysfs_numa(self, bus_id: str | None) -> int | None:
        """NUMA node of the GPU's PCI function (what placement decisions need)."""
        if not bus_id:
            return None
        try:
            path = proc_path(
                self.root, "sys/bus/pci/devices", sysfs_pci_address(bus_id), "numa_node"
            )
            return int(path.read_text().strip())
        except (OSError, ValueError) as e:
            log.info("gpu %s: numa node unknown: %s", bus_id, e)
            return None

    # -------------------------------------------------------------------- close
    def close(self) -> None:
        if not getattr(self, "_open", False):
            return
        self._open = False
        nv = self._nvml
        if getattr(self, "_event_set", None) is not None:
            try:
                nv.nvmlEventSetFree(self._event_set)
            except self._NVMLError as e:
                log.debug("nvmlEventSetFree: %s", e)
            self._event_set = None
        try:
            nv.nvmlShutdown()
        except self._NVMLError as e:
            log.debug("nvmlShutdown: %s", e)


def _watts(mw: int | None) -> float | None:
    return None if mw is None else mw / 1000.0


def _float(v: int | None) -> float | None:
    return None if v is None else float(v)


def _cuda_version(v: Any) -> str:
    v = int(v)  # NVML encodes 12.2 as 12020
    return f"{v // 1000}.{(v % 1000) // 10}"


def _fact_text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _fact_num(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    try:
        return float(v)
    except ValueError:
        return None


# ====================================================================== replay
class ReplayNvml:
    """Plays an NVML recording (``tests/data/nvml/*.json``) back with pynvml's interface.

    The recording holds, per device, ``static`` values and a list of ``ticks`` of per-tick
    values, keyed as in :data:`STATIC_QUERIES` / :data:`TICK_QUERIES`; a value of the form
    ``{"error": "NotSupported"}`` raises that NVML error. ``events`` lists ``[tick, xid]``
    pairs delivered through the event-set API. :meth:`advance` moves to the next tick.
    ``calls`` counts every NVML function called, so tests can check what was (not) queried.

    Errors are pynvml's own exception classes, so the collector's error handling is the real one.
    """

    def __init__(self, recording: dict[str, Any] | str | Path) -> None:
        if not isinstance(recording, dict):
            path = Path(recording)
            try:
                recording = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ValueError(f"cannot read NVML recording {path}: {e}") from e
        assert isinstance(recording, dict)
        try:
            self.devices: list[dict[str, Any]] = recording["devices"]
            for d in self.devices:
                d["static"], d["ticks"]  # noqa: B018 - validate presence
        except (KeyError, TypeError) as e:
            raise ValueError(f"NVML recording lacks {e} (need devices[].static/.ticks)") from e
        self.recording = recording
        self.tick = 0
        self.calls: Counter[str] = Counter()
        self._initialised = False
        self._queue: list[tuple[int, int]] = []
        pynvml = _import_pynvml()  # its exception classes only: no library needed
        self.NVMLError: type[Exception] = pynvml.NVMLError
        self._by_fn: dict[tuple[str, tuple[int, ...]], tuple[str, str]] = {}
        for table, kind in ((TICK_QUERIES, "ticks"), (STATIC_QUERIES, "static")):
            for key, (fn, args) in table.items():
                self._by_fn[(fn, args)] = (kind, key)
        self._by_fn[(LEGACY_REASONS_FN, ())] = ("ticks", "clock_event_reasons")
        self._enqueue_events()

    @property
    def n_ticks(self) -> int:
        return min(len(d["ticks"]) for d in self.devices)

    def advance(self) -> bool:
        """Move to the next tick; False (and stay) at the end of the recording."""
        if self.tick + 1 >= self.n_ticks:
            return False
        self.tick += 1
        self._enqueue_events()
        return True

    def _enqueue_events(self) -> None:
        for i, d in enumerate(self.devices):
            for t, xid in d.get("events", []):
                if t == self.tick:
                    self._queue.append((i, int(xid)))

    def _raise(self, name: str) -> None:
        pynvml = _import_pynvml()
        cls = getattr(pynvml, f"NVMLError_{name}", None)
        if cls is None:
            raise ValueError(f"NVML recording names an unknown NVML error {name!r}")
        raise cls()

    def _value(self, v: Any) -> Any:
        if isinstance(v, dict) and "error" in v:
            self._raise(v["error"])
        return v

    def _check(self, fn: str) -> None:
        self.calls[fn] += 1
        if not self._initialised:
            self._raise("Uninitialized")

    # --- pynvml interface
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        self._value(self.recording.get("init", None))
        self._initialised = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self._initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= i < len(self.devices):
            self._raise("InvalidArgument")
        return 0x1000 + i  # an opaque handle, like NVML's pointers

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return str(self._value(self.recording["driver_version"]))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion")
        return int(self._value(self.recording["cuda_driver_version"]))

    def _device(self, h: int) -> dict[str, Any]:
        i = h - 0x1000
        if not 0 <= i < len(self.devices):
            self._raise("InvalidArgument")
        return self.devices[i]

    def __getattr__(self, fn: str) -> Callable[..., Any]:
        if not fn.startswith("nvmlDevice"):
            raise AttributeError(fn)

        def call(h: int, *args: int) -> Any:
            self._check(fn)
            kind_key = self._by_fn.get((fn, tuple(args)))
            if kind_key is None:
                raise AttributeError(f"ReplayNvml does not replay {fn}{tuple(args)}")
            kind, key = kind_key
            d = self._device(h)
            if fn == "nvmlDeviceGetCurrentClocksEventReasons" and d.get("legacy_throttle_api"):
                self._raise("FunctionNotFound")
            src = d["static"] if kind == "static" else d["ticks"][self.tick]
            if key not in src:
                raise KeyError(f"NVML recording: device {h - 0x1000} {kind} lacks {key!r}")
            return _from_plain(key, self._value(src[key]))

        return call

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState")
        states = self._value(
            self._device(h)["static"].get("nvlink_state", {"error": "NotSupported"})
        )
        if link >= len(states):
            self._raise("InvalidArgument")
        return int(states[link])

    def nvmlDeviceGetFieldValues(self, h: int, fields: list[tuple[int, int]]) -> list[Any]:
        self._check("nvmlDeviceGetFieldValues")
        nv = self._value(self._device(h)["ticks"][self.tick]["nvlink_kib"])
        out = []
        for fid, link in fields:
            per_link = nv["tx"] if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else nv["rx"]
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    scopeId=link,
                    nvmlReturn=NVML_SUCCESS,
                    valueType=NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                    value=SimpleNamespace(ullVal=int(per_link[link])),
                )
            )
        return out

    def nvmlEventSetCreate(self) -> str:
        self._check("nvmlEventSetCreate")
        self._value(self.recording.get("event_set", None))
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, types: int, event_set: Any) -> None:
        self._check("nvmlDeviceRegisterEvents")
        self._value(self._device(h)["static"].get("xid_events", None))

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        self._check("nvmlEventSetWait")
        if not self._queue:
            self._raise("Timeout")
        i, xid = self._queue.pop(0)
        return SimpleNamespace(
            device=0x1000 + i, eventType=nvmlEventTypeXidCriticalError, eventData=xid
        )

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._check("nvmlEventSetFree")


def _from_plain(key: str, v: Any) -> Any:
    """The inverse of :func:`_plain`: a recorded value shaped like pynvml's result."""
    if key == "utilization":
        return SimpleNamespace(gpu=v[0], memory=v[1])
    if key == "memory":
        return SimpleNamespace(used=v[0], total=v[1], free=v[1] - v[0])
    if key.startswith("violation_"):
        return SimpleNamespace(referenceTime=0, violationTime=v)
    if key == "pci_bus_id":
        return SimpleNamespace(busId=v)
    return v


# ==================================================================== recorder
def record_nvml(
    path: str | Path, ticks: int = 10, interval_s: float = 0.1, *, nvml: Any = None
) -> Path:
    """Record ``ticks`` samples of every query the collector makes from the real NVML into a
    JSON file :class:`ReplayNvml` plays back. Run on a GPU host; the file is written atomically.
    """
    nv = _load_pynvml() if nvml is None else nvml
    nv.nvmlInit()
    try:
        devices: list[dict[str, Any]] = []
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(int(nv.nvmlDeviceGetCount()))]

        def one(h: Any, key: str, fn: str, args: tuple[int, ...]) -> Any:
            try:
                return _plain(key, getattr(nv, fn)(h, *args))
            except nv.NVMLError as e:
                return {"error": _error_name(e)}
            except AttributeError:
                return {"error": "FunctionNotFound"}

        for h in handles:
            static = {k: one(h, k, fn, a) for k, (fn, a) in STATIC_QUERIES.items()}
            states: list[int] = []
            for link in range(NVML_NVLINK_MAX_LINKS):
                try:
                    states.append(int(nv.nvmlDeviceGetNvLinkState(h, link)))
                except nv.NVMLError as e:
                    if link == 0:
                        static["nvlink_state"] = {"error": _error_name(e)}
                    break
            static.setdefault("nvlink_state", states)
            dev: dict[str, Any] = {"static": static, "ticks": [], "events": []}
            reasons = one(h, "clock_event_reasons", *TICK_QUERIES["clock_event_reasons"])
            if reasons == {"error": "FunctionNotFound"}:
                dev["legacy_throttle_api"] = True
            devices.append(dev)
        try:
            event_set = nv.nvmlEventSetCreate()
            for h in handles:
                nv.nvmlDeviceRegisterEvents(h, nvmlEventTypeXidCriticalError, event_set)
        except nv.NVMLError:
            event_set = None
        index = {_handle_key(h): i for i, h in enumerate(handles)}
        for t in range(ticks):
            for h, dev in zip(handles, devices, strict=True):
                tick: dict[str, Any] = {}
                for key, (fn, args) in TICK_QUERIES.items():
                    if key == "clock_event_reasons" and dev.get("legacy_throttle_api"):
                        fn = LEGACY_REASONS_FN
                    tick[key] = one(h, key, fn, args)
                states = dev["static"]["nvlink_state"]
                if isinstance(states, list) and any(states):
                    fields = [
                        (fid, link)
                        for link in range(len(states))
                        for fid in (
                            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
                        )
                    ]
                    vals = nv.nvmlDeviceGetFieldValues(h, fields)
                    tick["nvlink_kib"] = {
                        "tx": [
                            int(v.value.ullVal) if v.nvmlReturn == NVML_SUCCESS else 0
                            for v in vals[0::2]
                        ],
                        "rx": [
                            int(v.value.ullVal) if v.nvmlReturn == NVML_SUCCESS else 0
                            for v in vals[1::2]
                        ],
                    }
                dev["ticks"].append(tick)
            while event_set is not None:
                try:
                    data = nv.nvmlEventSetWait(event_set, 0)
                except nv.NVMLError:
                    break
                i = index.get(_handle_key(data.device))
                if i is not None:
                    devices[i]["events"].append([t, int(data.eventData)])
            if t + 1 < ticks:
                time.sleep(interval_s)
        rec = {
            "source": f"recorded by ingest.collectors.gpu.record_nvml at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
            "interval_s": interval_s,
            "driver_version": _text(nv.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": int(nv.nvmlSystemGetCudaDriverVersion()),
            "devices": devices,
        }
    finally:
        nv.nvmlShutdown()
    out = Path(path)
    return write_atomic(out, json.dumps(rec, indent=1), mode=0o600)
