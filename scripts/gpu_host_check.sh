#!/usr/bin/env bash
# Records a real GPU host for Unveil, on a machine with an NVIDIA GPU and PyTorch:
#   1. NVML recordings (ReplayNvml format) idle and under load ($OUT/nvml-{idle,load}.json, as in
#      tests/data/nvml/);
#   2. the real cost of GpuCollector.collect() per tick and of each NVML query;
#   3. the real agent on this host for AGENT_S seconds: idle, then a PyTorch load (bf16
#      matrix products and pinned host-to-device copies), then idle again; the lake is tarred.
# Nothing on the GPU is reconfigured: it only reads NVML and runs a workload.
# Usage: OUT=dir [STEPS=cost,agent] scripts/gpu_host_check.sh
#        (PYTHONPATH must reach the project's dependencies)
set -u
OUT=${OUT:?set OUT to a folder for the results}
AGENT_S=${AGENT_S:-300}
IDLE_S=${IDLE_S:-60}
LOAD_S=${LOAD_S:-150}
STEPS=${STEPS:-cost,agent}
export PYTHONUNBUFFERED=1
PY=${PY:-python3}

date -u +%FT%TZ
nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1 || echo "nvidia-smi failed"
$PY - <<'EOF'
import polars, pyarrow, pynvml, psutil, sys
print("python", sys.version.split()[0], "polars", polars.__version__, "pyarrow", pyarrow.__version__,
      "cpus", psutil.cpu_count())
EOF

# 2. collector cost on the real NVML (before the agent holds its own session)
[[ $STEPS == *cost* ]] && $PY - <<'EOF' 2>&1 | tee "$OUT/nvml_cost.txt"
import statistics, time
import pynvml
from ingest.collectors.gpu import GpuCollector, STATIC_QUERIES, TICK_QUERIES
per_call: dict[str, list[float]] = {}
for name in dir(pynvml):
    if name.startswith("nvmlDevice") or name.startswith("nvmlEventSet"):
        fn = getattr(pynvml, name)
        if callable(fn):
            def timed(*a, _fn=fn, _n=name, **k):
                t = time.perf_counter()
                try:
                    return _fn(*a, **k)
                finally:
                    per_call.setdefault(_n, []).append(time.perf_counter() - t)
            setattr(pynvml, name, timed)
for kw in ({"polled_every": 1}, {}):  # every query every tick, then the defaults
    col = GpuCollector(**kw)
    per_call.clear()
    ticks = []
    for _ in range(300):
        t = time.perf_counter()
        col.collect()
        ticks.append(time.perf_counter() - t)
        time.sleep(0.01)
    col.close()
    ticks.sort()
    print(f"GpuCollector({kw}).collect() over {len(ticks)} ticks: mean {statistics.mean(ticks)*1e3:.2f} ms, "
          f"median {statistics.median(ticks)*1e3:.2f} ms, p90 {ticks[int(.9*len(ticks))]*1e3:.2f} ms, "
          f"max {ticks[-1]*1e3:.2f} ms")
    for name, ts in sorted(per_call.items(), key=lambda kv: -sum(kv[1])):
        ts.sort()
        print(f"  {name:48s} calls {len(ts):5d}  median {statistics.median(ts)*1e6:9.1f} us  max {ts[-1]*1e6:9.1f} us")
EOF

[[ $STEPS == *agent* ]] || exit 0
# 1. NVML recording, idle
$PY -c "from ingest.collectors.gpu import record_nvml; record_nvml('$OUT/nvml-idle.json', ticks=20, interval_s=0.1)" \
    || echo "record_nvml idle failed"

# 3. the agent, with a load in the middle
mkdir -p /tmp/gpucheck/lake
$PY -m jobs.cli agent --lake /tmp/gpucheck/lake --duration "$AGENT_S" --commit-interval 30 \
    >"$OUT/agent.log" 2>&1 &
agent=$!
sleep "$IDLE_S"
date -u +"load start %FT%TZ" | tee -a "$OUT/phases.txt"
$PY - "$LOAD_S" <<'EOF' &
import sys, time
import torch
end = time.time() + float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
host = torch.empty(512 * 2**20 // 2, dtype=torch.bfloat16).pin_memory()
n = 0
while time.time() < end:
    for _ in range(20):
        c = a @ b
    d = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    n += 1
print(f"load: {n} rounds of 20 bf16 8192^3 products + 512 MiB H2D copy")
EOF
load=$!
sleep $((LOAD_S / 2))
$PY -c "from ingest.collectors.gpu import record_nvml; record_nvml('$OUT/nvml-load.json', ticks=20, interval_s=0.1)" \
    || echo "record_nvml load failed"
wait "$load"
date -u +"load end %FT%TZ" | tee -a "$OUT/phases.txt"
wait "$agent"
echo "agent rc $?"
tail -30 "$OUT/agent.log"
tar czf "$OUT/lake.tar.gz" -C /tmp/gpucheck lake
ls -la "$OUT"
date -u +%FT%TZ
