"""The HTML report (jobs.report, ``unveil report``), rendered in a real headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

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
