"""Metric definitions of docs/evaluation.md on hand-built cases with hand-computed values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from analytics.evaluation import (
    Evaluation,
    evaluate,
    f1,
    label_windows,
    parse_configs,
    predicted_events,
    render_table,
)

T0 = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
DATA = Path(__file__).parent / "data" / "evaluation"


def t(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def windows(
    host: str, n: int, flagged: set[int], *, length: float = 10, stride: float = 10
) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "host": [host] * n,
            "window_start": [t(i * stride) for i in range(n)],
            "window_end": [t(i * stride + length) for i in range(n)],
            "flagged": [i in flagged for i in range(n)],
        }
    )


def labels(rows: list[tuple[str, str, float, float | None]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "host": [r[0] for r in rows],
            "type": [r[1] for r in rows],
            "time": [t(r[2]) for r in rows],
            "end": [t(r[3]) if r[3] is not None else None for r in rows],
            "label_id": [f"L{i}" for i in range(len(rows))],
        },
        schema_overrides={"end": pl.Datetime("us", "UTC"), "time": pl.Datetime("us", "UTC")},
    )


def matches(rows: list[tuple[str, float, str | None]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "host": [r[0] for r in rows],
            "window_start": [t(r[1]) for r in rows],
            "match_type": [r[2] for r in rows],
            "confidence": [0.9] * len(rows),
        },
        schema_overrides={"match_type": pl.String},
    )


# host h: 10 windows of 10 s; flagged w2, w3, w6, w9.  L1 A [15,35) -> w1..w3, L2 B [60,65) -> w6,
# L3 A [80,85) -> w8.  host g: 2 windows, both flagged, label A [0,20).
W = pl.concat([windows("h", 10, {2, 3, 6, 9}), windows("g", 2, {0, 1})])
L = labels([("h", "A", 15, 35), ("h", "B", 60, 65), ("h", "A", 80, 85), ("g", "A", 0, 20)])
# w2 right (A), w3 no match, w6 right (B), w9 healthy but matched, w8 unflagged (ignored), g wrong
M = matches(
    [
        ("h", 20, "A"),
        ("h", 30, None),
        ("h", 60, "B"),
        ("h", 90, "A"),
        ("h", 80, "A"),
        ("g", 0, "B"),
        ("g", 10, "B"),
    ]
)


def test_window_level() -> None:
    m, _ = evaluate(W, L)
    assert (m.windows, m.positive_windows, m.healthy_windows, m.flagged, m.labels) == (
        12,
        7,
        5,
        6,
        4,
    )
    assert m.window is not None
    assert (m.window.tp, m.window.fp, m.window.fn) == (5, 1, 2)
    assert m.window.precision == pytest.approx(5 / 6)
    assert m.window.recall == pytest.approx(5 / 7)
    assert m.window.f1 == pytest.approx(10 / 13)


def test_event_level_and_time_to_detect() -> None:
    m, _ = evaluate(W, L)
    assert m.predicted_events == 4  # h: {w2,w3}, {w6}, {w9}; g: {w0,w1}
    assert m.detected_labels == 3
    assert m.event_precision == pytest.approx(3 / 4)
    assert m.event_recall == pytest.approx(3 / 4)
    assert m.event_f1 == pytest.approx(3 / 4)
    # TTD: L1 20-15 = 5, L2 0, g 0 -> median 0, p90 (linear) 0 + 0.8 * 5 = 4
    assert m.ttd_median_s == pytest.approx(0.0)
    assert m.ttd_p90_s == pytest.approx(4.0)
    # without a matcher the fingerprint figures are undefined, not zero
    assert m.signature_hit_rate is None and m.healthy_contamination is None


def test_fingerprint_figures() -> None:
    m, per = evaluate(W, L, M)
    assert m.signature_hit_rate == pytest.approx(2 / 5)  # w2, w6 right of 5 flagged positives
    assert m.signature_coverage == pytest.approx(2 / 7)  # of 7 positive windows
    assert m.detection_signature_agreement == pytest.approx(5 / 6)  # w2 w6 w9 g0 g1 of 6 flagged
    assert m.healthy_contamination == pytest.approx(1 / 5)  # w9 of w0 w4 w5 w7 w9
    a, b = per["A"], per["B"]
    assert (a.labels, a.detected_labels) == (3, 2)
    assert a.window is not None and a.window.recall == pytest.approx(4 / 6)
    assert a.signature_hit_rate == pytest.approx(1 / 4)
    assert a.signature_coverage == pytest.approx(1 / 6)
    assert a.ttd_median_s == pytest.approx(2.5)
    assert (b.labels, b.detected_labels, b.signature_hit_rate, b.signature_coverage) == (
        1,
        1,
        1.0,
        1.0,
    )


def test_no_labels() -> None:
    m, per = evaluate(W, None, M)
    assert m.window is not None
    assert (m.window.tp, m.window.fp, m.window.fn) == (0, 6, 0)
    assert m.window.precision == 0.0 and m.window.recall is None and m.window.f1 is None
    assert m.event_recall is None and m.event_precision == 0.0
    assert m.ttd_median_s is None and per == {}
    assert m.signature_hit_rate is None and m.signature_coverage is None
    assert m.healthy_contamination == pytest.approx(5 / 12)  # w2 w6 w9 g0 g1 matched


def test_no_flags() -> None:
    m, _ = evaluate(windows("h", 10, set()), L.filter(pl.col("host") == "h"), matches([]))
    assert m.window is not None
    assert m.window.precision is None and m.window.recall == 0.0 and m.window.f1 is None
    assert m.predicted_events == 0 and m.event_precision is None and m.event_recall == 0.0
    assert m.ttd_median_s is None
    assert m.signature_hit_rate is None  # no flagged positive window
    assert m.signature_coverage == 0.0 and m.detection_signature_agreement is None
    assert m.healthy_contamination == 0.0


def test_overlapping_labels() -> None:
    lab = labels([("h", "A", 10, 30), ("h", "B", 25, 50)])
    lw = label_windows(windows("h", 6, {2}), lab)
    assert lw["positive"].to_list() == [False, True, True, True, True, False]
    assert lw["true_types"].to_list()[2] == ["A", "B"]
    m, per = evaluate(windows("h", 6, {2}), lab, matches([("h", 20, "B")]))
    assert m.window is not None and (m.window.tp, m.window.fp, m.window.fn) == (1, 0, 3)
    assert m.detected_labels == 2 and m.event_recall == 1.0 and m.event_precision == 1.0
    assert m.ttd_median_s == pytest.approx(5.0)  # A: 20-10 = 10, B: max(0, 20-25) = 0
    assert m.signature_hit_rate == 1.0  # B is one of the window's true types
    assert per["A"].signature_coverage == pytest.approx(1 / 2)  # w1, w2 carry A
    assert per["B"].signature_coverage == pytest.approx(1 / 3)  # w2, w3, w4 carry B


def test_open_ended_label_and_other_host() -> None:
    lab = labels([("h", "A", 75, None), ("x", "A", 0, 100)])
    m, _ = evaluate(windows("h", 10, {9}), lab)
    assert m.positive_windows == 3 and m.labels == 2
    assert m.detected_labels == 1  # x has no windows: its label is missed
    assert m.event_recall == pytest.approx(1 / 2)


def test_predicted_events_overlapping_windows_and_gaps() -> None:
    # 3 s windows, 1 s stride: flagged 0,1,2 are one event; 5 and 6 another
    w = windows("h", 8, {0, 1, 2, 5, 6}, length=3, stride=1)
    ev = predicted_events(w)
    assert ev["n_windows"].to_list() == [3, 2]
    assert ev["event_start"].to_list() == [t(0), t(5)]
    assert ev["event_end"].to_list() == [t(5), t(9)]
    # a time gap splits a run even without an unflagged window in between
    gap = pl.concat(
        [
            windows("h", 2, {0, 1}),
            windows("h", 2, {0, 1}).with_columns(
                pl.col("window_start") + timedelta(seconds=100),
                pl.col("window_end") + timedelta(seconds=100),
            ),
        ]
    )
    assert predicted_events(gap).height == 2


def test_duplicate_rows_per_window_are_merged() -> None:
    # scores carry one row per reference; a window is flagged if any is
    w = windows("h", 3, {1})
    both = pl.concat([w, w.with_columns(pl.lit(False).alias("flagged"))])
    m, _ = evaluate(both, labels([("h", "A", 10, 20)]))
    assert m.windows == 3 and m.window is not None and m.window.tp == 1


def test_f1_edge_cases() -> None:
    assert f1(0.0, 0.0) == 0.0
    assert f1(None, 1.0) is None
    assert f1(1.0, 0.5) == pytest.approx(2 / 3)


def test_parse_configs() -> None:
    specs = parse_configs("Z|IF|Maha|Z∨IF∨Maha|IF+Maha|vote2")
    assert [s.name for s in specs] == ["Z", "IF", "Maha", "Z∨IF∨Maha", "IF∨Maha", "vote2"]
    assert specs[3].detectors == ("zscore", "iforest", "mahalanobis") and specs[3].combine == "any"
    assert specs[5].combine == "vote" and specs[5].vote_k == 2
    assert parse_configs("iforest&mahalanobis")[0].combine == "all"
    assert [s.name for s in parse_configs(None)] == [
        "Z∨IF∨Maha", "IF∨Maha", "Z", "IF", "Maha", "vote2", "KB", "Z∨IF∨Maha∨KB", "vote2∨KB"]
    sig = parse_configs("vote2+kb|KB|IF∨sig")
    assert [s.name for s in sig] == ["vote2∨KB", "KB", "IF∨KB"]
    assert all(s.signature for s in sig) and [s.statistical for s in sig] == [True, False, True]
    assert sig[0].vote_k == 2 and sig[2].detectors == ("iforest",)
    with pytest.raises(ValueError, match="only be OR'ed"):
        parse_configs("Z&KB")
    with pytest.raises(ValueError, match="unknown detector 'pca'"):
        parse_configs("Z|pca")
    with pytest.raises(ValueError, match="K must be"):
        parse_configs("vote5")


def test_render_table_and_json() -> None:
    ev = Evaluation(default_config="vote2")
    ev.rows["vote2"], ev.per_type["vote2"] = evaluate(W, L, None)
    text = render_table(ev)
    assert "vote2 (default)" in text and "n/a" in text and "83.3 %" in text
    doc = ev.to_json()
    assert doc["configs"]["vote2"]["window"]["tp"] == 5
    assert doc["configs"]["vote2"]["signature_hit_rate"] is None
    assert set(doc["per_type"]["vote2"]) == {"A", "B"}


# ------------------------------------------------------------- end to end on a lake
# tests/data/evaluation: two hosts, 10 min of 1-s samples of three imported metrics;
# h1's "queue" is shifted by +12 sigma from 01:05:00 to 01:06:00 (the one label).


def _lake(tmp_path: Path) -> Path:
    from ingest.importer import import_files
    from ingest.lake import write_table

    lake = tmp_path / "lake"
    lake.mkdir()
    for h in ("h1", "h2"):
        import_files(lake, h, [DATA / f"{h}.csv"])
    labels = pl.read_csv(DATA / "labels.csv").with_columns(
        pl.col("time", "end").str.to_datetime(time_zone="UTC"))
    write_table(lake, "labels", labels, partition_by_hour=False)
    return lake


def _shift_matcher(findings: pl.DataFrame, host_facts: pl.DataFrame | None) -> pl.DataFrame:
    """A stand-in knowledge base: 'queue_shift' when the top factor is the queue metric."""
    top = findings.select("host", "window_start", pl.col("top_factors").list.first().struct.field("feature").alias("f"))
    return top.select("host", "window_start",
                      pl.when(pl.col("f") == "imported.queue").then(pl.lit("queue_shift")).alias("match_type"),
                      pl.lit(1.0).alias("confidence"))


def test_evaluate_lake_on_imported_metrics(tmp_path: Path) -> None:
    from analytics.evaluation import evaluate_lake

    lake = _lake(tmp_path)
    ev = evaluate_lake(lake, t(3600), t(4200), configs=parse_configs("Maha|vote2"), matcher=_shift_matcher,
                       matcher_name="test")
    assert ev.default_config == "vote2"
    for name in ("Maha", "vote2"):
        m = ev.rows[name]
        assert m.labels == 1 and m.detected_labels == 1
        assert m.window is not None and m.window.recall is not None and m.window.recall > 0.8
        assert m.window.precision is not None and m.window.precision > 0.8
        assert m.ttd_median_s is not None and m.ttd_median_s <= 3.0
        # the planted channel is what the attribution blames, so the stand-in matcher is right
        assert m.signature_hit_rate is not None and m.signature_hit_rate > 0.9
        assert m.healthy_contamination is not None and m.healthy_contamination < 0.01
    assert set(ev.per_type["vote2"]) == {"queue_shift"}


def test_cli_eval_json_and_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from ingest.lake import scan, tables
    from jobs.cli import main

    lake = _lake(tmp_path)
    assert main(["eval", "--lake", str(lake), "--format", "json", "--configs", "Z|vote2", "--matcher", "none"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["configs"]) == ["Z", "vote2"] and doc["default_config"] == "vote2"
    assert doc["configs"]["vote2"]["detected_labels"] == 1
    assert doc["configs"]["vote2"]["signature_hit_rate"] is None  # no matcher: n/a

    assert main(["sweep", "--lake", str(lake), "--since", "2026-11-30T01:00Z", "--until", "2026-11-30T01:10Z"]) == 0
    out = capsys.readouterr().out
    assert "h1" in out and "written: features" in out
    assert {"features", "scores", "findings"} <= set(tables(lake))
    findings = scan(lake, "findings").collect()
    assert findings.height > 0 and set(findings["host"].unique()) == {"h1"}
    assert (findings["time"] == findings["window_start"]).all()
    assert findings["window_start"].min() >= t(3600 + 300 - 3)  # flagged around the shift only
    assert scan(lake, "features").collect().height == 2 * 598


def test_repeated_label_ids_are_separate_events() -> None:
    lab = labels([("h", "A", 10, 20), ("h", "A", 60, 70)]).with_columns(pl.lit("same").alias("label_id"))
    m, _ = evaluate(windows("h", 10, {1}), lab)
    assert m.labels == 2 and m.detected_labels == 1 and m.event_recall == 0.5


def test_incident_figures_top1_and_unmatched_per_host_hour() -> None:
    from analytics.evaluation import top1_identification

    lab = labels([("h", "A", 100, 200), ("h", "B", 300, 400), ("g", "A", 100, 200)])
    inc = pl.DataFrame({
        "host": ["h", "h", "h", "h", "g", "k"],
        "start": [t(90), t(180), t(310), t(500), t(120), t(50)],
        "end": [t(190), t(205), t(320), t(510), t(130), t(60)],
        "status": ["matched", "matched", "unmatched", "unmatched", "matched", "matched"],
        "label_type": ["A", "B", None, None, "B", "A"],
    })
    top = top1_identification(inc, lab)
    # h/A: the longest-overlapping matched incident says A; h/B: only an unmatched one;
    # g/A: the only matched incident says B
    assert top.sort("label_row")["identified"].to_list() == [True, False, False]
    assert top.sort("label_row")["got"].to_list() == ["A", None, "B"]
    # 10 s windows every 10 s on h, g and k over [0, 600)
    w = pl.concat([windows(h, 60, set()) for h in ("h", "g", "k")])
    m, per = evaluate(w, lab, None, inc)
    assert m.top1_identified == 1 and m.top1_rate == pytest.approx(1 / 3)
    assert per["A"].top1_identified == 1 and per["A"].top1_rate == 0.5 and per["B"].top1_rate == 0.0
    # outside every label: h 500-510 (unmatched) and k 50-60 (matched: a false identification)
    assert m.unmatched_incidents == 1 and m.false_identifications == 1
    assert m.healthy_host_hours == pytest.approx(m.healthy_windows * 10 / 3600)
    assert m.healthy_host_hours is not None and m.unmatched_per_host_hour == pytest.approx(1 / m.healthy_host_hours)
    with pytest.raises(ValueError, match="incidents frame lacks columns"):
        evaluate(w, lab, None, inc.drop("status"))


def test_cli_eval_default_has_signature_rows_and_sweep_respects_watermarks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from ingest.lake import scan, tables
    from jobs import watermarks as wm
    from jobs.cli import main

    lake = _lake(tmp_path)
    assert main(["eval", "--lake", str(lake), "--format", "json", "--configs", "vote2|vote2∨KB|KB"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["default_config"] == "vote2∨KB"
    for name in ("vote2", "vote2∨KB", "KB"):
        c = doc["configs"][name]
        assert c["top1_identified"] == 0 and c["labels"] == 1  # no entry knows an imported queue
        assert c["unmatched_per_host_hour"] is not None and c["false_identifications"] == 0
    assert doc["configs"]["KB"]["flagged"] == 0  # imported metrics match no signature
    assert doc["configs"]["vote2∨KB"]["detected_labels"] == 1
    assert main(["eval", "--lake", str(lake), "--matcher", "none", "--configs", "vote2∨KB"]) == 2
    assert "need the knowledge base" in capsys.readouterr().err
    # the default table prints the incident figures of the default row
    assert main(["eval", "--lake", str(lake), "--configs", "vote2|vote2∨KB"]) == 0
    out = capsys.readouterr().out
    assert "vote2∨KB (default)" in out and "top-1 identification of injected incidents 0/1" in out

    # a lake the scheduler manages: a by-hand sweep below the watermark is refused
    mark = datetime(2026, 11, 30, 1, 5, tzinfo=UTC)
    wm.save(lake, {"h1": wm.HostMark(mark)})
    args = ["sweep", "--lake", str(lake), "--since", "2026-11-30T01:00Z", "--until", "2026-11-30T01:10Z"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "managed by the scheduler" in err and "h1 up to 2026-11-30T01:05:00+00:00" in err
    assert "--since 2026-11-30T01:05:00+00:00" in err and "--force" in err
    assert "features" not in tables(lake)
    assert main([*args, "--dry-run"]) == 0 and "features" not in tables(lake)
    capsys.readouterr()
    assert main(["sweep", "--lake", str(lake), "--since", "2026-11-30T01:05Z", "--until", "2026-11-30T01:10Z"]) == 0
    assert main([*args, "--force"]) == 0
    scores = scan(lake, "scores").collect()
    assert "kb" in set(scores["detector"])  # the signature detector's row per window
