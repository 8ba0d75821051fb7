"""The report: one self-contained HTML file and a short terminal summary.

The HTML works offline (no CDN, no script, inline CSS, plots as inline SVG rendered by
matplotlib) and has these sections, each saying "none" when its table is missing:

* summary: hosts, windows, flagged windows, findings, incidents, remediations;
* anomaly-score traces per host: the combined detector score over time (the worse of
  the references), its threshold, flagged windows, incidents shaded (matched ones marked
  with their knowledge-base entry) and, on labelled lakes, the ground truth;
* subsystem fingerprints: mean subsystem shares of the incidents of each matched
  knowledge-base entry vs the unmatched incidents (false positives or unknown causes);
* the incident table with explanations and top factors;
* ground truth (labels table, simulated or user-labelled lakes): which injected
  inefficiencies were detected and matched to the right entry;
* the static audit of the host facts (misconfigurations that need no anomaly), with the
  interval each held (facts change only at snapshots: from the first snapshot showing it
  until the next snapshot after the last one showing it);
* remediations: state, script, parameters and measured effect.

``write_report(lake, out, start=None, end=None, hosts=None) -> ReportSummary``.
"""

from __future__ import annotations

import bisect
import html
import io
import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from ingest import lake as lake_mod
from ingest.atomic import write_atomic
from ingest.durations import readable

log = logging.getLogger(__name__)

MAX_TRACE_HOSTS = 12  # more hosts: the 12 with the highest peak score get a trace
MAX_TRACE_POINTS = 1500  # per host; more windows are bucketed (max score per bucket)
MAX_TABLE_ROWS = 200  # incidents / audit / remediation rows shown (worst or latest first)
SUBSYSTEM_COLORS: dict[str, str] = {
    "cpu": "#4C72B0", "gpu": "#55A868", "memory": "#C44E52", "interconnect": "#8172B2",
    "network": "#CCB974", "storage": "#64B5CD", "other": "#8C8C8C",
}
_SVG_HEAD = re.compile(r"^.*?(?=<svg)", re.S)


#: why labels are not judged in a lake that has no incidents table
NO_INCIDENTS = "no incidents in the lake (`unveil schedule` decides them; `unveil sweep` writes findings only)"


@dataclass
class LabelCheck:
    """One ground-truth label and whether the report's incidents caught it."""

    host: str
    type: str
    start: datetime
    end: datetime | None
    detected: bool  # some incident overlaps it
    matched: bool  # a matched incident of the same label type overlaps it


