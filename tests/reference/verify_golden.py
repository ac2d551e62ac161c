#!/usr/bin/python3
"""Checks the reference forward pass against the golden greedy outputs in /work/shared.

  /usr/bin/python3 tests/reference/verify_golden.py [--shared /work/shared]

Golden files (produced by other engines, see their README/SOURCE):
  golden/stories260K-f32.greedy96.json, golden/stories260K-q8_0.greedy96.json (llama.cpp),
  models/stories260K/stories260K_greedy.json, models/aidreams260K/aidreams260K_greedy.json
  (pure-Python llama2.c forward pass, 256 resp. 127 tokens from BOS).
Greedy continuation stops at EOS (id 2) for the llama.cpp files and at BOS (id 1) for the llama2.c
ones, as each file's description says. Exit status 0 when every token matches.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from reference_forward import Model  # noqa: E402


def greedy_with_gap(model, prompt, n, stop):
    """Greedy tokens and the smallest top-2 logit gap seen (a near-tie makes a mismatch noise)."""
    seq, out, min_gap = list(prompt), [], float("inf")
    for _ in range(n):
        row = model.forward(seq)[-1]
        top2 = np.sort(row)[-2:]
        min_gap = min(min_gap, float(top2[1] - top2[0]))
        t = int(np.argmax(row))
        out.append(t)
        seq.append(t)
        if t == stop:
            break
    return out, min_gap


def check(label, model, prompt, expected, stop, informative=False):
    got, gap = greedy_with_gap(model, prompt, len(expected), stop)
    n_same = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    ok = got == expected
    print(f"{'OK  ' if ok else ('DIFF' if informative else 'FAIL')} {label}: {n_same}/{len(expected)} tokens agree"
          f" (min top-2 logit gap {gap:.4f})")
    if not ok:
        print(f"     expected {expected[max(0, n_same - 2):n_same + 5]} got {got[max(0, n_same - 2):n_same + 5]}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default="/work/shared")
    args = ap.parse_args()
    s = args.shared
    all_ok = True
    for q in ("f32", "q8_0"):
        model = Model(f"{s}/models/stories260K/stories260K-{q}.gguf")
        for i, case in enumerate(json.load(open(f"{s}/golden/stories260K-{q}.greedy96.json"))):
            ok = check(f"stories260K-{q} prompt {i} {case['prompt']!r}", model, case["prompt_token_ids"],
                       case["completion_token_ids"], stop=2, informative=q == "q8_0")
            all_ok &= ok or q == "q8_0"  # q8_0: llama.cpp quantises activations too (see README): DIFF is informative
    for name in ("stories260K", "aidreams260K"):
        g = json.load(open(f"{s}/models/{name}/{name}_greedy.json"))
        model = Model(f"{s}/models/{name}/{name}-f32.gguf")
        all_ok &= check(f"{name}-f32 from BOS", model, g["prompt_tokens"], g["generated_token_ids"], stop=1)
    print("all f32 golden outputs match" if all_ok else "MISMATCH")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
