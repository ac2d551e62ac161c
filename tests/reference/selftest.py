#!/usr/bin/python3
"""Self-checks of the reference pieces that the golden files do not reach.

  /usr/bin/python3 tests/reference/selftest.py [MODEL.gguf]   (default: stories260K-f32)

1. RoPE styles: llama's converter permutes q/k rows so that NORM (adjacent pairs) on the GGUF rows
   equals NEOX (half offset) on the HF rows. Undoing the permutation and running NEOX must give the
   same logits as NORM on the file.
2. YaRN with factor 1 and linear with factor 1 are the identity.
3. Linear scaling by s at positions p equals no scaling at positions p/s (checked on cos/sin).
4. Block dequantisers: Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 against a per-element reading written here.
5. Fused tensors: a synthetic phi3 file (attn_qkv, gate|up in ffn_up) and the same weights split
   into a qwen2 file (zero biases; both NEOX, same block) give the same logits; GGUF write/read.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import gguf_read  # noqa: E402
from reference_forward import Model, rope_cos_sin  # noqa: E402

failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def unpermute(w, n_head):
    """Inverse of the llama converter's permute(): GGUF row 2i+j of a head -> HF row j*hd/2 + i."""
    out_dim, in_dim = w.shape
    hd = out_dim // n_head
    return w.reshape(n_head, hd // 2, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def check_rope_styles(path):
    ref = Model(path)
    tokens = [1, 403, 407, 261, 378, 432, 383]
    want = ref.forward(tokens)
    m = Model(path)
    cfg = m.cfg
    for il in range(cfg.n_layer):
        for name, nh in (("attn_q", cfg.n_head), ("attn_k", cfg.n_head_kv)):
            key = f"blk.{il}.{name}.weight"
            m._cache[key] = unpermute(m.w(key), nh)
    m.cfg.rope_neox = True
    got = m.forward(tokens)
    expect(np.max(np.abs(got - want)) < 1e-9, f"NEOX on un-permuted q/k == NORM on the file "
           f"(max diff {np.max(np.abs(got - want)):.2e})")
    m.cfg.rope_neox = False
    bad = np.max(np.abs(m.forward(tokens) - want))
    expect(bad > 1e-3, f"NORM on un-permuted q/k differs (max diff {bad:.3f}): the test has teeth")


def check_scaling(path):
    cfg = Model(path).cfg
    pos = np.arange(40)
    c0, s0 = rope_cos_sin(cfg, pos, 10000.0, 1.0, None)
    cfg.ext_factor, cfg.n_ctx_orig = 1.0, 512
    c1, s1 = rope_cos_sin(cfg, pos, 10000.0, 1.0, None)
    expect(np.allclose(c0, c1) and np.allclose(s0, s1), "YaRN with factor 1 is the identity")
    cfg.ext_factor = 0.0
    c2, s2 = rope_cos_sin(cfg, pos * 4, 10000.0, 0.25, None)
    expect(np.allclose(c0, c2) and np.allclose(s0, s2), "linear factor 4 at 4p == none at p")
    cfg.ext_factor = 1.0
    c3, _ = rope_cos_sin(cfg, pos, 10000.0, 0.25, None)
    mscale = 1 + 0.1 * np.log(4.0)
    expect(abs(c3[0, 0] - mscale) < 1e-12, f"YaRN factor 4 scales cos/sin by 1+0.1 ln 4 = {mscale:.4f}")
    angle = np.arccos(np.clip(c3[1] / mscale, -1, 1))  # position 1: the angle of each pair
    n = cfg.n_rot
    last = 10000.0 ** (-2.0 * (n // 2 - 1) / n)
    expect(abs(angle[0] - 1.0) < 1e-9 and abs(angle[-1] - 0.25 * last) < 1e-9,
           "YaRN keeps the fastest pair (extrapolated), interpolates the slowest (x1/4)")


def per_element(raw, name):
    """Straightforward per-element decoding of the 32-element block formats."""
    _, _, bb = [v for v in gguf_read.GGML_TYPES.values() if v[0] == name][0]
    out = []
    for blk in raw.reshape(-1, bb):
        d = float(blk[0:2].view("<f2")[0])
        if name == "Q8_0":
            out += [d * float(q) for q in blk[2:34].view(np.int8)]
            continue
        if name in ("Q4_1", "Q5_1"):
            m, rest = float(blk[2:4].view("<f2")[0]), blk[4:]
        else:
            m, rest = None, blk[2:]
        if name.startswith("Q5"):
            qh, qs = int(rest[0:4].view("<u4")[0]), rest[4:20]
        else:
            qh, qs = 0, rest[0:16]
        vals = []
        for j in range(32):
            nib = (int(qs[j]) & 15) if j < 16 else (int(qs[j - 16]) >> 4)
            if name.startswith("Q5"):
                nib |= ((qh >> j) & 1) << 4
            if m is not None:
                vals.append(d * nib + m)
            else:
                vals.append(d * (nib - (16 if name.startswith("Q5") else 8)))
        out += vals
    return np.array(out, dtype=np.float64)


def check_dequant():
    rng = np.random.default_rng(7)
    for name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        tid = [k for k, v in gguf_read.GGML_TYPES.items() if v[0] == name][0]
        bb = gguf_read.GGML_TYPES[tid][2]
        raw = rng.integers(0, 256, size=4 * bb, dtype=np.uint8)
        for b in range(4):  # sane f16 scales (random bytes could be NaN/inf)
            raw[b * bb:b * bb + 2] = np.array([0.01 * (b + 1)], dtype="<f2").view(np.uint8)
            if name in ("Q4_1", "Q5_1"):
                raw[b * bb + 2:b * bb + 4] = np.array([-0.5], dtype="<f2").view(np.uint8)
        got = gguf_read.dequantize(raw, tid, 128).astype(np.float64)
        want = per_element(raw, name)
        expect(np.allclose(got, want, rtol=1e-6, atol=1e-6), f"{name} block dequantisation")


def check_fused(tmpdir="/tmp"):
    import make_synthetic as ms
    kv, tensors = ms.build("phi3", seed=3)
    p_phi3 = os.path.join(tmpdir, "reference_selftest_phi3.gguf")
    ms.write_gguf(p_phi3, kv, tensors)
    kv2 = [(k.replace("phi3.", "qwen2.", 1), t, ("qwen2" if k == "general.architecture" else v))
           for k, t, v in kv]
    n_embd, n_head, n_kv, n_ff, hd = 32, 4, 2, 48, 8
    t2 = []
    for name, arr, dt in tensors:
        if name.endswith("attn_qkv.weight"):
            p = name[:-len("attn_qkv.weight")]
            q, k, v = np.split(arr, [n_head * hd, n_head * hd + n_kv * hd])
            t2 += [(p + "attn_q.weight", q, dt), (p + "attn_k.weight", k, dt), (p + "attn_v.weight", v, dt)]
            t2 += [(p + "attn_q.bias", np.zeros(n_head * hd, np.float32), "F32"),
                   (p + "attn_k.bias", np.zeros(n_kv * hd, np.float32), "F32"),
                   (p + "attn_v.bias", np.zeros(n_kv * hd, np.float32), "F32")]
        elif name.endswith("ffn_up.weight"):
            p = name[:-len("ffn_up.weight")]
            t2 += [(p + "ffn_gate.weight", arr[:n_ff], dt), (p + "ffn_up.weight", arr[n_ff:], dt)]
        else:
            t2.append((name, arr, dt))
    p_qwen2 = os.path.join(tmpdir, "reference_selftest_qwen2.gguf")
    ms.write_gguf(p_qwen2, kv2, t2)
    tokens = [1, 5, 9, 20, 33, 40, 7, 8]
    a, b = Model(p_phi3).forward(tokens), Model(p_qwen2).forward(tokens)
    expect(np.max(np.abs(a - b)) < 1e-9, f"phi3 fused qkv/gate|up == split qwen2 (max diff {np.max(np.abs(a - b)):.2e})")
    os.remove(p_phi3)
    os.remove(p_qwen2)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/models/stories260K/stories260K-f32.gguf"
    check_rope_styles(path)
    check_scaling(path)
    check_dequant()
    check_fused()
    print("all self-checks passed" if not failures else f"{len(failures)} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
