"""Host facts as the knowledge base reads them: one host's view, derived facts,
preconditions that explain themselves, and remediation parameters filled from facts.

``host_facts`` rows (lake table, see ingest/schema.py): host, [time], category, device, key,
value, value_num. When a ``time`` column exists the view keeps, per (category, device, key),
the latest row at or before the moment asked for (facts change: a power limit is lowered,
THP switched off), or the earliest row when none is that old.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import polars as pl

# the fact vocabulary lives with the entry schema that names facts (no import circle)
from knowledge_base.loader import DERIVED, TEMPLATE_RE, Entry, Precondition


class FactError(ValueError):
    """A remediation parameter could not be filled from the facts."""


@dataclass(frozen=True)
class HostFacts:
    """The facts of one host: (category, device, key) -> (value, value_num); ``before``:
    for facts that changed up to the moment asked for, the value in force before their
    latest change (e.g. THP ``madvise`` before it was switched to ``never``)."""

    host: str
    facts: Mapping[tuple[str, str, str], tuple[str | None, float | None]]
    before: Mapping[tuple[str, str, str], tuple[str | None, float | None]] = field(default_factory=dict)
    # with an incident's onset: per fact, the values in force strictly before it, newest first
    # (consecutive repeats merged); {fact_before:...} then reads these instead of ``before``
    onset: datetime | None = None
    history: Mapping[tuple[str, str, str], tuple[tuple[str | None, float | None], ...]] = field(default_factory=dict)

    @classmethod
    def from_frame(cls, host_facts: pl.DataFrame | None, host: str, at: datetime | None = None, *,
                   with_before: bool = True, onset: datetime | None = None) -> HostFacts:
        if host_facts is None or host_facts.is_empty() or "host" not in host_facts.columns:
            return cls(host, {}, onset=onset)
        df = host_facts.filter(pl.col("host") == host)
        before = _before(df, at) if with_before else {}
        history = _history(df, onset) if onset is not None else {}
        if "time" in df.columns and df.height:
            df = df.sort("time")
            if at is not None:
                older = df.filter(pl.col("time") <= at)
                # facts first read after ``at`` still describe the host better than nothing
                newer = df.filter(pl.col("time") > at).unique(["category", "device", "key"], keep="first",
                                                                maintain_order=True)
                df = pl.concat([newer, older]) if older.height else newer
        # later rows win: one row per fact (the frame repeats every fact each snapshot)
        cols = [pl.col(c).cast(pl.String).fill_null("") if c in df.columns else pl.lit("").alias(c)
                for c in ("category", "device", "key")]
        val = pl.col("value").cast(pl.String) if "value" in df.columns else pl.lit(None, pl.String).alias("value")
        num = (pl.col("value_num").cast(pl.Float64) if "value_num" in df.columns
               else pl.lit(None, pl.Float64).alias("value_num"))
        last = df.select(*cols, val, num).unique(["category", "device", "key"], keep="last", maintain_order=True)
        facts = {(c, d, k): (v, n) for c, d, k, v, n in last.rows()}
        return cls(host, facts, before, onset, history)

    def get(self, category: str, key: str, device: str = "") -> tuple[str | None, float | None] | None:
        return self.facts.get((category, device, key))

    def value(self, category: str, key: str, device: str = "") -> Any:
        """Numeric value when there is one, else the text, else None."""
        got = self.get(category, key, device)
        if got is None:
            return None
        text, num = got
        return num if num is not None else text

    def devices(self, category: str) -> list[str]:
        return sorted({d for (c, d, _k) in self.facts if c == category and d})

    def device_values(self, category: str, key: str) -> dict[str, Any]:
        return {d: self.value(c, k, d) for (c, d, k) in self.facts if c == category and k == key and d}

    def derived(self, name: str) -> Any:
        if not self.facts:
            return None
        if name == "numa.nodes":
            v = self.value("numa", "nodes")
            if v is not None:
                return v
            return len([d for d in self.devices("numa") if self.get("numa", "cpulist", d) is not None]) or None
        if name in ("gpu.count", "nic.count", "nvme.count"):
            return len(self.devices(name.split(".")[0]))
        if name == "irq.count":
            return len(self.devices("irq"))
        if name == "power.slow_governor":
            return self._slow_governor()
        raise KeyError(name)

    def _slow_governor(self) -> bool | None:
        """Whether a cpufreq policy's governor holds its clocks low: ``conservative``, or
        ``powersave`` under a generic cpufreq driver (acpi-cpufreq, intel_cpufreq, cppc, ...),
        where it pins the lowest frequency. Under intel_pstate and amd-pstate-epp in active
        mode ``powersave`` is the driver's own dynamic algorithm and the default (Linux
        admin-guide/pm/intel_pstate.rst, amd-pstate.rst): no fault. None: no cpufreq facts."""
        governors = [v for v in self.device_values("power", "scaling_governor").values() if v is not None]
        if not governors:
            return None
        driver = self.value("power", "scaling_driver")
        dynamic_powersave = driver in ("intel_pstate", "amd-pstate-epp")
        return any(g == "conservative" or (g == "powersave" and not dynamic_powersave) for g in governors)

    def lookup(self, fact: str) -> list[Any]:
        """Values of a precondition fact: a derived fact, else ``category.key`` host-wide,
        else that key on every device of the category. Empty = unknown."""
        if fact in DERIVED:
            v = self.derived(fact)
            return [] if v is None else [v]
        category, _, key = fact.partition(".")
        v = self.value(category, key)
        if v is not None:
            return [v]
        return [x for _d, x in sorted(self.device_values(category, key).items()) if x is not None]

    def fact_device(self, device: str) -> tuple[str, str] | None:
        """(category, fact device) behind a feature device: ``gpu3`` -> (gpu, "3"), a netdev
        -> (nic, netdev), ``nvme0n1`` -> (nvme, ...), ``node1`` -> (numa, "1")."""
        m = re.fullmatch(r"gpu(\d+)", device)
        if m and self.get("gpu", "numa_node", m.group(1)) is not None:
            return "gpu", m.group(1)
        m = re.fullmatch(r"node(\d+)", device)
        if m:
            return "numa", m.group(1)
        for cat in ("gpu", "nic", "nvme"):
            if any(c == cat and d == device for (c, d, _k) in self.facts):
                return cat, device
        return None

    def node_of(self, device: str) -> int | None:
        """NUMA node of a feature device (GPU, NIC, disk, node), None when unknown."""
        fd = self.fact_device(device)
        if fd is None:
            return None
        cat, dev = fd
        if cat == "numa":
            return int(dev)
        v = self.value(cat, "numa_node", dev)
        try:
            node = int(float(v)) if v is not None else None
        except (TypeError, ValueError):
            return None
        return node if node is not None and node >= 0 else None

    def pci_of(self, device: str) -> str | None:
        fd = self.fact_device(device)
        if fd is None:
            return None
        v = self.value(fd[0], "pci_bus_id" if fd[0] == "gpu" else "pci", fd[1])
        return _norm_pci(str(v)) if v is not None else None

    def cpulist_of_node(self, node: int) -> str | None:
        v = self.value("numa", "cpulist", str(node))
        return str(v) if v is not None else None


def changes_only(host_facts: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``host_facts`` where a fact (host, category, device, key) took a new
    value or number, its first reading included, ordered by host and time. The agent
    writes every fact at every snapshot (~540 facts a minute on an 8-GPU host), and almost
    none change: the facts of a host at any time (:meth:`HostFacts.from_frame`, with their
    previous values and history) and the times they changed are the same from these rows
    as from every snapshot, at a fraction of the memory."""
    need = {"host", "time", "category", "key"}
    if host_facts.is_empty() or not need <= set(host_facts.columns):
        return host_facts
    keys = [c for c in ("host", "category", "device", "key") if c in host_facts.columns]
    vals = [c for c in ("value", "value_num") if c in host_facts.columns]
    df = host_facts.sort("host", "time", maintain_order=True, nulls_last=True)
    new = pl.int_range(pl.len()).over(keys) == 0
    for v in vals:
        new = new | pl.col(v).ne_missing(pl.col(v).shift(1).over(keys))
    return df.filter(new)


