"""Knowledge-base quality on simulated labelled runs: the research's four figures per
inefficiency type and overall, top-1 identification of injected incidents, unmatched
incidents on healthy runs, and the NUMA-misplacement baseline comparison plot.

One scenario per injectable type (``--hosts`` hosts, the injection on one host for the
middle of the run) plus one healthy run; every run goes through the real pipeline
(simulator -> features -> detectors/attribution -> knowledge-base matching -> incidents)
with the default analytics configuration, then :func:`analytics.evaluation.evaluate`.

    .venv/bin/python benchmarks/kb_eval.py --seeds 1 2           # ~5 min per seed on this VM
    .venv/bin/python benchmarks/kb_eval.py --cache /tmp/kbc      # keep analysis results: re-runs only match
                                                                  # (recomputed when simulator/analytics code changed)
    .venv/bin/python benchmarks/kb_eval.py --plot docs/img/numa_baselines.svg
"""

from __future__ import annotations

# ruff: noqa: T201  (a benchmark prints its figures)
import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analytics.evaluation import (
    evaluate,
    flag_windows,
    label_windows,
    parse_configs,
    top1_identification,
)
from analytics.features import compute_features
from analytics.pipeline import AnalysisResult, AnalyticsConfig, analyze, cohorts
from ingest import schema
from ingest.simulator import INEFFICIENCIES, from_dict, simulate_frames
from jobs.config import SweepConfig
from jobs.step import eval_detector
from knowledge_base import load_kb

log = logging.getLogger("kb_eval")

TABLES = ("features", "findings", "scores", "host_facts", "labels")


@dataclass
class Run:
    name: str
    features: pl.DataFrame
    findings: pl.DataFrame
    scores: pl.DataFrame
    host_facts: pl.DataFrame
    labels: pl.DataFrame
    hosts: int
    duration_s: float


