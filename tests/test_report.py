"""The HTML report (jobs.report, ``unveil report``), rendered in a real headless Chromium."""

from __future__ import annotations

import html as html_mod
import json
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ingest.lake import write_table
from jobs.cli import main
from jobs.report import write_report
from tests import demo_lake

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
def _require_chromium() -> str:
    # scripts/bootstrap.sh installs Debian's chromium; its absence is a set-up error, not a skip
    assert CHROMIUM, "Debian's chromium is not installed: run scripts/bootstrap.sh (apt-get install chromium)"
    return CHROMIUM



@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> demo_lake.DemoLake:
    return demo_lake.get(tmp_path_factory)


def chromium(page: Path, tmp_path: Path, *extra: str) -> tuple[str, list[str]]:
    """Load ``page`` in headless Chromium; returns (stdout, console error lines)."""
    binary = _require_chromium()
    proc = subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr", "--v=0",
         *extra, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    return proc.stdout, console


def test_console_check_catches_a_script_error(tmp_path: Path) -> None:
    # Control: the check below would see a broken page.
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>undefined_fn();</script></body></html>")
    _, console = chromium(bad, tmp_path, "--dump-dom")
    assert any("undefined_fn is not defined" in ln for ln in console)


def test_report_renders_in_chromium_without_errors_and_shows_its_plots(demo: demo_lake.DemoLake,
                                                                      tmp_path: Path) -> None:
    dom, console = chromium(demo.report, tmp_path, "--dump-dom")
    assert console == []
    svgs = re.findall(r"<svg\b.*?</svg>", dom, flags=re.S)
    summary = demo.result.summary
    assert summary is not None
    # score traces, and the fingerprint bars when there are incidents
    assert len(svgs) == summary.plots == (2 if summary.incidents else 1)
    traces = svgs[0]
    for host in ("sim-00", "sim-01", "sim-02", "sim-03"):
        assert host in traces
    assert traces.count("<path") > 20 and "combined anomaly score" in traces
    if summary.incidents:
        assert "subsystem fingerprints" in svgs[1]
    for section in ("summary", "traces", "fingerprints", "incidents", "ground-truth", "audit", "remediations"):
        assert f'id="{section}"' in dom
    # The plots are really drawn: a screenshot of the page is far from blank.
    from matplotlib import image

    shot = tmp_path / "shot.png"
    chromium(demo.report, tmp_path, f"--screenshot={shot}", "--window-size=1280,1600")
    px = image.imread(shot)
    ink = (px[..., :3].mean(axis=2) < 0.9).mean()
    assert ink > 0.05, f"only {ink:.1%} of the screenshot is not white"


def test_report_is_self_contained(demo: demo_lake.DemoLake) -> None:
    text = demo.report.read_text(encoding="utf-8")
    assert "<script" not in text and "<link" not in text and "<img" not in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "url(http" not in text and "@import" not in text
    assert text.count("<svg") == (demo.result.summary.plots if demo.result.summary else -1) >= 1


def test_report_summary_matches_the_lake(demo: demo_lake.DemoLake) -> None:
    s = demo.result.summary
    assert s is not None
    assert s.hosts == ["sim-00", "sim-01", "sim-02", "sim-03"]
    assert s.plots >= 1
    from ingest.lake import read, tables

    assert s.missing_tables == [t for t in ("findings", "incidents") if t not in tables(demo.lake)]
    from knowledge_base import latest_incidents

    # an open incident has a row per update: the report counts each incident once (its latest)
    inc = latest_incidents(read(demo.lake, "incidents")) if "incidents" in tables(demo.lake) else pl.DataFrame(
        schema={"status": pl.String})
    assert s.incidents == inc.height and s.matched == inc.filter(pl.col("status") == "matched").height
    assert s.findings == (read(demo.lake, "findings").height if "findings" in tables(demo.lake) else 0)
    assert [(lb.host, lb.type) for lb in s.labels] == sorted(demo.result.injected)
    text = s.text()
    assert f"incidents {s.incidents}: {s.matched} matched" in text and str(s.path) in text
    assert "ground truth:" in text