def _before(df: pl.DataFrame, at: datetime | None) -> dict[tuple[str, str, str], tuple[str | None, float | None]]:
    """Per fact, the value before its latest change at or before ``at`` (None: the end)."""
    if "time" not in df.columns or df.height < 2:
        return {}
    rows = df.sort("time")
    if at is not None:
        rows = rows.filter(pl.col("time") <= at)
    out: dict[tuple[str, str, str], tuple[str | None, float | None]] = {}
    current: dict[tuple[str, str, str], tuple[str | None, float | None]] = {}
    num = "value_num" in rows.columns
    for r in rows.iter_rows(named=True):
        k = (str(r.get("category") or ""), str(r.get("device") or ""), str(r.get("key") or ""))
        v = (r.get("value"), r.get("value_num") if num else None)
        if k in current and current[k][0] != v[0]:
            out[k] = current[k]
        current[k] = v
    return out


def _history(df: pl.DataFrame, onset: datetime) -> dict[tuple[str, str, str], tuple[tuple[str | None, float | None], ...]]:
    """Per fact, the values in force strictly before ``onset``, newest first, repeats merged."""
    if "time" not in df.columns or df.is_empty():
        return {}
    rows = df.filter(pl.col("time") < onset).sort("time")
    num = "value_num" in rows.columns
    runs: dict[tuple[str, str, str], list[tuple[str | None, float | None]]] = {}
    for r in rows.iter_rows(named=True):
        k = (str(r.get("category") or ""), str(r.get("device") or ""), str(r.get("key") or ""))
        v = (r.get("value"), r.get("value_num") if num else None)
        seen = runs.setdefault(k, [])
        if not seen or seen[-1] != v:
            seen.append(v)
    return {k: tuple(reversed(v)) for k, v in runs.items()}


