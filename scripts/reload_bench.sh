#!/usr/bin/env bash
# TTFT of a deployment while it reloads, against the same server steady: starts `tessera serve -d`
# with two variants (stable 90 / canary 10) of one model, runs `tessera bench --server` on a Poisson
# workload twice with the same seed — first steady, then with POST /admin/reload every RELOAD_EVERY
# seconds — and prints each run's TTFT P50/P95/P99 per variant and each reload's time.
#   scripts/reload_bench.sh [MODEL.gguf] [QUANTIZER]     (default: a 28M-parameter synthetic model, int8)
# Needs a build (scripts/run.sh or cmake --build build). Output and reports: $OUT (default /tmp/reload_bench).
set -euo pipefail
cd "$(dirname "$0")/.."
project=$(pwd)
bin=$project/build/bin/tessera
out=${OUT:-/tmp/reload_bench}
every=${RELOAD_EVERY:-2}
quantizer=${2:-int8}
rm -rf "$out" && mkdir -p "$out"
model=${1:-$out/model.gguf}
if [ -z "${1:-}" ]; then
  "$bin" synth --preset tiny --dim 512 --ffn 1536 --layers 8 --heads 8 --kv-heads 8 --vocab 512 --context 2048 \
    -o "$model" >/dev/null
fi

cat >"$out/stable.yaml" <<EOF
extends: $project/pipelines/paged.yaml
model: $model
backend: cpu
components:
  quantizer: { plugin: $quantizer }
EOF
printf 'extends: stable.yaml\ncomponents:\n  scheduler: { plugin: continuous, max_seqs: 8 }\n' >"$out/canary.yaml"
cat >"$out/deploy.yaml" <<EOF
server: { admin_key: bench }
models:
  - name: m
    variants:
      - { name: stable, pipeline: stable.yaml, weight: 90 }
      - { name: canary, pipeline: canary.yaml, weight: 10 }
EOF
cat >"$out/workload.yaml" <<EOF
name: reload
description: Poisson arrivals from 16 users, 32-128 prompt / 16-64 output tokens.
requests: ${REQUESTS:-160}
seed: 7
arrival: { process: poisson, rate: ${RATE:-4} }
users: { count: 16, distribution: uniform }
prompts: { source: file, path: $(cd .. && pwd)/shared/eval/tiny_stories_eval.txt }
classes:
  - { name: turn, weight: 1, prompt: [32, 128], output: [16, 64] }
EOF

"$bin" serve -d "$out/deploy.yaml" --port 0 >"$out/serve.out" 2>"$out/serve.log" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q listening "$out/serve.out" 2>/dev/null && break; sleep 0.2; done
url=$(grep -o 'http://[^ ]*' "$out/serve.out")

bench() {
  "$bin" bench --server "$url" --server-model m -m "$model" --workload "$out/workload.yaml" --out "$out/$1" \
    --no-accuracy >"$out/$1.log" 2>&1 || { cat "$out/$1.log"; exit 1; }
}
bench steady
bench reloading &
load=$!
: >"$out/reloads.txt"
while kill -0 $load 2>/dev/null; do
  sleep "$every"
  kill -0 $load 2>/dev/null || break
  curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -X POST -H 'Authorization: Bearer bench' "$url/admin/reload" \
    >>"$out/reloads.txt"
done
wait $load

/usr/bin/python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
print("conditions: 2 variants of one model, one weight load shared; reload every", open(out + "/reloads.txt").read().count("\n"), "x")
for run in ("steady", "reloading"):
    p = json.load(open(f"{out}/{run}/report.json"))["pipelines"][0]
    r = p["requests"]
    print(f"{run:9s} requests {r['total']} errors {r['errors']}  TTFT ms P50/P95/P99 "
          + "/".join(f"{p['latency_ms']['ttft'][k]:.1f}" for k in ("p50", "p95", "p99")))
    for name, v in p["variants"].items():
        t = v["latency_ms"]["ttft"]
        print(f"  {name:8s} {v['count']:4d} requests  TTFT ms P50/P95/P99 {t['p50']:.1f}/{t['p95']:.1f}/{t['p99']:.1f}")
times = [float(l.split()[1]) for l in open(out + "/reloads.txt") if l.startswith("200")]
codes = [l.split()[0] for l in open(out + "/reloads.txt") if l.strip()]
if times:
    print(f"reloads: {len(times)} of {len(codes)} answered 200, time per reload min/median/max "
          f"{min(times)*1000:.0f}/{sorted(times)[len(times)//2]*1000:.0f}/{max(times)*1000:.0f} ms")
EOF
