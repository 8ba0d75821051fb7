#!/usr/bin/env bash
# Records a real GPU host for Unveil, on a machine with an NVIDIA GPU and PyTorch:
#   1. NVML recordings (ReplayNvml format) idle and under load ($OUT/nvml-{idle,load}.json, as in
#      tests/data/nvml/);
#   2. the real cost of GpuCollector.collect() per tick and of each NVML query;
#   3. the real agent on this host for AGENT_S seconds: idle, then a PyTorch load (bf16
#      matrix products and pinned host-to-device copies), then idle again; the lake is tarred;
#   4. (STEPS=train) the real agent and the real scheduler (`unveil schedule --every 60s`)
#      for TRAIN_AGENT_S seconds around a training-like PyTorch job: a DataLoader with worker
#      processes reading shards from disk, a small transformer trained in bf16, a checkpoint
#      written every CKPT_S seconds (MODEL_DIM, MODEL_LAYERS: its size); its lake (with the
#      scheduler's incidents) is tarred.
# Nothing on the GPU is reconfigured: it only reads NVML and runs a workload.
# Usage: OUT=dir [STEPS=cost,agent,train] scripts/gpu_host_check.sh
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

train_step() {
  local lake=/tmp/gpucheck/train-lake
  mkdir -p "$lake" /tmp/gpucheck/shards /tmp/gpucheck/ckpt
  $PY -m jobs.cli agent --lake "$lake" --duration "$TRAIN_AGENT_S" --commit-interval 30 \
      >"$OUT/train-agent.log" 2>&1 &
  local agent=$!
  sleep 5
  $PY -m jobs.cli schedule --lake "$lake" --every 60s --no-progress >"$OUT/train-schedule.log" 2>&1 &
  local sched=$!
  sleep "$IDLE_S"
  date -u +"train start %FT%TZ" | tee -a "$OUT/phases.txt"
  $PY - "$TRAIN_S" "$CKPT_S" <<'PYEOF'
import os, sys, time
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
end, ckpt_s = time.time() + float(sys.argv[1]), float(sys.argv[2])
shards = "/tmp/gpucheck/shards"
for i in range(64):  # 64 shards of 16 MiB of token ids, read back by the loader's workers
    np.random.default_rng(i).integers(0, 32000, 4 * 2**20, dtype=np.int32).tofile(f"{shards}/{i}.bin")
class Shards(Dataset):
    def __len__(self): return 1 << 30
    def __getitem__(self, i):
        a = np.fromfile(f"{shards}/{i % 64}.bin", dtype=np.int32, count=8 * 1024, offset=(i * 4096) % (12 * 2**20))
        return torch.from_numpy(a.astype(np.int64)).view(8, 1024)
dim, layers = int(os.environ.get("MODEL_DIM", 1024)), int(os.environ.get("MODEL_LAYERS", 8))
model = nn.Sequential(nn.Embedding(32000, dim),
                      nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 16, 4 * dim, batch_first=True), layers),
                      nn.Linear(dim, 32000)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loader = DataLoader(Shards(), batch_size=4, num_workers=6, pin_memory=True, persistent_workers=True)
steps, last = 0, time.time()
for x in loader:
    x = x.view(-1, 1024).cuda(non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    steps += 1
    if time.time() - last > ckpt_s:
        t = time.time()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, "/tmp/gpucheck/ckpt/last.pt")
        os.sync()
        last = time.time()
        print(f"checkpoint {time.strftime('%H:%M:%S', time.gmtime(t))}Z: "
              f"{os.path.getsize('/tmp/gpucheck/ckpt/last.pt') / 2**30:.2f} GiB in {last - t:.1f} s", flush=True)
    if time.time() > end:
        break
print(f"train: {steps} steps of 32 x 1023 tokens, loss {loss.item():.3f}")
PYEOF
  date -u +"train end %FT%TZ" | tee -a "$OUT/phases.txt"
  wait "$agent"
  echo "train agent rc $?"
  sleep "${TAIL_S:-70}"  # one more scheduler cycle over the last committed minute
  kill "$sched"; wait "$sched"
  tail -20 "$OUT/train-agent.log"; tail -20 "$OUT/train-schedule.log"
  tar czf "$OUT/train-lake.tar.gz" -C /tmp/gpucheck train-lake
  ls -la "$OUT"
}
if [[ $STEPS == *train* ]]; then
  TRAIN_AGENT_S=${TRAIN_AGENT_S:-480}
  TRAIN_S=${TRAIN_S:-360}
  CKPT_S=${CKPT_S:-60}
  train_step
fi

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
