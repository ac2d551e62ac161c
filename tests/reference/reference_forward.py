"""Reference (float64, NumPy) forward pass over GGUF models, independent of Tessera.

Architectures: llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3. The semantics follow
llama.cpp's reading of the GGUF keys and tensors; see tests/reference/ARCHITECTURES.md for every
formula and its source. Full recompute for every call: meant for tiny models and tests.
"""
import math

import numpy as np

from gguf_read import GGUFError, GGUFFile

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3")
# llama.cpp's llama_model_rope_type(): NORM rotates adjacent pairs (2i, 2i+1), NEOX pairs (i, i+n/2).
ROPE_NEOX = {"qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3"}
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # llama.cpp's defaults (cparams.yarn_beta_fast/slow)


class Config:
    """Hyper-parameters read from the GGUF metadata (names as llama.cpp's gguf-py writes them)."""

    def __init__(self, g):
        arch = g.get("general.architecture")
        if arch not in SUPPORTED:
            raise GGUFError(f"{g.path}: architecture {arch!r} is not supported by the reference "
                            f"(supported: {', '.join(SUPPORTED)})")
        self.arch = arch
        a = arch + "."

        def req(key):
            if a + key not in g.kv:
                raise GGUFError(f"{g.path}: key '{a + key}' is missing")
            return g.kv[a + key]

        def opt(key, default):
            return g.kv.get(a + key, default)

        self.n_embd = int(req("embedding_length"))
        self.n_layer = int(req("block_count"))
        self.n_ff = int(req("feed_forward_length"))
        self.n_head = int(req("attention.head_count"))
        self.n_head_kv = int(opt("attention.head_count_kv", self.n_head))
        self.n_ctx_train = int(opt("context_length", 0))
        self.head_k = int(opt("attention.key_length", self.n_embd // self.n_head))
        self.head_v = int(opt("attention.value_length", self.head_k))
        self.eps = float(opt("attention.layer_norm_rms_epsilon", 1e-5))
        self.n_rot = int(opt("rope.dimension_count", self.head_k))
        self.freq_base = float(opt("rope.freq_base", 10000.0))
        self.rope_neox = arch in ROPE_NEOX

        # RoPE scaling, as llama.cpp's llama_model_loader / llama_context read it.
        stype = opt("rope.scaling.type", None)
        factor = float(opt("rope.scaling.factor", 0.0) or opt("rope.scale_linear", 0.0) or 0.0)
        if stype is None:
            stype = "linear" if factor not in (0.0, 1.0) else "none"
        if stype not in ("none", "linear", "yarn"):
            raise GGUFError(f"{g.path}: {a}rope.scaling.type = {stype!r} is not supported by the reference")
        self.rope_scaling = stype
        self.freq_scale = 1.0 if stype == "none" or factor == 0.0 else 1.0 / factor
        self.n_ctx_orig = int(opt("rope.scaling.original_context_length", self.n_ctx_train))
        self.ext_factor = 1.0 if stype == "yarn" else 0.0
        self.attn_factor = float(opt("rope.scaling.attn_factor", 1.0))
        self.rope_freqs = "rope_freqs.weight" in g.tensors
        for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
            if name in g.tensors:
                raise GGUFError(f"{g.path}: LongRoPE ('{name}') is not implemented in the reference")

        # Sliding window and per-layer RoPE base (gemma2/gemma3/mistral).
        self.n_swa = int(opt("attention.sliding_window", 0) or 0)
        self.swa_layers = [False] * self.n_layer
        self.freq_base_swa = float(opt("rope.freq_base_swa", self.freq_base))
        self.freq_scale_swa = self.freq_scale
        if arch == "mistral" and self.n_swa > 0:
            self.swa_layers = [True] * self.n_layer
        elif arch in ("gemma2", "gemma3"):
            if arch == "gemma2" and self.n_swa == 0:
                self.n_swa = 4096  # llama.cpp's default for gemma2
            pattern = opt("attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
            if self.n_swa > 0:
                if isinstance(pattern, list):  # per-layer flags
                    self.swa_layers = [bool(x) for x in pattern][:self.n_layer]
                else:  # llama_hparams::set_swa_pattern(n): layer il is local iff il % n < n - 1
                    p = int(pattern)
                    self.swa_layers = [p == 0 or il % p < p - 1 for il in range(self.n_layer)]
            if arch == "gemma3":  # local layers: base 10000 (or rope.freq_base_swa), never scaled
                self.freq_base_swa = float(opt("rope.freq_base_swa", 10000.0))
                self.freq_scale_swa = 1.0
        # phi3: llama.cpp reads attention.sliding_window but disables SWA (PR #13676).

        # Gemma specifics.
        self.embd_scale = math.sqrt(self.n_embd) if arch.startswith("gemma") else 1.0
        self.attn_softcap = float(opt("attn_logit_softcapping", 50.0)) if arch == "gemma2" else 0.0
        if arch == "gemma2":
            self.final_softcap = float(opt("final_logit_softcapping", 30.0))
        elif arch == "gemma3":
            self.final_softcap = float(opt("final_logit_softcapping", 0.0))
        else:
            self.final_softcap = 0.0
        # Attention scale: 1/sqrt(head size), except gemma2/gemma3 27B (llama.cpp picks it by the layer
        # count: 46 resp. 62 layers -> 1/sqrt(n_embd/n_head), i.e. query_pre_attn_scalar = 144/168).
        self.attn_scale = 1.0 / math.sqrt(self.head_k)
        if (arch, self.n_layer) in (("gemma2", 46), ("gemma3", 62)):
            self.attn_scale = 1.0 / math.sqrt(self.n_embd // self.n_head)
        self.act = "gelu" if arch.startswith("gemma") else "silu"


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope_cos_sin(cfg, positions, base, freq_scale, freq_factors):
    """cos/sin of shape (n_tokens, n_rot/2), as ggml_rope_ext computes them (YaRN included)."""
    n_dims = cfg.n_rot
    i = np.arange(n_dims // 2, dtype=np.float64)
    theta_extrap = positions[:, None].astype(np.float64) * base ** (-2.0 * i / n_dims)
    if freq_factors is not None:
        theta_extrap = theta_extrap / freq_factors[None, :]
    theta_interp = freq_scale * theta_extrap
    mscale = cfg.attn_factor
    if cfg.ext_factor != 0.0:
        def corr_dim(n_rot):
            return n_dims * math.log(cfg.n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
        low = max(0.0, math.floor(corr_dim(YARN_BETA_FAST)))
        high = min(n_dims - 1.0, math.ceil(corr_dim(YARN_BETA_SLOW)))
        ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
        mix = ramp * cfg.ext_factor
        theta = theta_interp * (1 - mix) + theta_extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    else:
        theta = theta_interp
    return np.cos(theta) * mscale, np.sin(theta) * mscale


def apply_rope(x, cos, sin, n_rot, neox):
    """x: (n_tokens, n_heads, head_dim); rotates the first n_rot dims of each head."""
    out = x.copy()
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:
        h = n_rot // 2
        x0, x1 = x[..., :h], x[..., h:n_rot]
        out[..., :h] = x0 * c - x1 * s
        out[..., h:n_rot] = x0 * s + x1 * c
    else:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * c - x1 * s
        out[..., 1:n_rot:2] = x0 * s + x1 * c
    return out


class Model:
    def __init__(self, path):
        self.g = GGUFFile(path)
        self.cfg = Config(self.g)
        self._cache = {}
        emb = self.g.tensors.get("token_embd.weight")
        if emb is None:
            raise GGUFError(f"{path}: tensor 'token_embd.weight' is missing")
        self.n_vocab = emb.ne[1]
        # gemma and gemma2 always use token_embd as the output in llama.cpp; the others fall back to
        # it only when output.weight is absent (tied embeddings).
        tied = self.cfg.arch in ("gemma", "gemma2") or "output.weight" not in self.g.tensors
        self.output_name = "token_embd.weight" if tied else "output.weight"

    def w(self, name):
        if name not in self._cache:
            self._cache[name] = self.g.tensor(name, np.float64)
        return self._cache[name]

    def has(self, name):
        return name in self.g.tensors

    def linear(self, x, name):
        """x @ W^T (+ bias): W is stored ne=[in, out], i.e. (out, in) here."""
        y = x @ self.w(name + ".weight").T
        if self.has(name + ".bias"):
            y = y + self.w(name + ".bias")
        return y

    def attention(self, il, x, positions):
        cfg, p = self.cfg, f"blk.{il}."
        T = x.shape[0]
        nq, nkv, hk, hv = cfg.n_head, cfg.n_head_kv, cfg.head_k, cfg.head_v
        if self.has(p + "attn_qkv.weight"):  # phi3: fused rows [q | k | v]
            qkv = self.linear(x, p + "attn_qkv")
            q = qkv[:, :nq * hk]
            k = qkv[:, nq * hk:nq * hk + nkv * hk]
            v = qkv[:, nq * hk + nkv * hk:]
        else:
            q = self.linear(x, p + "attn_q")
            k = self.linear(x, p + "attn_k")
            v = self.linear(x, p + "attn_v")
        q = q.reshape(T, nq, hk)
        k = k.reshape(T, nkv, hk)
        v = v.reshape(T, nkv, hv)
        if self.has(p + "attn_q_norm.weight"):  # qwen3, gemma3: per-head RMSNorm before RoPE
            q = rms_norm(q, self.w(p + "attn_q_norm.weight"), cfg.eps)
        if self.has(p + "attn_k_norm.weight"):
            k = rms_norm(k, self.w(p + "attn_k_norm.weight"), cfg.eps)
        swa = cfg.swa_layers[il]
        base = cfg.freq_base_swa if swa else cfg.freq_base
        fscale = cfg.freq_scale_swa if swa else cfg.freq_scale
        ff = self.w("rope_freqs.weight") if cfg.rope_freqs else None
        cos, sin = rope_cos_sin(cfg, positions, base, fscale, ff)
        q = apply_rope(q, cos, sin, cfg.n_rot, cfg.rope_neox)
        k = apply_rope(k, cos, sin, cfg.n_rot, cfg.rope_neox)

        group = nq // nkv
        kk = np.repeat(k, group, axis=1)  # query head h reads kv head h // group
        vv = np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q * cfg.attn_scale, kk)
        if cfg.attn_softcap > 0:
            scores = cfg.attn_softcap * np.tanh(scores / cfg.attn_softcap)
        qp, kp = positions[:, None], positions[None, :]
        masked = kp > qp
        if swa and cfg.n_swa > 0:
            masked = masked | (qp - kp >= cfg.n_swa)  # llama.cpp: masked iff p1 - p0 >= n_swa
        scores = np.where(masked[None], -np.inf, scores)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = np.einsum("hqk,khd->qhd", probs, vv).reshape(T, nq * hv)
        return self.linear(out, p + "attn_output")

    def ffn(self, il, x):
        p = f"blk.{il}."
        if self.has(p + "ffn_gate.weight"):
            gate = self.linear(x, p + "ffn_gate")
            up = self.linear(x, p + "ffn_up")
        else:  # phi3: ffn_up holds [gate | up] (ne1 = 2*n_ff), gate first
            gu = self.linear(x, p + "ffn_up")
            gate, up = gu[:, :self.cfg.n_ff], gu[:, self.cfg.n_ff:]
        act = gelu_tanh(gate) if self.cfg.act == "gelu" else silu(gate)
        return self.linear(act * up, p + "ffn_down")

    def forward(self, tokens):
        """Logits (n_tokens, n_vocab), float64, for a sequence starting at position 0."""
        cfg = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.size == 0:
            raise ValueError("no tokens")
        if tokens.min() < 0 or tokens.max() >= self.n_vocab:
            raise ValueError(f"token id out of range 0..{self.n_vocab - 1}")
        positions = np.arange(len(tokens))
        x = self.w("token_embd.weight")[tokens] * cfg.embd_scale
        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            h = rms_norm(x, self.w(p + "attn_norm.weight"), cfg.eps)
            a = self.attention(il, h, positions)
            if self.has(p + "post_attention_norm.weight"):  # gemma2/gemma3
                a = rms_norm(a, self.w(p + "post_attention_norm.weight"), cfg.eps)
            x = x + a
            h = rms_norm(x, self.w(p + "ffn_norm.weight"), cfg.eps)
            f = self.ffn(il, h)
            if self.has(p + "post_ffw_norm.weight"):
                f = rms_norm(f, self.w(p + "post_ffw_norm.weight"), cfg.eps)
            x = x + f
        x = rms_norm(x, self.w("output_norm.weight"), cfg.eps)
        logits = x @ self.w(self.output_name).T
        if self.has("output.bias") and self.output_name == "output.weight":
            logits = logits + self.w("output.bias")
        if cfg.final_softcap > 0:
            logits = cfg.final_softcap * np.tanh(logits / cfg.final_softcap)
        return logits

    def greedy(self, tokens, n, eos=None):
        """n greedy tokens after tokens (full recompute each step); stops after eos if given."""
        seq = list(tokens)
        out = []
        for _ in range(n):
            t = int(np.argmax(self.forward(seq)[-1]))
            out.append(t)
            seq.append(t)
            if eos is not None and t == eos:
                break
        return out


def log_softmax(logits):
    m = logits.max(axis=-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
