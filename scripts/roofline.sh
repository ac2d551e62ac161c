#!/usr/bin/env bash
# Decode and prefill of each pipeline as a share of this machine's limits (issue #3's table):
#   decode: weight bytes read per token x tokens/s over the measured read bandwidth
#   prefill: multiply-adds of a 128-token prompt over the measured FMA peak (each run a new process's
#            first prefill, with its one-time costs; build/bin/roofline_bench --benchmark_filter=Prefill
#            also gives the prefills after it)
# Usage: scripts/roofline.sh [-m MODEL] [-r RUNS] [-n TOKENS] [-t THREADS] PIPELINE.yaml...
# (decode: TOKENS generated after "Once upon a time"; prefill: the 128-token prompt below)
# MODEL defaults to a synthetic 110m (written to /tmp once). A shared machine's bandwidth drifts by
# a third within minutes, so the probes run between the runs: each run's share is over the larger
# of the probes just before and just after it. The table gives the median share and the best one.
# Needs build/bin/{tessera,kernel_bench}.
set -euo pipefail
cd "$(dirname "$0")/.."
model="" runs=5 tokens=128 threads=2
while getopts "m:r:n:t:" opt; do
  case $opt in
    m) model=$OPTARG ;; r) runs=$OPTARG ;; n) tokens=$OPTARG ;; t) threads=$OPTARG ;;
    *) echo "usage: $0 [-m MODEL] [-r RUNS] [-n TOKENS] [-t THREADS] PIPELINE.yaml..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "$0: name at least one pipeline" >&2; exit 2; }
bin=build/bin
if [ -z "$model" ]; then
  model=/tmp/tessera-roofline-110m.gguf
  [ -f "$model" ] || "$bin/tessera" synth --preset 110m -o "$model" >/dev/null
fi
# 128 tokens (with BOS) for the synthetic vocabulary; other models report their own count.
prompt="Once upon a time there was a little girl who liked to play in the park with her dog."
prompt="$prompt $prompt $prompt $prompt Once upon a time there was a little girl who liked to play"

probe() {
  OMP_NUM_THREADS=$threads "$bin/kernel_bench" --benchmark_filter='BM_MemoryReadBandwidth|BM_FmaPeak' \
    --benchmark_min_time=0.2 --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
b = json.loads(sys.stdin.read())["benchmarks"]
best = lambda key, name: max(x[key] for x in b if x["name"].startswith(name))  # bandwidth: the faster pattern
print("PROBE", best("GB", "BM_MemoryReadBandwidth"), best("GFLOP", "BM_FmaPeak"))'
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads; model $model"
echo
echo "| pipeline | weights | bytes/token | decode tok/s median (best) | share of bandwidth median (best) | probe GB/s median | prefill GFLOP/s median (best), tokens | share of FMA peak median (best) |"
echo "|---|---|---|---|---|---|---|---|"
for p in "$@"; do
  # Decode from a short prompt (the KV cache it reads stays small next to the weights); prefill
  # of the long prompt, one token out.
  out=$(probe; for _ in $(seq "$runs"); do
    "$bin/tessera" run -m "$model" -p "$p" --format json -n "$tokens" --ignore-eos --threads "$threads" "Once upon a time"
    "$bin/tessera" run -m "$model" -p "$p" --format json -n 1 --threads "$threads" "$prompt" | sed 's/^{/P{/'
    probe
  done)
  python3 -c '
import json, statistics, sys
lines = sys.stdin.read().splitlines()
rows = [json.loads(l) for l in lines if l.startswith("{")]
prefills = [json.loads(l[1:]) for l in lines if l.startswith("P{")]
probes = [tuple(map(float, l.split()[1:])) for l in lines if l.startswith("PROBE")]
name = sys.argv[1]
# Run i lies between probes i and i+1.
bw = [max(probes[i][0], probes[i + 1][0]) for i in range(len(rows))]
peak = [max(probes[i][1], probes[i + 1][1]) for i in range(len(rows))]
med = statistics.median
dec = [r["timings"]["decode_tokens_per_s"] for r in rows]
pre = [r["timings"]["prefill_gflop_per_s"] for r in prefills]
bw_share = [100 * r["timings"]["decode_weight_gb_per_s"] / b for r, b in zip(rows, bw)]
fma_share = [100 * g / f for g, f in zip(pre, peak)]
r = rows[0]
formats = r["pipeline"].split("|")[-1].split()[0]
mb, tokens_in = r["weight_bytes_per_token"] / 1e6, prefills[0]["tokens_in"]
print(f"| {name} | {formats} | {mb:.1f} MB | {med(dec):.1f} ({max(dec):.1f}) | {med(bw_share):.0f}% ({max(bw_share):.0f}%) "
      f"| {med(bw):.1f} | {med(pre):.1f} ({max(pre):.1f}), {tokens_in} | {med(fma_share):.0f}% ({max(fma_share):.0f}%) |")
' "$(basename "$p" .yaml)" <<<"$out"
done
