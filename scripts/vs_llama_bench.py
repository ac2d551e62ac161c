#!/usr/bin/env python3
"""Tessera against llama.cpp's llama-bench on the same GGUF files, single stream.

For each file, runs alternate A B B A ... (llama-bench, then `tessera bench` on
configs/workloads/single_stream.yaml, then the other way round), so that both see the same
moments of a shared machine; per pair, Tessera's tokens/s over llama.cpp's for prefill (128-token
prompt: llama-bench -p 128; Tessera 128 / TTFT) and decode (64 tokens: llama-bench -n 64; Tessera
1 / TPOT). Prints one markdown row per file: medians of the rates and of the per-pair ratios.

  scripts/vs_llama_bench.py --llama-bench /tmp/llama.cpp/build/bin/llama-bench \
      --tessera build/bin/tessera --threads 2 --pairs 4 /tmp/110m-q4_k.gguf ...

With --pipeline and --tessera-model, Tessera runs that pipeline on that file instead (a pipeline
that quantizes at load, e.g. pipelines/int4.yaml on an f32 file, against llama.cpp on a Q4_0 one).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def llama(args, model):
    out = subprocess.run([args.llama_bench, "-m", model, "-t", str(args.threads), "-p", "128", "-n", "64",
                          "-r", "1", "-o", "json"], check=True, capture_output=True, text=True).stdout
    rates = {}
    for row in json.loads(out):
        rates["prefill" if row["n_prompt"] > 0 else "decode"] = row["avg_ts"]
    return rates


def tessera(args, model):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([args.tessera, "bench", "--pipelines", args.pipeline, "-m", args.tessera_model or model,
                        "--workload", os.path.join(ROOT, "configs/workloads/single_stream.yaml"), "--out", out,
                        "--threads", str(args.threads), "--no-accuracy", "-q"],
                       check=True, capture_output=True, text=True)
        with open(os.path.join(out, "report.json")) as f:
            p = json.load(f)["pipelines"][0]
    lat = p["latency_ms"]
    return {"prefill": 128 / (lat["ttft"]["p50"] / 1000), "decode": 1 / (lat["tpot"]["p50"] / 1000)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--tessera", default=os.path.join(ROOT, "build/bin/tessera"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--pipeline", default=os.path.join(ROOT, "pipelines/gguf.yaml"))
    ap.add_argument("--tessera-model", help="the file Tessera runs (default: each file llama.cpp runs)")
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()
    print("| file | MB | decode tok/s (llama.cpp) | x llama.cpp decode | prefill tok/s (llama.cpp) | x llama.cpp prefill |")
    print("|---|---|---|---|---|---|")
    for model in args.models:
        ours = {"prefill": [], "decode": []}
        theirs = {"prefill": [], "decode": []}
        ratios = {"prefill": [], "decode": []}
        for pair in range(args.pairs):
            order = (llama, tessera) if pair % 2 == 0 else (tessera, llama)
            got = {f: f(args, model) for f in order}
            for k in ratios:
                ours[k].append(got[tessera][k])
                theirs[k].append(got[llama][k])
                ratios[k].append(got[tessera][k] / got[llama][k])
        med = statistics.median
        print(f"| {os.path.basename(model)} | {os.path.getsize(model) / 1e6:.0f} | "
              f"{med(ours['decode']):.1f} ({med(theirs['decode']):.1f}) | {med(ratios['decode']):.2f} | "
              f"{med(ours['prefill']):.0f} ({med(theirs['prefill']):.0f}) | {med(ratios['prefill']):.2f} |",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
