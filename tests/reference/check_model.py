#!/usr/bin/python3
"""Compares Tessera with the NumPy reference forward pass on one GGUF model.

  /usr/bin/python3 tests/reference/check_model.py MODEL.gguf --tessera build/bin/tessera \
      [--prompt TEXT ...] [-n 16] [--top 20] [--tol 1e-3] [--tie-tol 1e-3] \
      [--tessera-arg=--kv-dtype=f16 ...] [--json]

Runs `tessera run --format json --temperature 0 --ignore-eos --logprobs TOP` on the prompts (one
batch), then the reference on the same token ids: the prompt ids Tessera reports, followed by the
tokens it generated (teacher forcing, so one near-tie cannot derail the rest). Reports per prompt:
  - greedy agreement: steps where Tessera's token is the reference's argmax; a step where it is not
    counts as a failure unless the reference's top-2 logit gap there is below --tie-tol;
  - max |logprob difference| over Tessera's top-TOP tokens and its chosen token at every step
    (`tessera run` reports log-softmax of the raw logits, not the logits: they are the logits less a
    per-step constant, so this is the logit difference up to that shift);
  - max |logit difference|, only where Tessera's JSON carries raw logits (a `logits` array of rows,
    one per generated token, if a --dump-logits style option adds them).
Exit status 0 when every prompt passes (greedy agreement and differences <= --tol), 1 otherwise,
2 when Tessera fails to run.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from reference_forward import Model, log_softmax  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_PROMPTS = ["Once upon a time", "Lily and Ben", "The little bird was sad because"]


def run_tessera(args):
    cmd = [args.tessera, "run", "-m", os.path.abspath(args.model), "--format", "json",
           "--temperature", "0", "--ignore-eos", "-n", str(args.n), "--logprobs", str(args.top)]
    if args.pipeline:
        cmd += ["-p", os.path.abspath(args.pipeline)]
    cmd += args.tessera_arg
    for p in args.prompt or DEFAULT_PROMPTS:
        cmd += ["--prompt", p]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, errors="replace")
    if proc.returncode != 0:
        sys.stderr.write(f"tessera failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}\n")
        sys.exit(2)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return [r for r in results if "prompt_token_ids" in r]


def compare(model, r, tie_tol):
    prompt, gen = list(r["prompt_token_ids"]), list(r["completion_token_ids"])
    rep = {"prompt": r.get("prompt"), "prompt_token_ids": prompt, "tessera_tokens": gen}
    if not gen:
        rep.update(steps=0, agree=0, failures=0, max_logprob_diff=0.0)
        return rep
    logits = model.forward(prompt + gen[:-1])[len(prompt) - 1:]  # row s predicts gen[s]
    lp = log_softmax(logits)
    agree, fails, max_lp, first_fail, near_ties = 0, 0, 0.0, None, []
    for s, tok in enumerate(gen):
        row = logits[s]
        ref_top = int(np.argmax(row))
        if ref_top == tok:
            agree += 1
        else:
            gap = float(row[ref_top] - row[tok])
            if gap < tie_tol:
                near_ties.append({"step": s, "gap": gap})
            else:
                fails += 1
                if first_fail is None:
                    first_fail = {"step": s, "tessera": tok, "reference": ref_top, "gap": gap}
        pairs = [(tok, r["logprobs"][s])] if "logprobs" in r else []
        if "top_logprobs" in r:
            pairs += [(a["token"], a["logprob"]) for a in r["top_logprobs"][s]]
        for t, v in pairs:
            max_lp = max(max_lp, abs(float(v) - float(lp[s, t])))
    rep.update(steps=len(gen), agree=agree, failures=fails, max_logprob_diff=max_lp,
               reference_greedy_after_prompt=int(np.argmax(logits[0])))
    if first_fail:
        rep["first_failure"] = first_fail
    if near_ties:
        rep["near_ties"] = near_ties
    if "logits" in r:  # raw logits, if Tessera prints them (one row per generated token)
        tl = np.asarray(r["logits"], dtype=np.float64)
        n = min(len(tl), len(logits))
        rep["max_logit_diff"] = float(np.max(np.abs(tl[:n] - logits[:n])))
    return rep


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tessera", required=True, help="path of the tessera binary")
    ap.add_argument("--pipeline", help="pipeline YAML (default: tessera's default pipeline)")
    ap.add_argument("--prompt", action="append", help="prompt text (repeatable)")
    ap.add_argument("-n", type=int, default=16, help="tokens to generate per prompt (default 16)")
    ap.add_argument("--top", type=int, default=20, help="top log-probs to compare (0..20, default 20)")
    ap.add_argument("--tol", type=float, default=1e-3, help="max allowed |logprob| (and logit) difference")
    ap.add_argument("--tie-tol", type=float, default=1e-3,
                    help="a greedy mismatch where the reference's top-2 gap is below this is a tie")
    ap.add_argument("--tessera-arg", action="append", default=[],
                    help="extra argument for `tessera run` (repeatable; write --tessera-arg=--flag=value)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args()

    model = Model(args.model)
    reports = [compare(model, r, args.tie_tol) for r in run_tessera(args)]
    ok = bool(reports)
    for rep in reports:
        rep["pass"] = (rep["failures"] == 0 and rep["max_logprob_diff"] <= args.tol
                       and rep.get("max_logit_diff", 0.0) <= args.tol)
        ok &= rep["pass"]
    if args.json:
        print(json.dumps({"model": args.model, "architecture": model.cfg.arch, "pass": ok, "prompts": reports}))
    else:
        for rep in reports:
            line = (f"{'PASS' if rep['pass'] else 'FAIL'} {rep['prompt']!r}: greedy {rep['agree']}/{rep['steps']}"
                    f", max |logprob diff| {rep['max_logprob_diff']:.3g}")
            if "max_logit_diff" in rep:
                line += f", max |logit diff| {rep['max_logit_diff']:.3g}"
            if "near_ties" in rep:
                line += f", {len(rep['near_ties'])} near-tie(s)"
            print(line)
            if "first_failure" in rep:
                print(f"     first mismatch: {rep['first_failure']}")
        print(f"{model.cfg.arch}: {'all prompts pass' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
