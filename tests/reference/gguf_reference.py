#!/usr/bin/python3
"""Reference logits / greedy tokens of a GGUF model (NumPy, float64), independent of Tessera.

  /usr/bin/python3 tests/reference/gguf_reference.py MODEL.gguf --tokens 1,403,407 [--all]
      [--logits-out out.npy] [--json] [--top N] [--greedy N [--stop-at-eos]] [--describe]

Prints the logits of the last position (all positions with --all): a summary (argmax and the top
entries) as text, or everything as JSON with --json. --logits-out saves them as .npy (float64).
--greedy N generates N greedy tokens after --tokens (full recompute per step).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from gguf_read import GGUFError, describe  # noqa: E402
from reference_forward import Model, log_softmax  # noqa: E402


def parse_tokens(text):
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise SystemExit(f"--tokens: expected comma-separated integers, got {text!r}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", help="comma-separated token ids (default: the file's BOS id)")
    ap.add_argument("--all", action="store_true", help="logits of every position, not only the last")
    ap.add_argument("--logits-out", help="save the logits as .npy")
    ap.add_argument("--json", action="store_true", help="print JSON (logits, log-probs top, greedy)")
    ap.add_argument("--top", type=int, default=5, help="entries of the top list (default 5)")
    ap.add_argument("--greedy", type=int, default=0, metavar="N", help="generate N greedy tokens")
    ap.add_argument("--stop-at-eos", action="store_true", help="with --greedy: stop after EOS")
    ap.add_argument("--describe", action="store_true", help="print the metadata and tensors, then exit")
    args = ap.parse_args(argv)

    try:
        model = Model(args.model)
    except (GGUFError, OSError) as e:
        raise SystemExit(f"error: {e}")
    if args.describe:
        print(describe(model.g))
        return 0
    if args.tokens is not None:
        tokens = parse_tokens(args.tokens)
    else:
        tokens = [int(model.g.get("tokenizer.ggml.bos_token_id", 1))]
    if not tokens:
        raise SystemExit("--tokens: no token ids")

    try:
        logits = model.forward(tokens)
    except ValueError as e:
        raise SystemExit(f"error: --tokens: {e}")
    shown = logits if args.all else logits[-1:]
    if args.logits_out:
        np.save(args.logits_out, shown if args.all else shown[0])
    greedy = []
    if args.greedy > 0:
        eos = model.g.get("tokenizer.ggml.eos_token_id") if args.stop_at_eos else None
        greedy = model.greedy(tokens, args.greedy, eos)

    lp = log_softmax(shown)
    if args.json:
        out = {
            "model": args.model,
            "architecture": model.cfg.arch,
            "tokens": tokens,
            "positions": list(range(len(tokens))) if args.all else [len(tokens) - 1],
            "logits": shown.tolist(),
            "top_logprobs": [[{"token": int(t), "logprob": float(row[t])}
                              for t in np.argsort(-row, kind="stable")[:args.top]] for row in lp],
        }
        if args.greedy > 0:
            out["greedy"] = greedy
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    else:
        first = 0 if args.all else len(tokens) - 1
        for i, (row, lrow) in enumerate(zip(shown, lp)):
            top = np.argsort(-row, kind="stable")[:args.top]
            items = ", ".join(f"{int(t)}:{row[t]:.6f}(lp {lrow[t]:.4f})" for t in top)
            print(f"pos {first + i}: argmax {int(top[0])}  top: {items}")
        if args.greedy > 0:
            print("greedy:", ",".join(str(t) for t in greedy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
