#!/usr/bin/python3
"""Writes tiny random GGUF models of every architecture the reference knows (F32/F16 weights).

  /usr/bin/python3 tests/reference/make_synthetic.py --arch gemma2 -o /tmp/g2.gguf [--seed 1] [--f16]

For testing readers and forward passes, not for text: the vocabulary is 64 byte-ish tokens with a
llama (SentencePiece) tokenizer block so that engines that need one can load the file. Shapes:
n_embd 32, 4 heads, 2 kv heads, head size 8 (16 for gemma*, so key_length != n_embd/n_head), 3 layers
(6 for gemma3, so one is global), n_ff 48, vocab 64, context 64.
"""
import argparse
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import gguf_read as gr  # noqa: E402


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(t, v):
    if t == gr.T_STRING:
        return _str(v)
    if t == gr.T_ARRAY:
        et, items = v
        body = b"".join(_value(et, x) for x in items)
        return struct.pack("<IQ", et, len(items)) + body
    return struct.pack(gr._SCALAR[t], v)


def write_gguf(path, kv, tensors, alignment=32):
    """kv: list of (key, type, value) (arrays: (elem_type, list)); tensors: list of (name, array, 'F32'|'F16').
    Arrays are NumPy-shaped (reversed ggml dims)."""
    kv = [("general.alignment", gr.T_UINT32, alignment)] + list(kv)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, t, v in kv:
        head += _str(key) + struct.pack("<I", t) + _value(t, v)
    blobs, offset, infos = [], 0, b""
    for name, arr, dtype in tensors:
        data = np.ascontiguousarray(arr, dtype="<f4" if dtype == "F32" else "<f2").tobytes()
        ne = list(reversed(arr.shape))
        infos += _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        infos += struct.pack("<IQ", 0 if dtype == "F32" else 1, offset)
        pad = (-len(data)) % alignment
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    out = head + infos
    out += b"\0" * ((-len(out)) % alignment)
    with open(path, "wb") as f:
        f.write(out + b"".join(blobs))


def vocab_kv(n_vocab):
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(n_vocab - 3)]
    types = [2, 3, 3] + [6] * (n_vocab - 3)
    return [
        ("tokenizer.ggml.model", gr.T_STRING, "llama"),
        ("tokenizer.ggml.tokens", gr.T_ARRAY, (gr.T_STRING, toks)),
        ("tokenizer.ggml.scores", gr.T_ARRAY, (gr.T_FLOAT32, [0.0] * n_vocab)),
        ("tokenizer.ggml.token_type", gr.T_ARRAY, (gr.T_INT32, types)),
        ("tokenizer.ggml.bos_token_id", gr.T_UINT32, 1),
        ("tokenizer.ggml.eos_token_id", gr.T_UINT32, 2),
        ("tokenizer.ggml.unknown_token_id", gr.T_UINT32, 0),
    ]