@dataclass
class ReportSummary:
    path: Path
    start: datetime | None
    end: datetime | None
    hosts: list[str] = field(default_factory=list)
    windows: int = 0
    flagged: int = 0
    findings: int = 0
    incidents: int = 0  # lasting problems: the parts a long one is cut into count once
    incident_parts: int = 0  # rows of the incidents table (each part of a lasting one)
    matched: int = 0
    by_entry: dict[str, int] = field(default_factory=dict)
    remediations: dict[str, int] = field(default_factory=dict)
    audit_findings: int = 0
    labels: list[LabelCheck] = field(default_factory=list)
    plots: int = 0
    missing_tables: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    # the range the data read covers (bounds of the report's tables), shown for a bound not given
    data_start: datetime | None = None
    data_end: datetime | None = None

    @property
    def incidents_judged(self) -> bool:
        """Labels are caught or missed by incidents; without the table there is no verdict."""
        return "incidents" not in self.missing_tables

    @property
    def unmatched(self) -> int:
        return self.incidents - self.matched

    def span(self) -> str:
        """The report's time range: the bounds given, the data's for those not given."""
        lo = self.start or self.data_start
        hi = self.end or self.data_end
        if self.start is not None and lo is not None and hi is not None and hi < lo:
            hi = None  # every row read is older than --since (facts in force at it)
        if lo is None and hi is None:
            return "no data"
        if hi is None:
            return f"since {_fmt_time(lo)} (no data)"
        if lo is None:
            return f"until {_fmt_time(hi)} (no data)"
        given = (self.start is not None, self.end is not None)
        note = {(False, False): " (the data's range)", (True, False): " (end: the data's)",
                (False, True): " (start: the data's)"}.get(given, "")
        return f"{_fmt_time(lo)} .. {_fmt_time(hi)}{note}"

    def text(self) -> str:
        """The short terminal summary."""
        span = self.span()
        lines = [f"Unveil report: {len(self.hosts)} host(s), {span}"]
        share = f" ({100.0 * self.flagged / self.windows:.1f} %)" if self.windows else ""
        lines.append(f"  windows {self.windows}, flagged {self.flagged}{share}, findings {self.findings}")
        entries = ", ".join(f"{e} {n}" for e, n in sorted(self.by_entry.items(), key=lambda x: (-x[1], x[0])))
        parts = (f" ({self.incident_parts} parts: a lasting one is re-reported every max_incident)"
                 if self.incident_parts > self.incidents else "")
        lines.append(f"  incidents {self.incidents}{parts}: {self.matched} matched" + (f" ({entries})" if entries else "")
                     + f", {self.unmatched} unmatched")
        rem = ", ".join(f"{n} {s}" for s, n in sorted(self.remediations.items()))
        lines.append(f"  remediations: {rem or 'none'}")
        lines.append(f"  static audit: {self.audit_findings} finding(s)")
        if self.labels and not self.incidents_judged:
            lines.append(f"  ground truth: {len(self.labels)} labelled inefficiencies, not judged: {NO_INCIDENTS}")
        elif self.labels:
            hit = sum(lb.matched for lb in self.labels)
            lines.append(f"  ground truth: {hit}/{len(self.labels)} injected inefficiencies detected and matched")
            for lb in self.labels:
                mark = "matched" if lb.matched else "detected, not matched" if lb.detected else "missed"
                lines.append(f"    {lb.host} {lb.type} {_fmt_time(lb.start)}: {mark}")
        if self.missing_tables:
            lines.append(f"  not in the lake yet: {', '.join(self.missing_tables)}")
        lines.append(f"  report: {self.path}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------ data


def _fmt_time(ts: Any) -> str:
    if ts is None:
        return "-"
    if isinstance(ts, datetime):
        return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(ts)


def _read(lake: str | os.PathLike[str], table: str, available: Sequence[str], start: datetime | None,
          end: datetime | None, hosts: Sequence[str] | None, *, until_only: bool = False) -> pl.DataFrame | None:
    if table not in available:
        return None
    corrupt: list[lake_mod.CorruptFileError] = []
    df = lake_mod.read(lake, table, start=None if until_only else start, end=end, hosts=hosts,
                       on_corrupt="skip", report=corrupt)
    for err in corrupt:
        log.warning("report: skipped %s", err)
    return df


def _remediations(lake: str | os.PathLike[str], available: Sequence[str],
                  hosts: Sequence[str] | None) -> pl.DataFrame | None:
    """The live queue when the lake has one (it is more current than the lake snapshot),
    else the remediations table."""
    from remediation.queue import Queue, default_path

    try:
        qpath: Path | None = default_path(lake)
    except lake_mod.LakeError:  # a lake on object storage, no state directory here: its table
        qpath = None
    if qpath is not None and qpath.is_file():
        with Queue(qpath) as q:
            df = q.to_frame()
    elif "remediations" in available:
        df = lake_mod.read(lake, "remediations", hosts=hosts, on_corrupt="skip")
        if df.height and "updated" in df.columns:  # the table follows the queue: each action's latest row
            df = df.sort("updated").unique("action_id", keep="last", maintain_order=True)
    else:
        return None
    if hosts is not None:
        df = df.filter(pl.col("host").is_in(list(hosts)))
    return df


def _fact_change_times(host_facts: pl.DataFrame) -> list[datetime]:
    """Times at which some host's facts differ from its previous snapshot (and its first):
    the only times the audit's answer can change."""
    snap = (host_facts.sort("category", "device", "key")
            .group_by("host", "time", maintain_order=True)
            .agg(pl.concat_str(pl.col("category"), pl.col("device"), pl.col("key"), pl.col("value").fill_null(""),
                               separator="\x1f").str.join("\x1e").hash().alias("h"))
            .sort("host", "time"))
    prev = pl.col("h").shift(1).over("host")
    changed = snap.filter(prev.is_null() | (pl.col("h") != prev))
    return changed["time"].unique().sort().to_list()


def _audit(host_facts: pl.DataFrame | None) -> pl.DataFrame | None:
    """Audit findings over the fact snapshots of the range, with when each held."""
    if host_facts is None:
        return None
    from knowledge_base.audit import audit
    from knowledge_base.loader import load_kb

    kb = load_kb()
    ts = pl.Datetime("us", "UTC")
    empty = audit(host_facts.head(0), kb).with_columns(pl.lit(None, ts).alias("first_seen"),
                                                       pl.lit(None, ts).alias("until"))
    if host_facts.is_empty():
        return empty
    times = _fact_change_times(host_facts)
    parts = []
    for t in times:
        a = audit(host_facts.filter(pl.col("time") <= t), kb, at=t)
        if a.height:
            parts.append(a.with_columns(pl.lit(t, ts).alias("seen")))
    if not parts:
        return empty
    keys = ["host", "entry_id", "check", "device", "severity", "message"]
    out = (pl.concat(parts).group_by(keys)
           .agg(pl.col("evidence").last(), pl.col("seen").min().alias("first_seen"),
                pl.col("seen").max().alias("last_seen"))
           .sort("host", "entry_id", "device", "first_seen"))
    # Facts only change at change points: a finding last seen at one holds until the next
    # (null: it still holds at the end of the range).
    def until(t: datetime) -> datetime | None:
        i = bisect.bisect_right(times, t)
        return times[i] if i < len(times) else None

    return out.with_columns(pl.Series("until", [until(t) for t in out["last_seen"].to_list()], dtype=ts)).drop(
        "last_seen")


def _data_range(frames: Sequence[tuple[pl.DataFrame | None, str, str]]) -> tuple[datetime | None, datetime | None]:
    """(earliest, latest) time of the (frame, start column, end column) given."""
    lo: list[datetime] = []
    hi: list[datetime] = []
    for df, c0, c1 in frames:
        if df is None or df.is_empty() or c0 not in df.columns:
            continue
        a = df[c0].min()
        b = df[c1 if c1 in df.columns else c0].max()
        if isinstance(a, datetime):
            lo.append(a)
        if isinstance(b, datetime):
            hi.append(b)
    return (min(lo) if lo else None), (max(hi) if hi else None)


def _window_scores(scores: pl.DataFrame | None) -> pl.DataFrame | None:
    """Per host and window: the combined score (worse reference) and whether flagged."""
    if scores is None:
        return None
    comb = scores.filter(pl.col("detector") == "combined") if "detector" in scores.columns else scores
    return (comb.group_by("host", "window_start")
            .agg(pl.col("score").max(), pl.col("flagged").any())
            .sort("host", "window_start"))


def _label_checks(labels: pl.DataFrame | None, incidents: pl.DataFrame | None) -> list[LabelCheck]:
    if labels is None or labels.is_empty():
        return []
    out: list[LabelCheck] = []
    inc = incidents if incidents is not None else pl.DataFrame()
    for row in labels.sort("host", "time").iter_rows(named=True):
        end = row.get("end")
        detected = matched = False
        if not inc.is_empty():
            over = inc.filter((pl.col("host") == row["host"]) & (pl.col("end") > row["time"]))
            if end is not None:
                over = over.filter(pl.col("start") < end)
            detected = over.height > 0
            matched = over.filter((pl.col("status") == "matched") & (pl.col("label_type") == row["type"])).height > 0
        out.append(LabelCheck(row["host"], row["type"], row["time"], end, detected, matched))
    return out


# ----------------------------------------------------------------------------- plots


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    return _SVG_HEAD.sub("", buf.getvalue(), count=1).strip()


def _mpl() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    # Deterministic ids and real text in the SVG (smaller, searchable, selectable).
    plt.rcParams.update({"svg.hashsalt": "unveil", "svg.fonttype": "none", "font.size": 9,
                         "axes.titlesize": 10, "figure.dpi": 100})
    return plt


def _entry_color(entry: str, palette: dict[str, str]) -> str:
    cycle = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#1f78b4",
             "#b15928", "#6a3d9a", "#33a02c", "#fb9a99"]
    if entry not in palette:
        palette[entry] = cycle[len(palette) % len(cycle)]
    return palette[entry]


