#!/usr/bin/env bash
# Decode and prefill of each pipeline as a share of this machine's limits (issue #3's table):
#   decode: weight bytes read per token x tokens/s over the measured read bandwidth
#   prefill: multiply-adds of a 128-token prompt over the measured FMA peak
# Usage: scripts/roofline.sh [-m MODEL] [-r RUNS] [-n TOKENS] [-t THREADS] PIPELINE.yaml...
# (decode: TOKENS generated after "Once upon a time"; prefill: the 128-token prompt below)
# MODEL defaults to a synthetic 110m (written to /tmp once). Each figure is the median of RUNS runs,
# with the best run beside it: the probes are the best of three, so on a shared machine the best run
# is the like-for-like share, the median what a user sees. Needs build/bin/{tessera,kernel_bench}.
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

probes=$(OMP_NUM_THREADS=$threads "$bin/kernel_bench" --benchmark_filter='BM_MemoryReadBandwidth|BM_FmaPeak' \
  --benchmark_repetitions=3 --benchmark_format=json 2>/dev/null)
read -r bw peak < <(python3 -c '
import json, sys
b = json.loads(sys.stdin.read())["benchmarks"]
best = lambda key, name: max(x[key] for x in b if x["name"].startswith(name) and x.get("run_type") == "iteration")
print(best("GB", "BM_MemoryReadBandwidth"), best("GFLOP", "BM_FmaPeak"))' <<<"$probes")

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads"
echo "read bandwidth ${bw%.*} GB/s, FMA peak ${peak%.*} GFLOP/s (best of 3); model $model"
echo
echo "| pipeline | weights | bytes/token | decode tok/s median (best) | share of bandwidth | prefill GFLOP/s median (best), tokens | share of FMA peak |"
echo "|---|---|---|---|---|---|---|"
for p in "$@"; do
  # Decode from a short prompt (the KV cache it reads stays small next to the weights); prefill
  # of the long prompt, one token out.
  out=$(for _ in $(seq "$runs"); do
    "$bin/tessera" run -m "$model" -p "$p" --format json -n "$tokens" --ignore-eos --threads "$threads" "Once upon a time"
    "$bin/tessera" run -m "$model" -p "$p" --format json -n 1 --threads "$threads" "$prompt" | sed 's/^{/P{/'
  done)
  python3 -c '
import json, statistics, sys
lines = sys.stdin.read().splitlines()
rows = [json.loads(l) for l in lines if l.startswith("{")]
prefills = [json.loads(l[1:]) for l in lines if l.startswith("P{")]
bw, peak, name = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
def t(k, runs=rows):
    v = [r["timings"][k] for r in runs]
    return statistics.median(v), max(v)
r = rows[0]
formats = r["pipeline"].split("|")[-1].split()[0]
dec, pre, gbs = t("decode_tokens_per_s"), t("prefill_gflop_per_s", prefills), t("decode_weight_gb_per_s")
mb, tokens_in = r["weight_bytes_per_token"] / 1e6, prefills[0]["tokens_in"]
print(f"| {name} | {formats} | {mb:.1f} MB | {dec[0]:.1f} ({dec[1]:.1f}) | {100 * gbs[0] / bw:.0f}% ({100 * gbs[1] / bw:.0f}%) "
      f"| {pre[0]:.1f} ({pre[1]:.1f}), {tokens_in} | {100 * pre[0] / peak:.0f}% ({100 * pre[1] / peak:.0f}%) |")
' "$bw" "$peak" "$(basename "$p" .yaml)" <<<"$out"
done