def test_report_range_and_hosts_narrow_it(demo: demo_lake.DemoLake, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    s = write_report(demo.lake, out, T0 + timedelta(minutes=4), T0 + timedelta(minutes=12), ["sim-01"])
    assert s.hosts == ["sim-01"]
    assert 0 < s.windows <= 8 * 60
    assert [lb.type for lb in s.labels] == ["irq_locality_miss"]
    html = out.read_text()
    assert "sim-00" not in html and "sim-01" in html


def test_report_cli_prints_the_summary(demo: demo_lake.DemoLake, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.html"
    assert main(["report", "--lake", str(demo.lake), "--out", str(out), "--hosts", "sim-00"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Unveil report: 1 host(s)") and f"report: {out}" in text
    assert out.is_file()


def test_report_without_downstream_tables_says_none(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    facts = pl.DataFrame({"time": [T0, T0], "host": ["h1", "h1"], "category": ["thp", "gpu"],
                          "device": ["", "0"], "key": ["enabled", "power_limit_w"], "value": ["never", "450"],
                          "value_num": [None, 450.0]})
    write_table(lake, "host_facts", facts, partition_by_hour=False)
    s = write_report(lake, tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert s.incidents == 0 and s.windows == 0 and s.plots == 0 and s.hosts == ["h1"]
    assert s.missing_tables == ["scores", "findings", "incidents"]
    assert "none: no scores in this range" in html and "none: no incidents table yet" in html
    assert "none queued" in html
    assert "Not in the lake yet: scores, findings, incidents" in html


def test_report_on_an_empty_lake(tmp_path: Path) -> None:
    s = write_report(tmp_path, tmp_path / "out" / "r.html")
    assert s.hosts == [] and (tmp_path / "out" / "r.html").is_file()
    assert "none: no host_facts" in (tmp_path / "out" / "r.html").read_text()


def test_report_shows_remediations_from_the_queue_with_their_effect(tmp_path: Path) -> None:
    from remediation.queue import Queue, default_path

    lake = tmp_path / "lake"
    lake.mkdir()
    qpath = default_path(lake)
    qpath.parent.mkdir(parents=True)
    with Queue(qpath) as q:
        a = q.propose(host="h1", entry_id="thp_coverage_loss", incident_id="inc-1", script_id="thp",
                      params={"enabled": "always"})
        b = q.propose(host="h2", entry_id="thp_coverage_loss", incident_id="inc-2", script_id="thp",
                      params={"enabled": "always"})
        q.approve(b.id, by="alice")
        q.reject(a.id, by="bob", reason="deliberate")
    s = write_report(lake, tmp_path / "r.html")
    assert s.remediations == {"rejected": 1, "approved": 1}
    html = (tmp_path / "r.html").read_text()
    section = html[html.index('id="remediations"'):]
    assert "inc-1" in section and "inc-2" in section and "rejected" in section and "approved" in section
    assert "{&quot;enabled&quot;: &quot;always&quot;}" in section  # parameters, escaped
    assert "remediations: 1 approved, 1 rejected" in s.text()


def test_effect_is_rendered_before_to_after() -> None:
    from jobs.report import _effect

    assert _effect('{"mem.hugepage_coverage": 0.2}', '{"mem.hugepage_coverage": 0.85}') == \
        "mem.hugepage_coverage: 0.2 → 0.85"
    assert _effect(None, None) == ""


def test_audit_reports_when_a_misconfiguration_held(tmp_path: Path) -> None:
    from jobs.report import _audit

    t = [T0 + timedelta(minutes=m) for m in (0, 5, 10, 15)]
    thp = ["always", "never", "never", "always"]  # the 10-min snapshot re-reads the same facts
    facts = pl.DataFrame({"time": t, "host": ["h1"] * 4, "category": ["thp"] * 4, "device": [""] * 4,
                          "key": ["enabled"] * 4, "value": thp, "value_num": [None] * 4},
                         schema_overrides={"value_num": pl.Float64})
    a = _audit(facts)
    assert a is not None
    thp_rows = a.filter(pl.col("entry_id") == "thp_coverage_loss")
    assert thp_rows.height == 1
    assert thp_rows["first_seen"][0] == t[1] and thp_rows["until"][0] == t[3]
    still = _audit(facts.head(3))
    assert still is not None and still.filter(pl.col("entry_id") == "thp_coverage_loss")["until"][0] is None


# ------------------------------------------------------------ a small lake built here


def _small_lake(root: Path, n_incidents: int = 0, minutes: int = 30, entries: tuple[str, ...] = (
        "gpu_power_throttle", "thp_coverage_loss", "irq_locality_miss"), long_first: bool = False,
        infinite: range = range(0)) -> Path:
    """One host, 10 s combined scores over ``minutes``, and ``n_incidents`` 20 s matched
    incidents spread over it, their entries alternating (the plot's label pile-up); with
    ``long_first`` the first one lasts 12345 s; the windows ``infinite`` score +inf (a
    detector whose reference had no spread)."""
    from analytics.pipeline import SCORES_SCHEMA
    from knowledge_base.incidents import INCIDENT_SCHEMA

    n = minutes * 6
    ws = [T0 + timedelta(seconds=10 * i) for i in range(n)]
    scores = pl.DataFrame({"time": ws, "host": ["h1"] * n, "window_start": ws,
                           "window_end": [w + timedelta(seconds=10) for w in ws], "detector": ["combined"] * n,
                           "reference": ["self"] * n, "score": [float("inf") if i in infinite else 0.5 + (i % 7) * 0.3 for i in range(n)],
                           "threshold": [1.0] * n, "flagged": [(i % 7) > 1 for i in range(n)]},
                          schema={"time": SCORES_SCHEMA["window_start"], **SCORES_SCHEMA})
    write_table(root, "scores", scores, partition_by_hour=False)
    if n_incidents:
        step = n * 10 // n_incidents
        starts = [T0 + timedelta(seconds=step * i) for i in range(n_incidents)]
        inc = pl.DataFrame({
            "time": starts, "incident_id": [f"inc-{i:04d}" for i in range(n_incidents)], "host": ["h1"] * n_incidents,
            "start": starts, "end": [s + timedelta(seconds=12345 if i == 0 and long_first else 20) for i, s in enumerate(starts)],
            "n_windows": [2] * n_incidents, "status": ["matched"] * n_incidents,
            "entry_id": [entries[i % len(entries)] for i in range(n_incidents)],
            "label_type": [entries[i % len(entries)] for i in range(n_incidents)],
            "title": ["a title"] * n_incidents, "confidence": [0.9] * n_incidents,
            "peak_score": [5.0 - i / n_incidents for i in range(n_incidents)],
            "explanation": ["an explanation long enough to take the width of the table " * 4] * n_incidents},
            schema_overrides={"start": INCIDENT_SCHEMA["start"], "end": INCIDENT_SCHEMA["end"]})
        inc = inc.with_columns(pl.lit(None, dt).alias(c) for c, dt in INCIDENT_SCHEMA.items() if c not in inc.columns)
        write_table(root, "incidents", inc, partition_by_hour=False)
    return root


def test_report_without_a_range_prints_the_range_of_the_data(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    lake = _small_lake(tmp_path / "lake", minutes=10)
    out = tmp_path / "r.html"
    assert main(["report", "--lake", str(lake), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    assert "- .. -" not in first
    assert first == "Unveil report: 1 host(s), 2026-01-05 08:00:00 UTC .. 2026-01-05 08:10:00 UTC (the data's range)"
    assert "range 2026-01-05 08:00:00 UTC .. 2026-01-05 08:10:00 UTC (the data&#x27;s range)" in out.read_text()
    # one bound given: the other is the data's
    s = write_report(lake, out, start=T0 + timedelta(minutes=5))
    assert s.text().splitlines()[0].endswith("2026-01-05 08:05:00 UTC .. 2026-01-05 08:10:00 UTC (end: the data's)")
    # no data at all: said so, not "- .. -"
    (tmp_path / "empty").mkdir()
    empty = write_report(tmp_path / "empty", tmp_path / "e.html")
    assert empty.text().splitlines()[0] == "Unveil report: 0 host(s), no data"


_MEASURE = """<script>
// Layout as Chromium renders it: the boxes of the score plot's incident labels, per panel,
// and the number of lines each incidents-table duration, host and status cell takes.
window.addEventListener('load', () => {
  const labels = [...document.querySelectorAll('#traces [id^="incident-label"]')].map(g => {
    const r = g.getBoundingClientRect();
    return {panel: g.id.split('-')[2], text: g.textContent.trim(), l: r.left, r: r.right, t: r.top, b: r.bottom};
  });
  const heads = [...document.querySelectorAll('table.incidents thead th')].map(th => th.textContent);
  const linesOf = name => {
    const c = heads.indexOf(name);
    return c < 0 ? [] : [...document.querySelectorAll('table.incidents tbody tr')].map(tr => {
      const td = tr.children[c]; const range = document.createRange(); range.selectNodeContents(td);
      const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      return {text: td.textContent, lines: tops.size};
    });
  };
  const col = heads.indexOf('duration'), cells = linesOf('duration');
  const pre = document.createElement('pre'); pre.id = 'measure';
  pre.textContent = JSON.stringify({labels, cells, col, host: linesOf('host'), status: linesOf('status')});
  document.body.appendChild(pre);
});
</script>"""


def _measure(report: Path, tmp_path: Path, width: int = 1280) -> dict[str, Any]:
    page = tmp_path / "measure.html"
    page.write_text(report.read_text(encoding="utf-8").replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    dom, console = chromium(page, tmp_path, "--dump-dom", f"--window-size={width},1600",
                            "--virtual-time-budget=5000")
    assert console == []
    m = re.search(r'<pre id="measure">(.*?)</pre>', dom, flags=re.S)
    assert m, "the measuring script did not run"
    return json.loads(html_mod.unescape(m.group(1)))  # type: ignore[no-any-return]


def _overlaps(boxes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if a["panel"] == b["panel"] and min(a["r"], b["r"]) - max(a["l"], b["l"]) > 0.5 \
                    and min(a["b"], b["b"]) - max(a["t"], b["t"]) > 0.5:
                out.append((a["text"], b["text"]))
    return out


def test_incident_labels_on_the_score_plot_do_not_overlap(tmp_path: Path) -> None:
    # 60 short incidents in 30 min, their entries alternating: one label per incident used to
    # pile into an unreadable strip along the top of the panel.
    lake = _small_lake(tmp_path / "lake", n_incidents=60)
    out = tmp_path / "r.html"
    write_report(lake, out)
    m = _measure(out, tmp_path)
    labels = m["labels"]
    assert len(labels) >= 3, labels  # thinned, not dropped: each entry is still named at least once
    assert {lb["text"] for lb in labels} == {"gpu_power_throttle", "thp_coverage_loss", "irq_locality_miss"}
    assert _overlaps(labels) == [], f"{len(_overlaps(labels))} overlapping label pairs of {len(labels)}"


def test_incident_duration_host_and_status_render_on_one_line(tmp_path: Path) -> None:
    # (five entries: the long first incident spans the others, and one of its own entry would join it)
    lake = _small_lake(tmp_path / "lake", n_incidents=5, long_first=True, entries=(
        "gpu_power_throttle", "thp_coverage_loss", "irq_locality_miss", "nic_drops", "memory_pressure"))
    out = tmp_path / "r.html"
    write_report(lake, out)
    m = _measure(out, tmp_path, width=900)  # a narrow window: the explanation column squeezes the others
    assert m["col"] >= 0, "no duration column"
    cells = m["cells"]
    assert len(cells) == 5
    assert [c["lines"] for c in cells] == [1] * 5, cells
    assert "3 h 25 min" in {c["text"] for c in cells} and "20 s" in {c["text"] for c in cells}
    # short identifiers do not break either ('sim-' / '00', 'match' / 'ed' in the demo's report)
    for name in ("host", "status"):
        assert len(m[name]) == 5 and [c["lines"] for c in m[name]] == [1] * 5, (name, m[name])


def test_infinite_scores_are_drawn_at_the_top_of_their_panel(tmp_path: Path) -> None:
    # +inf scores (a degenerate reference) used to vanish from the trace: the line broke and
    # no dot was drawn exactly where the anomaly was worst.
    lake = _small_lake(tmp_path / "lake", minutes=10, infinite=range(20, 40))
    out = tmp_path / "r.html"
    write_report(lake, out)
    svg = out.read_text()
    trace = re.search(r'<g id="score-trace-0">.*?<path d="([^"]*)"', svg, flags=re.S)
    assert trace, "no score trace in the SVG"
    d = trace.group(1)
    assert d.count("M") == 1, "the trace is broken"
    assert len(re.findall(r"[ML]\s*-?[\d.]+\s+-?[\d.]+", d)) == 60  # every window drawn
    marks = re.search(r'<g id="score-infinite-0">(.*?)</g>\s*</g>', svg, flags=re.S)
    assert marks and marks.group(1).count("<use") == 20, "the 20 infinite windows are not marked"
    assert "score = ∞ (drawn at the top)" in svg


def test_gathered_facts_are_all_that_rendering_reads(tmp_path: Path) -> None:
    """The report is gather -> render: the facts carry every section (typed), and the
    document rendered from them after the lake is gone is the one write_report writes."""
    from jobs.report import gather, render

    lake = _small_lake(tmp_path / "lake", n_incidents=3, minutes=10)
    facts = gather(lake, tmp_path / "r.html")
    assert facts.summary.windows == 60 and facts.summary.incidents == 3 and facts.summary.plots == 2
    assert facts.traces.hosts == ["h1"] and facts.traces.n_hosts == 1
    assert facts.incidents.table is not None and facts.incidents.table.height == 3
    assert facts.audit.findings is None and facts.remediations.actions is None  # no host_facts, no queue
    written = write_report(lake, tmp_path / "r.html")
    assert written.plots == facts.summary.plots and written.windows == facts.summary.windows
    shutil.rmtree(lake)
    stamp = re.compile(r"generated [^<]*</p>|<dc:date>[^<]*</dc:date>")
    doc = stamp.sub("", render(facts))
    assert doc == stamp.sub("", (tmp_path / "r.html").read_text(encoding="utf-8"))
    assert 'id="traces"' in doc and 'id="incidents"' in doc and "none queued" in doc