def build(arch, seed=1, f16=False, n_vocab=64):
    rng = np.random.default_rng(seed)
    gemma = arch.startswith("gemma")
    n_embd, n_head, n_kv, n_ff = 32, 4, 2, 48
    hd = 16 if gemma else 8
    n_layer = 6 if arch == "gemma3" else 3
    wt = "F16" if f16 else "F32"
    a = arch + "."
    kv = [("general.architecture", gr.T_STRING, arch), ("general.name", gr.T_STRING, f"synthetic-{arch}"),
          (a + "context_length", gr.T_UINT32, 64), (a + "embedding_length", gr.T_UINT32, n_embd),
          (a + "block_count", gr.T_UINT32, n_layer), (a + "feed_forward_length", gr.T_UINT32, n_ff),
          (a + "attention.head_count", gr.T_UINT32, n_head), (a + "attention.head_count_kv", gr.T_UINT32, n_kv),
          (a + "attention.layer_norm_rms_epsilon", gr.T_FLOAT32, 1e-6 if gemma else 1e-5),
          (a + "rope.freq_base", gr.T_FLOAT32, 10000.0), (a + "rope.dimension_count", gr.T_UINT32, hd)]
    if gemma or arch == "qwen3":
        kv += [(a + "attention.key_length", gr.T_UINT32, hd), (a + "attention.value_length", gr.T_UINT32, hd)]
    if arch == "gemma2":  # small caps and window so that they matter at this scale
        kv += [(a + "attn_logit_softcapping", gr.T_FLOAT32, 5.0), (a + "final_logit_softcapping", gr.T_FLOAT32, 3.0),
               (a + "attention.sliding_window", gr.T_UINT32, 4)]
    if arch == "gemma3":
        kv += [(a + "attention.sliding_window", gr.T_UINT32, 4), (a + "rope.freq_base", gr.T_FLOAT32, 1e6)]
        kv = [x for x in kv if not (x[0] == a + "rope.freq_base" and x[2] == 10000.0)]
    if arch == "mistral":
        kv += [(a + "attention.sliding_window", gr.T_UINT32, 4)]
    kv += vocab_kv(n_vocab)

    def mat(out_dim, in_dim):
        return (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)

    def norm(n):  # gemma GGUFs store 1 + w (see ARCHITECTURES.md): keep them around 1 for all
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t = [("token_embd.weight", mat(n_vocab, n_embd) * (1.0 if not gemma else 0.2), wt),
         ("output_norm.weight", norm(n_embd), "F32")]
    if arch not in ("gemma", "gemma2", "qwen2"):  # gemma/gemma2 are always tied; qwen2 tests the fallback
        t.append(("output.weight", mat(n_vocab, n_embd), wt))
    for il in range(n_layer):
        p = f"blk.{il}."
        t.append((p + "attn_norm.weight", norm(n_embd), "F32"))
        if arch == "phi3":
            t.append((p + "attn_qkv.weight", mat(n_head * hd + 2 * n_kv * hd, n_embd), wt))
        else:
            t += [(p + "attn_q.weight", mat(n_head * hd, n_embd), wt),
                  (p + "attn_k.weight", mat(n_kv * hd, n_embd), wt),
                  (p + "attn_v.weight", mat(n_kv * hd, n_embd), wt)]
        if arch == "qwen2":
            t += [(p + "attn_q.bias", 0.1 * rng.standard_normal(n_head * hd).astype(np.float32), "F32"),
                  (p + "attn_k.bias", 0.1 * rng.standard_normal(n_kv * hd).astype(np.float32), "F32"),
                  (p + "attn_v.bias", 0.1 * rng.standard_normal(n_kv * hd).astype(np.float32), "F32")]
        if arch in ("qwen3", "gemma3"):
            t += [(p + "attn_q_norm.weight", norm(hd), "F32"), (p + "attn_k_norm.weight", norm(hd), "F32")]
        t.append((p + "attn_output.weight", mat(n_embd, n_head * hd), wt))
        if arch in ("gemma2", "gemma3"):
            t.append((p + "post_attention_norm.weight", norm(n_embd), "F32"))
        t.append((p + "ffn_norm.weight", norm(n_embd), "F32"))
        if arch == "phi3":
            t.append((p + "ffn_up.weight", mat(2 * n_ff, n_embd), wt))
        else:
            t += [(p + "ffn_gate.weight", mat(n_ff, n_embd), wt), (p + "ffn_up.weight", mat(n_ff, n_embd), wt)]
        t.append((p + "ffn_down.weight", mat(n_embd, n_ff), wt))
        if arch in ("gemma2", "gemma3"):
            t.append((p + "post_ffw_norm.weight", norm(n_embd), "F32"))
    return kv, t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True, choices=["llama", "mistral", "qwen2", "qwen3", "phi3",
                                                      "gemma", "gemma2", "gemma3"])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--f16", action="store_true", help="matrices in F16 (norms stay F32)")
    args = ap.parse_args()
    kv, tensors = build(args.arch, args.seed, args.f16)
    write_gguf(args.output, kv, tensors)
    print(f"wrote {args.output} ({args.arch}, {len(tensors)} tensors)")


if __name__ == "__main__":
    main()