def _downsample(h: pl.DataFrame, max_points: int) -> pl.DataFrame:
    """At most ``max_points`` per host: the max score (and any flag) per time bucket, so
    peaks survive and a day of 1 s windows stays a light SVG."""
    if h.height <= max_points:
        return h
    t = pl.col("window_start").dt.epoch("us")
    span = int(h.select(t.max() - t.min()).item())
    width = span // max_points + 1
    return (h.with_columns(((t - t.min()) // width).alias("_b"))
            .group_by("host", "_b").agg(pl.col("window_start").first(), pl.col("score").max(),
                                        pl.col("flagged").any())
            .drop("_b").sort("window_start"))


def plot_traces(ws: pl.DataFrame, incidents: pl.DataFrame | None, labels: pl.DataFrame | None,
                hosts: Sequence[str], palette: dict[str, str]) -> str:
    """Anomaly-score traces, one panel per host (shared time axis)."""
    plt = _mpl()
    from matplotlib.patches import Patch

    n = len(hosts)
    fig, axes = plt.subplots(n, 1, figsize=(11, 1.9 * n + 0.6), sharex=True, squeeze=False)
    handles: dict[str, Any] = {}
    marks: list[tuple[Any, int, datetime, str]] = []  # (panel, n, incident start, entry)
    for ax, host in zip(axes[:, 0], hosts, strict=True):
        h = _downsample(ws.filter(pl.col("host") == host), MAX_TRACE_POINTS)
        # +inf scores (a detector whose reference had no spread) are drawn at the top of the
        # panel, above every finite score and marked: matplotlib leaves them out, which broke
        # the trace exactly where the anomaly was worst
        inf = pl.col("score").is_infinite() & (pl.col("score") > 0)
        finite_max = h.filter(pl.col("score").is_finite())["score"].max()
        top = 4.0 * max(1.0, float(finite_max) if isinstance(finite_max, int | float) else 1.0)
        h = h.with_columns(inf.alias("_inf"), pl.when(inf).then(top).otherwise(pl.col("score")).alias("score"))
        x = h["window_start"].to_list()
        y = h["score"].to_list()
        if labels is not None:
            for lb in labels.filter(pl.col("host") == host).iter_rows(named=True):
                ax.axvspan(lb["time"], lb["end"] or (x[-1] if x else lb["time"]), color="#f2d16b", alpha=0.35, lw=0,
                           zorder=0)
                handles.setdefault("ground truth (injected)", Patch(color="#f2d16b", alpha=0.35))
        if incidents is not None:
            for inc in incidents.filter(pl.col("host") == host).iter_rows(named=True):
                if inc["status"] == "matched":
                    c = _entry_color(inc["entry_id"], palette)
                    ax.axvspan(inc["start"], inc["end"], color=c, alpha=0.35, lw=0, zorder=1)
                    handles.setdefault(f"incident: {inc['entry_id']}", Patch(color=c, alpha=0.35))
                else:
                    ax.axvspan(inc["start"], inc["end"], facecolor="none", edgecolor="#999999", hatch="///",
                               lw=0, zorder=1)
                    handles.setdefault("incident: unmatched", Patch(facecolor="none", edgecolor="#999999",
                                                                    hatch="///"))
        ax.plot(x, y, color="#333333", lw=0.8, zorder=3, gid=f"score-trace-{hosts.index(host)}")
        fl = h.filter(pl.col("flagged"))
        if fl.height:
            ax.scatter(fl["window_start"].to_list(), fl["score"].to_list(), s=6, color="#d62728", zorder=4)
            handles.setdefault("flagged window", ax.collections[-1])
        hi = h.filter(pl.col("_inf"))
        if hi.height:
            ax.scatter(hi["window_start"].to_list(), hi["score"].to_list(), s=14, marker="^", color="#7f0000",
                       zorder=4, gid=f"score-infinite-{hosts.index(host)}")
            handles.setdefault("score = ∞ (drawn at the top)", ax.collections[-1])
        ax.axhline(1.0, color="#d62728", lw=0.8, ls="--", zorder=2)
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylabel(host, rotation=0, ha="right", va="center")
        ax.grid(True, axis="y", alpha=0.3)
        if incidents is not None:
            # Mark each matched incident's entry once per contiguous run on this host
            # (placed once the layout is final, see _place_labels).
            last = None
            for inc in incidents.filter((pl.col("host") == host) & (pl.col("status") == "matched")).sort(
                    "start").iter_rows(named=True):
                if inc["entry_id"] != last:
                    marks.append((ax, len(marks), inc["start"], inc["entry_id"]))
                last = inc["entry_id"]
    handles.setdefault("threshold (combined = 1)", axes[0, 0].lines[-1])
    axes[0, 0].set_title("combined anomaly score per window (symlog; > 1 = flagged)")
    axes[-1, 0].set_xlabel("time (UTC)")
    fig.autofmt_xdate()
    # Under the last panel, clear of its rotated date labels (in that panel's height units).
    axes[-1, 0].legend(list(handles.values()), list(handles), loc="upper center", ncol=min(4, len(handles)),
                       bbox_to_anchor=(0.5, -0.6), frameon=False, fontsize=8)
    _place_labels(fig, marks, palette)
    return _svg(fig)


LABEL_ROWS = 2  # rows of incident labels along the top of a panel


def _place_labels(fig: Any, marks: Sequence[tuple[Any, int, datetime, str]], palette: dict[str, str]) -> None:
    """Label incidents with their entry along the top of their panel, left to right, in the
    first of :data:`LABEL_ROWS` rows where the label overlaps no other; labels with no room
    are left out (the colour and the legend still tell the entry), so dense incidents thin
    out instead of piling into an unreadable strip."""
    from matplotlib.dates import date2num

    renderer = fig.canvas.get_renderer()
    # per panel and row, the right edge (display units) of the last label placed: labels go
    # left to right and the rows (9 pt apart, 7 pt text) do not overlap vertically, so a label
    # can only collide with the last one of its row
    right: dict[int, list[float]] = {}
    for ax, n, x, entry in sorted(marks, key=lambda m: (fig.axes.index(m[0]), m[2])):
        edges = right.setdefault(id(ax), [float("-inf")] * LABEL_ROWS)
        anchor = ax.transData.transform((date2num(x), 0.0))[0]
        panel = fig.axes.index(ax)
        for row in range(LABEL_ROWS):
            if anchor <= edges[row]:  # starts inside the last label of this row: no need to measure
                continue
            ann = ax.annotate(entry, xy=(x, 1.0), xycoords=("data", "axes fraction"),
                              xytext=(2, -2 - 9 * row), textcoords="offset points", fontsize=7, va="top",
                              color=_entry_color(entry, palette), zorder=5, gid=f"incident-label-{panel}-{n}",
                              # readable over the trace and the flagged dots
                              bbox={"boxstyle": "square,pad=0.1", "fc": "white", "alpha": 0.75, "lw": 0})
            bb = ann.get_window_extent(renderer)
            # Margin: a viewer without the font matplotlib measured with renders it a little wider.
            pad = 0.1 * bb.width + 4
            if bb.x0 - pad >= edges[row]:
                edges[row] = bb.x1 + pad
                break
            ann.remove()


def plot_fingerprints(incidents: pl.DataFrame) -> str:
    """Mean subsystem shares of the incidents of each matched entry vs unmatched ones."""
    plt = _mpl()
    shares = [c for c in incidents.columns if c.startswith("share_")]
    grp = (incidents.with_columns(pl.when(pl.col("status") == "matched").then(pl.col("entry_id"))
                                  .otherwise(pl.lit("unmatched (false positive / unknown)")).alias("group"))
           .group_by("group").agg(pl.len().alias("n"), *[pl.col(c).fill_null(0.0).mean() for c in shares])
           .sort("group"))
    fig, ax = plt.subplots(figsize=(11, 0.5 * grp.height + 1.2))
    labels = [f"{g} ({n})" for g, n in zip(grp["group"], grp["n"], strict=True)]
    left = [0.0] * grp.height
    for c in shares:
        name = c.removeprefix("share_")
        vals = [float(v or 0.0) for v in grp[c].to_list()]
        ax.barh(labels, vals, left=left, color=SUBSYSTEM_COLORS.get(name, "#8C8C8C"), label=name)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlim(0, max([1.0, *left]))
    ax.invert_yaxis()
    ax.set_xlabel("mean share of the anomaly attributed to each subsystem")
    ax.set_title("subsystem fingerprints: incidents per knowledge-base entry vs unmatched (count)")
    ax.legend(ncol=len(shares), loc="lower center", bbox_to_anchor=(0.5, 1.08), frameon=False, fontsize=8)
    return _svg(fig)


# ------------------------------------------------------------------------------ html

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1200px;
color:#222;padding:0 16px}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
.meta{color:#666;font-size:.9em}.none{color:#777;font-style:italic}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:1.4em}.card span{color:#666;font-size:.85em}
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%;font-size:.85em;margin:8px 0}
td{overflow-wrap:anywhere}
th,td{border:1px solid #e3e3e3;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f5f5f5}tr:nth-child(even) td{background:#fafafa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.num,td.nowrap{white-space:nowrap;overflow-wrap:normal}
.ok{color:#1a7f37;font-weight:600}.bad{color:#b42318;font-weight:600}.warn{color:#9a6700;font-weight:600}
figure{margin:8px 0}figure svg{width:100%;height:auto}
code{font-size:.9em}
"""


def _e(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, datetime):
        return html.escape(_fmt_time(v))
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list):
        return html.escape(", ".join(str(x) for x in v))
    return html.escape(str(v))


def _table(rows: Sequence[dict[str, Any]], cols: Sequence[tuple[str, str]], cls: str = "",
           nowrap: Sequence[str] = ()) -> str:
    """An HTML table of ``rows``; ``cols``: (key, header); numbers and the ``nowrap`` columns
    stay on one line (the other cells may wrap anywhere, so long text cannot widen the
    table, but that lets the layout squeeze a short column to one character a line)."""
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t in cols)
    body = []
    for r in rows:
        cells = []
        for k, _ in cols:
            v = r.get(k)
            num = isinstance(v, int | float) and not isinstance(v, bool)
            raw = isinstance(v, _Raw)
            attr = ' class="num"' if num else ' class="nowrap"' if k in nowrap else ""
            cells.append(f"<td{attr}>{v.html if raw else _e(v)}</td>")  # type: ignore[union-attr]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


@dataclass(frozen=True)
class _Raw:
    html: str


def _cap_note(n: int, what: str, order: str) -> str:
    if n <= MAX_TABLE_ROWS:
        return ""
    return (f'<p class="meta">{MAX_TABLE_ROWS} of {n} {html.escape(what)} shown ({html.escape(order)} first); '
            "all of them: <code>unveil query</code>.</p>")


def _none(what: str) -> str:
    return f'<p class="none">{html.escape(what)}</p>'


def _factors(top: Any) -> str:
    if not top:
        return ""
    parts = []
    for t in top[:3]:
        arrow = "↑" if t.get("direction") == "up" else "↓" if t.get("direction") == "down" else ""
        parts.append(f"{t.get('feature')} {arrow}")
    return "; ".join(parts)


def _effect(before: Any, after: Any) -> str:
    if not before and not after:
        return ""
    try:
        b = json.loads(before) if isinstance(before, str) else before or {}
        a = json.loads(after) if isinstance(after, str) else after or {}
    except ValueError:
        return f"{before} -> {after}"
    keys = sorted(set(b) | set(a)) if isinstance(b, dict) and isinstance(a, dict) else []
    return "; ".join(f"{k}: {b.get(k)} → {a.get(k)}" for k in keys) or f"{before} -> {after}"


def _history(r: Mapping[str, Any]) -> str:
    """The cause's history: later fragments attached, the fix this fault came back after."""
    parts = []
    try:
        attached = json.loads(r["attached_incidents"]) if r.get("attached_incidents") else []
    except ValueError:
        attached = []
    if attached:
        parts.append(f"{len(attached)} more incident(s) of this cause attached")
    if r.get("recurrence_of") is not None:
        after = r.get("came_back_after_s")
        when = f" after {after / 60:.0f} min" if after is not None else ""
        parts.append(f"came back{when} (fix {r['recurrence_of']} had succeeded)")
    return "; ".join(parts)


# ----------------------------------------------------------------------------- gather


@dataclass(frozen=True)
class Traces:
    """The score-trace section: combined score per host and window, the hosts drawn."""

    scores: pl.DataFrame | None  # host, window_start, score, flagged
    hosts: list[str]  # drawn (at most MAX_TRACE_HOSTS, highest peak scores)
    n_hosts: int  # hosts with scores
    incidents: pl.DataFrame | None  # shaded on the traces
    labels: pl.DataFrame | None  # the ground truth, drawn on labelled lakes


@dataclass(frozen=True)
class Incidents:
    """The fingerprint and incident-table sections: each incident's latest row (None: no table)."""

    table: pl.DataFrame | None


@dataclass(frozen=True)
class Audit:
    """The static audit section: findings with when each held (None: no host_facts)."""

    findings: pl.DataFrame | None


@dataclass(frozen=True)
class Remediations:
    """The remediation section: every action's latest state (None: none queued)."""

    actions: pl.DataFrame | None


@dataclass(frozen=True)
class ReportFacts:
    """Everything the report shows, gathered from the lake; rendering reads nothing else."""

    lake: str
    hosts: Sequence[str] | None  # as asked (None: all)
    summary: ReportSummary
    traces: Traces
    incidents: Incidents
    audit: Audit
    remediations: Remediations


def gather(lake: str | os.PathLike[str], out: str | os.PathLike[str], start: datetime | None = None,
           end: datetime | None = None, hosts: Sequence[str] | None = None) -> ReportFacts:
    """The facts of the report of ``[start, end)`` for ``hosts`` (default: all)."""
    available = lake_mod.tables(lake)
    scores = _read(lake, "scores", available, start, end, hosts)
    findings = _read(lake, "findings", available, start, end, hosts)
    incidents = _read(lake, "incidents", available, start, end, hosts)
    lasting = None  # the incidents, the parts of a lasting one joined (the summary, the tables, the plots)
    if incidents is not None:  # append-only open/closed rows: each incident's latest
        from knowledge_base.incidents import episodes, latest_incidents

        incidents = latest_incidents(incidents).sort("host", "start")
        lasting = episodes(incidents)
    labels = _read(lake, "labels", available, start, end, hosts, until_only=True)
    if labels is not None and start is not None:
        labels = labels.filter(pl.col("end").is_null() | (pl.col("end") > start))
    host_facts = _read(lake, "host_facts", available, start, end, hosts, until_only=True)
    remediations = _remediations(lake, available, hosts)
    audit_df = _audit(host_facts)
    ws = _window_scores(scores)

    summary = ReportSummary(Path(out), start, end)
    summary.data_start, summary.data_end = _data_range([
        (scores, "window_start", "window_end"), (findings, "window_start", "window_end"),
        (incidents, "start", "end"), (labels, "time", "end"), (host_facts, "time", "time")])
    summary.missing_tables = [t for t in ("scores", "findings", "incidents", "host_facts") if t not in available]
    host_set: set[str] = set()
    for df in (ws, incidents, labels, host_facts):
        if df is not None and "host" in df.columns:
            host_set.update(df["host"].unique().to_list())
    summary.hosts = sorted(host_set)
    if ws is not None:
        summary.windows = ws.height
        summary.flagged = int(ws["flagged"].sum())
    summary.findings = findings.height if findings is not None else 0
    if lasting is not None:
        summary.incidents = lasting.height
        summary.incident_parts = int(lasting["parts"].sum())
        matched = lasting.filter(pl.col("status") == "matched")
        summary.matched = matched.height
        summary.by_entry = dict(Counter(matched["entry_id"].to_list()))
    if remediations is not None:
        summary.remediations = dict(Counter(remediations["state"].to_list()))
    if audit_df is not None:
        summary.audit_findings = audit_df.height
    summary.labels = _label_checks(labels, incidents)

    trace_hosts: list[str] = []
    n_hosts = 0
    if ws is not None and ws.height:
        peaks = ws.group_by("host").agg(pl.col("score").max()).sort(["score", "host"], descending=[True, False])
        trace_hosts, n_hosts = sorted(peaks["host"].head(MAX_TRACE_HOSTS).to_list()), peaks.height
    summary.plots = int(bool(trace_hosts)) + int(lasting is not None and lasting.height > 0)
    return ReportFacts(str(lake), hosts, summary, Traces(ws, trace_hosts, n_hosts, lasting, labels),
                       Incidents(lasting), Audit(audit_df), Remediations(remediations))


# ----------------------------------------------------------------------------- render


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{title}</h2>{body}</section>'


def _render_traces(t: Traces, palette: dict[str, str]) -> str:
    title = "Anomaly scores per host"
    if not t.hosts or t.scores is None:
        return _section("traces", title, _none("none: no scores in this range (run `unveil sweep` first)"))
    note = (f'<p class="meta">{len(t.hosts)} of {t.n_hosts} hosts (highest peak scores).</p>'
            if t.n_hosts > len(t.hosts) else "")
    svg = plot_traces(t.scores, t.incidents, t.labels, t.hosts, palette)
    return _section("traces", title, f"{note}<figure>{svg}</figure>")


def _render_fingerprints(inc: Incidents) -> str:
    title = "Subsystem fingerprints"
    if inc.table is None or not inc.table.height:
        return _section("fingerprints", title, _none("none: no incidents in this range"))
    return _section("fingerprints", title, f"<figure>{plot_fingerprints(inc.table)}</figure>")


def _render_incidents(inc: Incidents) -> str:
    if inc.table is None or not inc.table.height:
        why = "none: no incidents table yet (run a sweep and the matcher)" if inc.table is None else \
            "none: no incidents in this range"
        return _section("incidents", "Incidents", _none(why))
    rows = []
    shown = inc.table.sort("peak_score", descending=True, nulls_last=True).head(MAX_TABLE_ROWS)
    for r in shown.iter_rows(named=True):
        st = r["status"]
        rows.append({**r, "status": _Raw(f'<span class="{"ok" if st == "matched" else "warn"}">{_e(st)}</span>'),
                     "what": r["title"] or "—", "factors": _factors(r.get("top_factors")),
                     # one cause, one incident: the other entries that matched its windows,
                     # each with the evidence it was ranked lower on (one a line)
                     "alternatives": _Raw("<br>".join(_e(a) for a in r.get("alternatives") or [])),
                     "duration": readable((r["end"] - r["start"]).total_seconds()
                                           if r["end"] and r["start"] else None)})
    cap = _cap_note(inc.table.height, "incidents", "highest peak score")
    return _section("incidents", "Incidents", cap + _table(rows, [
        ("host", "host"), ("start", "start"), ("duration", "duration"), ("parts", "parts"), ("n_windows", "windows"),
        ("status", "status"),
        ("what", "knowledge-base entry"), ("confidence", "confidence"), ("alternatives", "alternatives"),
        ("peak_score", "peak"),
        ("devices", "devices"), ("factors", "top factors"), ("explanation", "explanation")], "incidents",
        nowrap=("host", "duration", "status")))


def _render_ground_truth(labels: Sequence[LabelCheck], judged: bool = True) -> str:
    if not labels:
        return ""
    if not judged:
        return _section("ground-truth", "Ground truth (labelled inefficiencies)",
                        f'<p class="meta">{len(labels)} labelled, not judged: {html.escape(NO_INCIDENTS)}.</p>')
    rows = [{"host": lb.host, "type": lb.type, "start": lb.start, "end": lb.end,
             "result": _Raw('<span class="ok">detected and matched</span>' if lb.matched else
                            '<span class="warn">detected, not matched</span>' if lb.detected else
                            '<span class="bad">missed</span>')} for lb in labels]
    return _section("ground-truth", "Ground truth (labelled inefficiencies)", _table(
        rows, [("host", "host"), ("type", "type"), ("start", "start"), ("end", "end"), ("result", "result")],
        "labels"))


def _render_audit(a: Audit) -> str:
    title = "Static audit of host facts"
    if a.findings is None or not a.findings.height:
        why = "none: no host_facts in the lake" if a.findings is None else "none: every static check passed"
        return _section("audit", title, _none(why))
    return _section("audit", title, _cap_note(a.findings.height, "findings", "by host") + _table(
        [{**r, "until": r["until"] or "end of range (still holds)"}
         for r in a.findings.head(MAX_TABLE_ROWS).iter_rows(named=True)],
        [("host", "host"), ("entry_id", "entry"), ("device", "device"), ("severity", "severity"),
         ("message", "message"), ("first_seen", "from"), ("until", "until")], "audit"))


def _render_remediations(rem: Remediations) -> str:
    if rem.actions is None or not rem.actions.height:
        return _section("remediations", "Remediations", _none("none queued"))
    rows = [{**r, "effect": _effect(r.get("effect_before"), r.get("effect_after")), "history": _history(r)}
            for r in rem.actions.sort("created", descending=True).head(MAX_TABLE_ROWS).iter_rows(named=True)]
    return _section("remediations", "Remediations", _cap_note(rem.actions.height, "actions", "latest") + _table(rows, [
        ("action_id", "id"), ("host", "host"), ("entry_id", "entry"), ("incident_id", "incident"),
        ("script_id", "script"), ("params", "parameters"), ("mode", "mode"), ("state", "state"),
        ("executed", "executed"), ("verdict", "verdict"), ("effect", "measured effect"),
        ("history", "history")], "remediations"))


def _render_summary(s: ReportSummary) -> str:
    cards = [("hosts", len(s.hosts)), ("windows", s.windows), ("flagged", s.flagged),
             ("findings", s.findings), ("incidents", s.incidents), ("matched", s.matched),
             ("unmatched", s.unmatched), ("remediations", sum(s.remediations.values())),
             ("audit findings", s.audit_findings)]
    card_html = "".join(f'<div class="card"><b>{v}</b><span>{html.escape(k)}</span></div>' for k, v in cards)
    return f'<section id="summary"><div class="cards">{card_html}</div></section>'


def render(facts: ReportFacts) -> str:
    """The HTML document of the gathered facts."""
    s = facts.summary
    palette: dict[str, str] = {}
    sections = [_render_traces(facts.traces, palette), _render_fingerprints(facts.incidents),
                _render_incidents(facts.incidents), _render_ground_truth(s.labels, s.incidents_judged), _render_audit(facts.audit),
                _render_remediations(facts.remediations)]
    missing = (f'<p class="meta">Not in the lake yet: {html.escape(", ".join(s.missing_tables))}.</p>'
               if s.missing_tables else "")
    lake, hosts = facts.lake, facts.hosts
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Unveil report — {html.escape(lake)}</title><style>{_CSS}</style></head><body>"
        "<h1>Unveil report</h1>"
        f'<p class="meta">lake <code>{html.escape(lake)}</code> · range {html.escape(s.span())} · hosts {html.escape(", ".join(hosts) if hosts else "all")} · generated '
        f"{_e(datetime.now(UTC))}</p>{missing}"
        + _render_summary(s) + "".join(sections) + "</body></html>\n"
    )


def write_report(lake: str | os.PathLike[str], out: str | os.PathLike[str], start: datetime | None = None,
                 end: datetime | None = None, hosts: Sequence[str] | None = None) -> ReportSummary:
    """Write the HTML report of ``[start, end)`` (default: everything) for ``hosts``
    (default: all) to ``out`` (atomically) and return its summary."""
    t0 = time.perf_counter()
    facts = gather(lake, out, start, end, hosts)
    doc = render(facts)
    summary = facts.summary
    summary.path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(summary.path, doc, mode=0o666)  # a user's file: the umask decides, as for any new file
    summary.elapsed_s = time.perf_counter() - t0
    log.info("report %s: %d hosts, %d incidents, %.1f s", summary.path, len(summary.hosts), summary.incidents,
             summary.elapsed_s)
    return summary