def scenario(name: str, typ: str | None, hosts: int, minutes: int, seed: int, severity: float) -> dict[str, Any]:
    doc: dict[str, Any] = {"seed": seed, "duration": f"{minutes}m", "hosts": hosts, "workload": "mixed"}
    if typ is not None:
        third = max(1, minutes // 3)
        doc["injections"] = [{"type": typ, "host": "sim-01", "start": f"{third}m", "duration": f"{minutes - 2 * third}m",
                              "severity": severity}]
    return doc


#: the mixed scenario: several inefficiencies on different hosts at overlapping times,
#: two hosts left healthy
MIXED = (("thp_coverage_loss", "sim-01", 3, 4), ("gpu_power_throttle", "sim-02", 2, 3),
         ("irq_locality_miss", "sim-03", 5, 4), ("cgroup_cpu_throttle", "sim-04", 6, 4),
         ("memory_bandwidth_contention", "sim-01", 8, 3))


def mixed_scenario(seed: int, severity: float) -> dict[str, Any]:
    return {"seed": seed, "duration": "12m", "hosts": 6, "workload": "mixed",
            "injections": [{"type": t, "host": h, "start": f"{a}m", "duration": f"{d}m", "severity": severity}
                           for t, h, a, d in MIXED]}


def code_version() -> str:
    """Hash of the simulator's and the analytics' sources: a cached run made by other code
    is recomputed, not silently reused."""
    import hashlib

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha1()
    for f in sorted([*root.glob("ingest/simulator/**/*.py"), *root.glob("ingest/simulator/**/*.toml"),
                     *root.glob("analytics/*.py")]):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def run_one(name: str, doc: dict[str, Any], cache: Path | None, config: AnalyticsConfig) -> Run:
    d = cache / name if cache else None
    version = code_version() if d is not None else ""
    if (d is not None and all((d / f"{t}.parquet").exists() for t in TABLES)
            and (d / "version.txt").exists() and (d / "version.txt").read_text() == version):
        got = {t: pl.read_parquet(d / f"{t}.parquet") for t in TABLES}
    else:
        sc = from_dict(doc, name=name)
        frames, _ = simulate_frames(sc)
        facts = frames.pop("host_facts")
        labels = frames.pop("labels", None)
        labels = labels if labels is not None else schema.empty_frame("labels")
        frames.pop("workload", None)
        feats = compute_features({k: v.lazy() for k, v in frames.items()}, config.window, host_facts=facts)
        res = analyze({}, config, host_facts=facts, features=feats)
        got = {"features": feats, "findings": res.findings, "scores": res.scores, "host_facts": facts, "labels": labels}
        if d is not None:
            d.mkdir(parents=True, exist_ok=True)
            for t, df in got.items():
                df.write_parquet(d / f"{t}.parquet")
            (d / "version.txt").write_text(version)
    minutes = float(str(doc["duration"]).rstrip("m"))
    return Run(name, got["features"], got["findings"], got["scores"], got["host_facts"], got["labels"],
               int(doc["hosts"]), minutes * 60.0)


def _prefix(df: pl.DataFrame, name: str) -> pl.DataFrame:
    """Hosts renamed ``<run>/<host>`` so runs can be evaluated together."""
    return df.with_columns((pl.lit(name + "/") + pl.col("host")).alias("host")) if "host" in df.columns else df


def top1(incidents: pl.DataFrame, labels: pl.DataFrame) -> tuple[int, int, list[str]]:
    """(labels whose dominant overlapping incident names the right entry, labels, misses)."""
    ok, misses = 0, []
    for lab in labels.iter_rows(named=True):
        ov = incidents.filter((pl.col("host") == lab["host"]) & (pl.col("start") < lab["end"])
                              & (pl.col("end") > lab["time"]))
        if ov.is_empty():
            misses.append(f"{lab['host']} {lab['type']}: no incident")
            continue
        ov = ov.with_columns(
            ((pl.min_horizontal(pl.col("end"), pl.lit(lab["end"])) - pl.max_horizontal(pl.col("start"), pl.lit(lab["time"])))
             .dt.total_seconds()).alias("overlap"))
        best = ov.filter(pl.col("status") == "matched").sort(["overlap", "incident_id"], descending=[True, False])
        if not best.is_empty() and best["label_type"][0] == lab["type"]:
            ok += 1
        else:
            got = best["label_type"][0] if not best.is_empty() else "unmatched"
            misses.append(f"{lab['host']} {lab['type']}: best incident {got}")
    return ok, labels.height, misses


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


#: evaluated combinations: the statistical default, the knowledge base alone, and the
#: sweep's default verdict (vote2 OR signature); all share one analysis per run
SPECS = ("vote2", "KB", "vote2∨KB")


def evaluate_runs(runs: list[Run], spec_name: str = "vote2∨KB", cfg: SweepConfig | None = None,
                  kb_path: Path | None = None) -> dict[str, Any]:
    """The sweep's verdict (:func:`jobs.step.eval_detector`: warm-up, signature
    detector, matching, incidents) on every run, evaluated together with
    :func:`analytics.evaluation.evaluate` (incident figures included)."""
    kb = load_kb(kb_path)
    spec = parse_configs(spec_name)[0]
    cfg = cfg or SweepConfig()
    hook = eval_detector(kb, cfg)
    windows, labels, matches, incidents = [], [], [], []
    t_match = 0.0
    for r in runs:
        t0 = time.perf_counter()
        # the cached run's analysis, with the cohorts analytics forms under these settings
        res = AnalysisResult(r.features, r.scores, r.findings, cfg.analytics,
                             cohorts(r.features, r.host_facts, by=cfg.analytics.cohort_by,
                                     tolerance=cfg.analytics.cohort_tolerance))
        det = hook(res, r.host_facts, spec, frame_start=None)
        t_match += time.perf_counter() - t0
        win = flag_windows(r.features, det.flagged)  # every window, scored by statistics or not
        windows.append(_prefix(win, r.name))
        labels.append(_prefix(r.labels, r.name))
        assert det.matches is not None and det.incidents is not None
        matches.append(_prefix(det.matches, r.name))
        incidents.append(_prefix(det.incidents, r.name))
    w, lab, mt, inc = pl.concat(windows), pl.concat(labels), pl.concat(matches), pl.concat(incidents)
    overall, per_type = evaluate(w, lab, mt, inc)
    top = top1_identification(inc, lab)
    misses = [f"{h} {t}: {g or 'no matched incident'}" for h, t, g in
              top.filter(~pl.col("identified")).select("host", "type", "got").iter_rows()]
    # unmatched incidents on hosts without any label (whole healthy hosts)
    labelled = sorted(set(lab["host"].to_list()))
    clean = inc.filter(~pl.col("host").is_in(labelled))
    clean_hours = sum((r.hosts - r.labels["host"].n_unique()) * r.duration_s for r in runs) / 3600.0
    return {
        "spec": spec.name, "overall": overall, "per_type": per_type, "top1_misses": misses,
        "type_figures": type_figures(w, lab, mt),
        "unmatched_clean_hosts": clean.filter(pl.col("status") == "unmatched").height,
        "matched_clean_hosts": clean.filter(pl.col("status") == "matched").height,
        "clean_host_hours": clean_hours, "match_seconds": t_match, "incidents": inc,
    }


def type_figures(windows: pl.DataFrame, labels: pl.DataFrame, matches: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """Per label type: healthy contamination (share of the windows outside every label that
    are flagged and matched to this type) and onset delay (per label, seconds from its
    start to the first window overlapping it that is flagged and matched to its type;
    median and max over the labels, None when a label never gets one)."""
    mt = (matches.select("host", pl.col("window_start").cast(pl.Datetime("us", "UTC")), "match_type")
          .drop_nulls("match_type").unique(subset=["host", "window_start"], keep="first", maintain_order=True))
    lw = (label_windows(windows, labels).join(mt, on=["host", "window_start"], how="left")
          .with_columns((pl.col("flagged") & pl.col("match_type").is_not_null()).alias("matched")))
    healthy = lw.filter(~pl.col("positive"))
    n_healthy = max(healthy.height, 1)
    hits = lw.filter(pl.col("matched")).select("host", "window_start", "window_end", "match_type")
    out: dict[str, dict[str, Any]] = {}
    for t in sorted(set(labels["type"].to_list())):
        delays: list[float | None] = []
        for lab in labels.filter(pl.col("type") == t).iter_rows(named=True):
            first = hits.filter((pl.col("host") == lab["host"]) & (pl.col("match_type") == t)
                                & (pl.col("window_start") < lab["end"]) & (pl.col("window_end") > lab["time"]))
            delays.append(None if first.is_empty()
                          else (first["window_start"].min() - lab["time"]).total_seconds())
        got = [d for d in delays if d is not None]
        out[t] = {"contamination": int((healthy["match_type"] == t).sum()) / n_healthy,
                  "onset_median_s": float(np.median(got)) if got else None,
                  "onset_max_s": None if len(got) < len(delays) else max(got)}
    return out


def _secs(x: float | None) -> str:
    return "never" if x is None else f"{x:+.0f} s"


def render(res: dict[str, Any]) -> str:
    o = res["overall"]
    tf = res.get("type_figures", {})
    lines = ["| type | labels | flagged win. recall | hit rate | coverage | top-1 | contamination | onset delay median / max |",
             "|---|---|---|---|---|---|---|---|"]
    for t, m in res["per_type"].items():
        f = tf.get(t, {})
        lines.append(f"| {t} | {m.labels} | {_pct(m.window.recall if m.window else None)} | "
                     f"{_pct(m.signature_hit_rate)} | {_pct(m.signature_coverage)} | {m.top1_identified}/{m.labels} | "
                     f"{_pct(f.get('contamination'))} | {_secs(f.get('onset_median_s'))} / {_secs(f.get('onset_max_s'))} |")
    lines.append(f"| **overall** | {o.labels} | {_pct(o.window.recall if o.window else None)} | "
                 f"**{_pct(o.signature_hit_rate)}** | **{_pct(o.signature_coverage)}** | "
                 f"**{o.top1_identified}/{o.labels}** | **{_pct(o.healthy_contamination)}** | |")
    upph = o.unmatched_per_host_hour
    clean = res["clean_host_hours"]
    lines += [
        "",
        f"overall: hit rate {_pct(o.signature_hit_rate)}, coverage {_pct(o.signature_coverage)}, "
        f"agreement {_pct(o.detection_signature_agreement)}, healthy contamination {_pct(o.healthy_contamination)}",
        f"windows {o.windows}, positive {o.positive_windows}, flagged {o.flagged}; detection window recall "
        f"{_pct(o.window.recall if o.window else None)}, precision {_pct(o.window.precision if o.window else None)}",
        f"top-1 identification: {o.top1_identified}/{o.labels} = {_pct(o.top1_rate)}",
        f"unmatched incidents outside labels: {o.unmatched_incidents} in {o.healthy_host_hours:.2f} healthy "
        f"host-hours = {'n/a' if upph is None else f'{upph:.2f}'} per host-hour; on label-free hosts: "
        f"{res['unmatched_clean_hosts']} in {clean:.2f} host-hours = "
        f"{res['unmatched_clean_hosts'] / clean if clean else float('nan'):.2f} per host-hour",
        f"matched incidents outside labels (false identifications): {o.false_identifications}; on label-free "
        f"hosts: {res['matched_clean_hosts']}",
        f"verdict + matching + incidents: {res['match_seconds']:.1f} s",
    ]
    if res["top1_misses"]:
        lines.append("top-1 misses: " + "; ".join(res["top1_misses"]))
    return "\n".join(lines)


# ------------------------------------------------------------------ baseline plot
def baseline_scores(run: Run, config: AnalyticsConfig,
                    drop: tuple[str, ...] = ()) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per detector, (healthy scores, faulty scores) on the NUMA run: faulty = windows inside
    the label on the injected host, healthy = the other hosts' windows over the same span.

    The baselines get what they assume: a healthy reference. The Prodigy-like (PCA
    reconstruction, a linear autoencoder) and eACGM-like (Gaussian-mixture NLL) models are
    fitted on every host's windows before the injection (robustly standardised raw window
    features, catalog floors) and score the windows after it. Ours is the pipeline's
    combined score as the sweep computes it (no healthy reference; max over references).
    ``drop``: feature-name prefixes left out of every detector's input (a what-if: the
    footprint without those counters)."""
    from analytics.baselines import GaussianMixtureNLL, PCAReconstruction
    from analytics.catalog import lookup

    lab = run.labels.row(0, named=True)
    feats = run.features.drop([c for c in run.features.columns if drop and c.startswith(drop)])
    cols = [c for c in feats.columns if c not in ("host", "window_start", "window_end")]
    X = feats.select(cols).to_numpy().astype(np.float64)
    X[~np.isfinite(X)] = np.nan
    floors = np.array([lookup(c).floor for c in cols], dtype=np.float64)
    host, ws, we = (feats[c].to_numpy() for c in ("host", "window_start", "window_end"))
    t0, t1 = np.datetime64(lab["time"].replace(tzinfo=None), "us"), np.datetime64(lab["end"].replace(tzinfo=None), "us")
    train = we <= t0
    faulty = (host == lab["host"]) & (ws >= t0) & (we <= t1)
    healthy = (host != lab["host"]) & (ws >= t0) & (we <= t1)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, det in (("Prodigy-like (PCA recon.)", PCAReconstruction(floors=floors, random_state=0)),
                      ("eACGM-like (GMM NLL)", GaussianMixtureNLL(floors=floors, random_state=0))):
        det.fit(X[train])
        sc = det.score_samples(X)
        out[name + ", healthy ref."] = (sc[healthy], sc[faulty])
    res = run.scores if not drop else analyze({}, config, host_facts=run.host_facts, features=feats).scores
    s = (res.filter(pl.col("detector") == "combined").group_by("host", "window_start", "window_end")
         .agg(pl.col("score").max()))
    inside = (pl.col("window_start") >= lab["time"]) & (pl.col("window_end") <= lab["end"])
    f = s.filter((pl.col("host") == lab["host"]) & inside)["score"].to_numpy()
    h = s.filter((pl.col("host") != lab["host"]) & inside)["score"].to_numpy()
    out["Unveil (vote2 Z/IF/Maha), no ref."] = (h[np.isfinite(h)], f[np.isfinite(f)])
    return out


def overlap(h: np.ndarray, f: np.ndarray) -> float:
    """Histogram overlap coefficient (0 = separable, 1 = identical) on shared bins."""
    lo, hi = np.percentile(np.concatenate([h, f]), [0.5, 99.5])
    bins = np.linspace(lo, hi if hi > lo else lo + 1, 41)
    a, _ = np.histogram(np.clip(h, lo, hi), bins)
    b, _ = np.histogram(np.clip(f, lo, hi), bins)
    return float(np.minimum(a / max(a.sum(), 1), b / max(b.sum(), 1)).sum())


def svg_plot(data: dict[str, tuple[np.ndarray, np.ndarray]], title: str) -> str:
    """Self-contained SVG: one histogram panel per detector, healthy vs faulty windows
    (density, log-scaled score axis where scores span decades)."""
    pw, ph, pad = 300, 200, 45
    W = pad + len(data) * (pw + pad)
    H = ph + 2 * pad + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">{title}</text>']
    for k, (name, (h, f)) in enumerate(data.items()):
        x0, y0 = pad + k * (pw + pad), pad
        both = np.concatenate([h, f])
        lo, hi = np.percentile(both, [0.5, 99.5])
        use_log = lo > 0 and hi / lo > 100
        tr = (lambda v: np.log10(v)) if use_log else (lambda v: v)  # noqa: E731
        a_lo, a_hi = tr(lo), tr(hi if hi > lo else lo + 1)
        bins = np.linspace(a_lo, a_hi, 41)
        hh, _ = np.histogram(np.clip(tr(np.clip(h, lo, hi)), a_lo, a_hi), bins)
        ff, _ = np.histogram(np.clip(tr(np.clip(f, lo, hi)), a_lo, a_hi), bins)
        hd, fd = hh / max(hh.sum(), 1), ff / max(ff.sum(), 1)
        top = max(hd.max(), fd.max(), 1e-9)
        bw = pw / (len(bins) - 1)
        out.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
        for series, color in ((hd, "#1f77b4"), (fd, "#d62728")):
            for i, v in enumerate(series):
                if v > 0:
                    bh = ph * v / top
                    out.append(f'<rect x="{x0 + i * bw:.1f}" y="{y0 + ph - bh:.1f}" width="{bw:.1f}" height="{bh:.1f}" '
                               f'fill="{color}" fill-opacity="0.45"/>')
        ov = overlap(h, f)
        out.append(f'<text x="{x0 + pw / 2}" y="{y0 - 6}" text-anchor="middle">{name}</text>')
        lab = (lambda v: f"{10 ** v:.3g}") if use_log else (lambda v: f"{v:.3g}")  # noqa: E731
        for frac in (0.0, 0.5, 1.0):
            v = a_lo + frac * (a_hi - a_lo)
            out.append(f'<text x="{x0 + frac * pw:.1f}" y="{y0 + ph + 14}" text-anchor="middle">{lab(v)}</text>')
        out.append(f'<text x="{x0 + pw / 2}" y="{y0 + ph + 28}" text-anchor="middle">window score'
                   f'{" (log scale)" if use_log else ""}; overlap {ov:.2f}</text>')
        out.append(f'<text x="{x0 + 4}" y="{y0 + 14}" fill="#1f77b4">healthy n={h.size}</text>')
        out.append(f'<text x="{x0 + 4}" y="{y0 + 28}" fill="#d62728">NUMA-misplaced n={f.size}</text>')
    out.append("</svg>")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--minutes", type=int, default=9)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--no-mixed", dest="mixed", action="store_false", help="skip the mixed scenario")
    p.add_argument("--severity", type=float, default=0.5)
    p.add_argument("--types", nargs="*", default=list(INEFFICIENCIES), help="injection types (default: all)")
    p.add_argument("--cache", type=Path, help="directory keeping each run's analysis (re-runs only re-match)")
    p.add_argument("--plot", type=Path, help="write the NUMA baseline comparison SVG here")
    p.add_argument("--json", type=Path, help="write the figures as JSON here")
    p.add_argument("--plot-drop", nargs="*", default=[], metavar="PREFIX",
                   help="what-if for --plot: leave feature columns starting with these prefixes out of the detectors")
    p.add_argument("--kb", type=Path, help="knowledge-base directory (default: the shipped entries)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = AnalyticsConfig()
    runs = []
    t0 = time.perf_counter()
    for seed in args.seeds:
        docs = [("healthy", scenario("healthy", None, args.hosts, args.minutes, seed, args.severity))]
        docs += [(typ, scenario(typ, typ, args.hosts, args.minutes, seed, args.severity)) for typ in args.types]
        if args.mixed:
            docs.append(("mixed", mixed_scenario(seed, args.severity)))
        for name, doc in docs:
            hosts, minutes = int(doc["hosts"]), int(str(doc["duration"]).rstrip("m"))
            runs.append(run_one(f"{name}-s{seed}-h{hosts}-m{minutes}-v{args.severity}", doc, args.cache, config))
            log.info("%s seed %d: %d findings (%.0f s)", name, seed, runs[-1].findings.height,
                     time.perf_counter() - t0)
    out: dict[str, Any] = {}
    for spec in SPECS:
        res = evaluate_runs(runs, spec, kb_path=args.kb)
        out[spec] = res
        title = {"vote2": "statistical only (vote 2 of Z, IF, Maha), with warm-up",
                 "KB": "knowledge-base signature detector alone",
                 "vote2∨KB": "the sweep's default: vote2 (with warm-up) OR knowledge-base signature"}[spec]
        print(f"\n## {spec}: {title}; seeds {' '.join(map(str, args.seeds))}\n" + render(res))
    if args.json:
        def fig(res: dict[str, Any]) -> dict[str, Any]:
            o = res["overall"]
            return {"overall": {k: getattr(o, k) for k in (
                "signature_hit_rate", "signature_coverage", "detection_signature_agreement", "healthy_contamination",
                "top1_identified", "labels", "top1_rate", "unmatched_incidents", "healthy_host_hours",
                "unmatched_per_host_hour", "false_identifications")},
                "per_type": {t: {"hit_rate": m.signature_hit_rate, "coverage": m.signature_coverage,
                                 "top1": m.top1_identified, "labels": m.labels, **res["type_figures"].get(t, {})}
                             for t, m in res["per_type"].items()},
                "unmatched_clean_hosts": res["unmatched_clean_hosts"], "clean_host_hours": res["clean_host_hours"]}
        args.json.write_text(json.dumps({k: fig(v) for k, v in out.items()}, indent=2))
    if args.plot:
        numa = next((r for r in runs if r.name.startswith("gpu_nic_numa_misplacement")), None)
        if numa is None:
            print("no NUMA run: plot skipped", file=sys.stderr)
        else:
            data = baseline_scores(numa, config, tuple(args.plot_drop))
            for name, (h, f) in data.items():
                print(f"{name}: healthy median {np.median(h):.3g}, faulty median {np.median(f):.3g}, "
                      f"overlap {overlap(h, f):.2f}")
            args.plot.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.plot.with_suffix(".tmp")
            title = "GPU–NIC NUMA misplacement: window scores, healthy vs faulty"
            if args.plot_drop:
                title += f" (without {', '.join(args.plot_drop)})"
            tmp.write_text(svg_plot(data, title))
            tmp.replace(args.plot)
            print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