def _norm_pci(addr: str) -> str:
    """NVML writes 00000000:18:00.0, sysfs 0000:18:00.0: keep a 4-digit domain, lower case."""
    a = addr.strip().lower()
    dom, _, rest = a.partition(":")
    return f"{dom[-4:]}:{rest}" if rest and len(dom) > 4 else a


class FactsIndex:
    """Fast "facts of host H at time T" over a host_facts frame: the frame is split by host
    once and one :class:`HostFacts` is built per (host, snapshot) actually asked for.
    :meth:`of` shares one index between the calls on the same frame (a sweep's analysis
    steps match against the same facts again and again)."""

    _last: ClassVar[tuple[pl.DataFrame, int, FactsIndex] | None] = None

    def __init__(self, host_facts: pl.DataFrame | None) -> None:
        self._by_host: dict[str, pl.DataFrame] = {}
        self._times: dict[str, list[Any]] = {}
        self._cache: dict[tuple[str, Any], HostFacts] = {}
        # (id(entry), id(snapshot)) -> (entry, snapshot, verdict): the objects are kept, so ids stay theirs
        self._pre: dict[tuple[int, int], tuple[Entry, HostFacts, tuple[bool, list[str]]]] = {}
        if host_facts is None or host_facts.is_empty() or "host" not in host_facts.columns:
            return
        # each host's rows as a zero-copy slice of the frame, its hosts' rows made contiguous
        # (the lake reads host by host: usually they are): a fleet's facts are one frame, not
        # a copy per host (a sweep worker of 256 hosts held ~0.8 GB more with a group_by split)
        df = host_facts
        runs = df.select(pl.col("host").rle()).unnest("host")
        if runs.height != df["host"].n_unique():
            df = df.sort("host", maintain_order=True)
            runs = df.select(pl.col("host").rle()).unnest("host")
        offset = 0
        for n, h in runs.iter_rows():
            self._by_host[str(h)] = df.slice(offset, n)
            offset += n

    def _snapshots(self, host: str) -> list[Any]:
        """The host's snapshot times, sorted (computed when first asked for)."""
        times = self._times.get(host)
        if times is None:
            df = self._by_host.get(host)
            times = [] if df is None or "time" not in df.columns else \
                df["time"].drop_nulls().unique().sort().to_list()
            self._times[host] = times
        return times

    @classmethod
    def of(cls, host_facts: pl.DataFrame | None) -> FactsIndex:
        """The index of ``host_facts``: the last one built when it is the same frame object
        (of the same height), else a new one (then kept)."""
        last = cls._last
        if host_facts is not None and last is not None and last[0] is host_facts and last[1] == host_facts.height:
            last[2]._trim()
            return last[2]
        index = cls(host_facts)
        cls._last = None if host_facts is None else (host_facts, host_facts.height, index)
        return index

    def at(self, host: str, t: datetime | None = None) -> HostFacts:
        times = self._snapshots(host)
        snap = None
        if times and t is not None:
            i = bisect.bisect_right(times, t) - 1
            snap = times[max(i, 0)]
        key = (host, snap)
        if key not in self._cache:
            self._cache[key] = HostFacts.from_frame(self._by_host.get(host), host, snap, with_before=False)
        return self._cache[key]

    def _trim(self) -> None:
        """Keep each host's latest snapshot only, between two matchings on this index: a
        sweep's steps walk forward in time, and the snapshots of every host of a fleet for
        every step would otherwise stay in memory for the whole sweep."""
        latest: dict[str, tuple[str, Any]] = {}
        for h, snap in self._cache:
            if h not in latest or (snap is not None and (latest[h][1] is None or snap > latest[h][1])):
                latest[h] = (h, snap)
        keep = set(latest.values())
        self._cache = {k: v for k, v in self._cache.items() if k in keep}
        alive = {id(v) for v in self._cache.values()}
        self._pre = {k: v for k, v in self._pre.items() if k[1] in alive}

    def preconditions(self, entry: Entry, facts: HostFacts) -> tuple[bool, list[str]]:
        """:func:`preconditions_hold`, remembered per (entry, snapshot of this index)."""
        key = (id(entry), id(facts))
        got = self._pre.get(key)
        if got is None:
            got = (entry, facts, preconditions_hold(entry, facts))
            self._pre[key] = got
        return got[2]


# ------------------------------------------------------------------- preconditions
def _compare(op: str, have: Any, want: Any) -> bool:
    if op == "exists":
        return True
    if op in ("in", "not_in"):
        inside = any(_eq(have, w) for w in want)
        return inside if op == "in" else not inside
    if op == "==":
        return _eq(have, want)
    if op == "!=":
        return not _eq(have, want)
    try:
        h, w = float(have), float(want)
    except (TypeError, ValueError):
        return False
    return {">": h > w, ">=": h >= w, "<": h < w, "<=": h <= w}[op]


def _eq(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


@dataclass(frozen=True)
class PreconditionResult:
    ok: bool
    message: str


def check_precondition(p: Precondition, facts: HostFacts) -> PreconditionResult:
    """Whether one precondition holds, with a sentence saying why (or why not)."""
    if not facts.facts:
        return PreconditionResult(True, f"{p.fact}: not checked, no host facts for host {facts.host}")
    values = facts.lookup(p.fact)
    want = "" if p.op == "exists" else f" {p.op} {p.value!r}"
    if not values:
        ok = p.if_missing == "pass"
        verdict = "assumed to hold" if ok else "fails"
        return PreconditionResult(ok, f"{p.fact}{want}: unknown on host {facts.host} (no such fact), {verdict} — {p.why}")
    ok = any(_compare(p.op, v, p.value) for v in values)
    shown = values[0] if len(values) == 1 else values
    if ok:
        return PreconditionResult(True, f"{p.fact}{want}: holds ({p.fact} = {shown!r})")
    return PreconditionResult(False, f"{p.fact}{want} does not hold on host {facts.host}: {p.fact} = {shown!r} — {p.why}")


def check_preconditions(entry: Entry, facts: HostFacts) -> list[PreconditionResult]:
    return [check_precondition(p, facts) for p in entry.preconditions]


def preconditions_hold(entry: Entry, facts: HostFacts) -> tuple[bool, list[str]]:
    """(all hold, messages of those that failed)."""
    res = check_preconditions(entry, facts)
    return all(r.ok for r in res), [r.message for r in res if not r.ok]


# ---------------------------------------------------------------- remediation params
def _fact_value(got: tuple[str | None, float | None]) -> Any:
    text, num = got
    return num if num is not None and text is None else text


def _fill(placeholder: str, device: str, facts: HostFacts, extra: Mapping[str, Any],
          faults: tuple[Any, ...] = (), devices: Sequence[str] = ()) -> Any:
    if placeholder in extra:
        return extra[placeholder]
    if placeholder.startswith("fact_before:"):
        name, _, fallback = placeholder[12:].partition("|")
        category, _, key = name.partition(".")
        fd = facts.fact_device(device) if device else None
        if facts.onset is not None:
            # the value in force before the incident's onset; when that is the fault itself (a
            # fragment of a longer fault) the value before the fault; else the entry's fallback
            runs = facts.history.get((category, fd[1], key), ()) if fd is not None else ()
            runs = runs or facts.history.get((category, "", key), ())
            for run in runs:
                value = _fact_value(run)
                if value is not None and not any(_eq(value, f) for f in faults):
                    return value
            if fallback:
                return fallback
            raise FactError(f"{{{placeholder}}}: no value of {category}.{key} other than the fault before "
                            f"{facts.onset.isoformat()} on {facts.host} and there is no fallback")
        # no onset given: the value the fact had before its latest change, else the fallback
        got = facts.before.get((category, fd[1], key)) if fd is not None else None
        got = got or facts.before.get((category, "", key))
        if got is not None:
            return _fact_value(got)
        if fallback:
            return fallback
        raise FactError(f"{{{placeholder}}}: {category}.{key} never changed on {facts.host} and there is no fallback")
    if placeholder == "pid":
        raise FactError("needs {pid}: the workload's process id is not a host fact; give it when approving")
    if placeholder == "cgroup":
        if not device:
            raise FactError("needs {cgroup}: the incident names no cgroup")
        return device
    # a host-wide fact needs no device
    if placeholder.startswith("fact:"):
        category, _, key = placeholder[5:].partition(".")
        fd = facts.fact_device(device) if device else None
        v = facts.value(category, key, fd[1]) if fd is not None else None
        if v is None:
            v = facts.value(category, key)
        if v is None:
            raise FactError(f"{{{placeholder}}}: no fact {category}.{key} for {device or facts.host}")
        return v
    if not device:
        raise FactError(f"needs {{{placeholder}}} but the incident names no device")
    if placeholder == "device":
        return device
    if placeholder == "device_index":
        m = re.search(r"(\d+)$", device)
        if not m:
            raise FactError(f"{{device_index}}: device {device!r} has no index")
        return int(m.group(1))
    if placeholder == "device_indices":
        # every device of the incident of the first one's kind (gpu0, gpu3 -> "0,3")
        kind = re.sub(r"\d+$", "", device)
        found = [re.fullmatch(rf"{re.escape(kind)}(\d+)", d) for d in (devices or [device])]
        indices = sorted({int(m.group(1)) for m in found if m is not None})
        if not indices:
            raise FactError(f"{{device_indices}}: device {device!r} has no index")
        return ",".join(map(str, indices))
    if placeholder in ("device_node", "device_node_cpus"):
        node = facts.node_of(device)
        if node is None:
            raise FactError(f"{{{placeholder}}}: no numa_node fact for {device!r}")
        if placeholder == "device_node":
            return node
        cpus = facts.cpulist_of_node(node)
        if cpus is None:
            raise FactError(f"{{device_node_cpus}}: no cpulist fact for node {node}")
        return cpus
    if placeholder == "device_pci":
        pci = facts.pci_of(device)
        if pci is None:
            raise FactError(f"{{device_pci}}: no PCI address fact for {device!r}")
        return pci
    if placeholder == "device_pcis":
        # the PCI addresses of every device of the incident that has one (the first must)
        if facts.pci_of(device) is None:
            raise FactError(f"{{device_pcis}}: no PCI address fact for {device!r}")
        pcis = [facts.pci_of(d) for d in (devices or [device])]
        return ",".join(dict.fromkeys(p for p in pcis if p is not None))
    if placeholder == "netdev":
        return device
    if placeholder == "netdevs":
        # the first device and every other device of the incident the facts know as a NIC
        nics = [d for d in (devices or [device]) if d == device or (facts.fact_device(d) or ("",))[0] == "nic"]
        return ",".join(dict.fromkeys(nics))
    raise FactError(f"unknown placeholder {{{placeholder}}}")


def fill_params(params: Mapping[str, Any], device: str, facts: HostFacts,
                extra: Mapping[str, Any] | None = None,
                fault_values: Mapping[str, tuple[Any, ...]] | None = None,
                devices: Sequence[str] = ()) -> dict[str, Any]:
    """Remediation parameters with their templates filled from the incident's device (its
    first) and the host's facts. A value that is exactly one placeholder keeps the fact's type
    (int node, float power limit); otherwise placeholders are substituted as text.
    ``fault_values``: per parameter, values a ``{fact_before:...}`` lookup passes over.
    ``devices``: every device of the incident (``{device_indices}``, ``{device_pcis}``, ``{netdevs}``;
    default: ``device``).
    Raises FactError."""
    extra = extra or {}
    faults = fault_values or {}
    out: dict[str, Any] = {}
    for name, value in params.items():
        if not isinstance(value, str) or "{" not in value:
            out[name] = value
            continue
        whole = TEMPLATE_RE.fullmatch(value)
        if whole:
            v = _fill(whole.group(1), device, facts, extra, tuple(faults.get(name, ())), devices)
            out[name] = int(v) if isinstance(v, float) and v.is_integer() and name != "limit_w" else v
        else:
            out[name] = TEMPLATE_RE.sub(lambda m: str(_fill(m.group(1), device, facts, extra, (), devices)), value)
    return out


def fact_params(params: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Parameters that set the knob a fact reads: those templated ``{fact_before:<category>.<key>}``
    (the fix restores that fact's earlier value) -> (category, key)."""
    out: dict[str, tuple[str, str]] = {}
    for name, value in params.items():
        whole = TEMPLATE_RE.fullmatch(value) if isinstance(value, str) else None
        if whole and whole.group(1).startswith("fact_before:"):
            category, _, key = whole.group(1)[12:].partition("|")[0].partition(".")
            out[name] = (category, key)
    return out


def in_force(templates: Mapping[str, Any], params: Mapping[str, Any], device: str, facts: HostFacts) -> bool:
    """Whether the host already has every fact-backed target of ``params`` (``templates``: the
    entry's parameters, telling which facts they set). False when no parameter is fact-backed:
    then nothing says what is in force."""
    linked = fact_params(templates)
    if not linked:
        return False
    fd = facts.fact_device(device) if device else None
    for name, (category, key) in linked.items():
        now = facts.value(category, key, fd[1]) if fd is not None else None
        if now is None:
            now = facts.value(category, key)
        if now is None or name not in params or not _eq(now, params[name]):
            return False
    return True
