"""Independent NumPy quantizers for the GGUF block types, as ggml's reference quantizers define them.

Written from ggml's quantization algorithms (ggml-quants.c: quantize_row_*_ref, make_qkx2_quants,
make_q3_quants, make_qx_quants, quantize_row_iq4_nl_impl with no importance matrix, i.e. what
llama-quantize writes without --imatrix), not from Tessera's code. `quantize(name, x)` turns a
float32 array (a whole number of blocks) into the bytes of that type; gguf_read.dequantize turns
them back.

Bit-identity with a C implementation needs its float32 rounding operation by operation: every
value here is float32 (scalars too), products keep C's left-to-right order (w*l*l is (w*l)*l) and
every sum runs in element order (np.add.accumulate, not np.sum's pairwise sum). Work is vectorised
across blocks; loops run only over positions within a block and over the scale searches.

One deliberate difference from ggml: a k-quant super-block scale (d, dmin) past fp16's range is
stored as 65504 where ggml would store inf (a file llama.cpp's validation refuses anyway).
"""
import numpy as np

F = np.float32
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32)
# Level j is taken once 2x reaches values[j-1] + values[j] (ties go up), compared exactly.
_IQ4_THRESHOLDS = (IQ4NL_VALUES[:-1] + IQ4NL_VALUES[1:]).astype(F)
GROUP_MAX_EPS = F(1e-15)

# name -> (elements per block, bytes per block)
BLOCKS = {
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
    "IQ4_NL": (32, 18), "IQ4_XS": (256, 136),
}


# ---- float32 helpers ----

def nearest_int(v):
    """ggml's nearest_int: round half to even via the low mantissa bits of v + 1.5 * 2^23."""
    t = (np.asarray(v, F) + F(12582912.0)).astype(F)
    return (t.view(np.int32) & 0x007FFFFF).astype(np.int64) - 0x00400000


def seqsum(a):
    """Row sums of a 2-D float32 array accumulated left to right, as a C loop does."""
    return np.add.accumulate(a.astype(F, copy=False), axis=1, dtype=F)[:, -1]


def fp16_bytes(v):
    return np.asarray(v, F).astype(np.float16).view(np.uint8).reshape(-1, 2)


def fp16_value(v):
    return np.asarray(v, F).astype(np.float16).astype(F)


def super_fp16(v):
    """A k-quant super-block scale as fp16, a finite value past the range clipped to 65504."""
    v = np.asarray(v, F)
    h = v.astype(np.float16)
    return np.where(np.isinf(h) & np.isfinite(v), np.copysign(np.float16(65504), h), h).astype(np.float16)


def safe_recip(d):
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F(1) / np.where(d != 0, d, F(1)), F(0)).astype(F)


def signed_max(x):
    """Per row: the first element of largest magnitude (with its sign) and that magnitude."""
    i = np.argmax(np.abs(x), axis=1)
    m = x[np.arange(x.shape[0]), i]
    return m, np.abs(m)


def trunc_int(v):
    """C's float -> integer conversion (toward zero)."""
    return np.trunc(v).astype(np.int64)


def round_half_away(v):
    """roundf: halves away from zero (v - trunc(v) is exact)."""
    t = np.trunc(v)
    frac = v - t
    return (t + (frac >= F(0.5)) - (frac <= F(-0.5))).astype(np.int64)


def pack_nibbles_32(q):
    """(nb, 32) levels -> (nb, 16) bytes: element j low nibble, element j + 16 high nibble."""
    return ((q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)).astype(np.uint8)


def fifth_bits_32(q):
    """(nb, 32) 5-bit levels -> (nb, 4) bytes of the u32 whose bit j is bit 4 of element j."""
    bits = ((q >> 4) & 1).astype(np.uint64) << np.arange(32, dtype=np.uint64)
    return np.bitwise_or.reduce(bits, axis=1).astype("<u4").view(np.uint8).reshape(-1, 4)


# ---- blocks of 32 ----

def _q8_0(x):
    amax = np.abs(x).max(axis=1)
    d = amax / F(127)
    q = round_half_away(x * safe_recip(d)[:, None])
    return np.concatenate([fp16_bytes(d), q.astype(np.int8).view(np.uint8)], axis=1)


def _q4_0_q5_0(x, half):
    m, _ = signed_max(x)
    d = m / F(-half)
    q = np.minimum(2 * half - 1, trunc_int(x * safe_recip(d)[:, None] + F(half + 0.5)))
    parts = [fp16_bytes(d)]
    if half == 16:
        parts.append(fifth_bits_32(q))
    return np.concatenate(parts + [pack_nibbles_32(q)], axis=1)


def _q4_1_q5_1(x, nmax):
    lo, hi = x.min(axis=1), x.max(axis=1)
    d = (hi - lo) / F(nmax)
    q = trunc_int((x - lo[:, None]) * safe_recip(d)[:, None] + F(0.5))
    if nmax == 15:
        q = np.minimum(15, q)  # Q5_1's reference has no clamp (it cannot be reached)
    parts = [fp16_bytes(d), fp16_bytes(lo)]
    if nmax == 31:
        parts.append(fifth_bits_32(q))
    return np.concatenate(parts + [pack_nibbles_32(q)], axis=1)


# ---- the k-quants' scale fits (rows are groups of 16 or 32) ----

def fit_scale_min(x, w, nmax, rmin, rdelta, nstep, use_mad):
    """make_qkx2_quants: x ~ scale*L + min, min <= 0. Returns (L, scale, -min)."""
    with np.errstate(all="ignore"):
        lo = x.min(axis=1)
        hi = x.max(axis=1)
        sum_w = seqsum(w)
        sum_x = seqsum(w * x)
        lo = np.where(lo > 0, F(0), lo).astype(F)
        flat = hi == lo

        def err(diff):
            return np.abs(diff) if use_mad else diff * diff

        iscale = F(nmax) / (hi - lo)
        scale = (F(1) / iscale).astype(F)
        L = np.clip(nearest_int(iscale[:, None] * (x - lo[:, None])), 0, nmax)
        best = seqsum(w * err(scale[:, None] * L.astype(F) + lo[:, None] - x))
        for step in range(nstep + 1):
            iscale = (F(rmin) + F(rdelta) * F(step) + F(nmax)) / (hi - lo)
            l = np.clip(nearest_int(iscale[:, None] * (x - lo[:, None])), 0, nmax)
            lf = l.astype(F)
            wl = w * lf
            sum_l, sum_l2, sum_xl = seqsum(wl), seqsum(wl * lf), seqsum(wl * x)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            pos = this_min > 0
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale).astype(F)
            this_min = np.where(pos, F(0), this_min).astype(F)
            cur = seqsum(w * err(this_scale[:, None] * lf + this_min[:, None] - x))
            better = (det > 0) & (cur < best)
            L = np.where(better[:, None], l, L)
            best = np.where(better, cur, best)
            scale = np.where(better, this_scale, scale)
            lo = np.where(better, this_min, lo)
        L = np.where(flat[:, None], 0, L)
        scale = np.where(flat, F(0), scale).astype(F)
        return L, scale, (-lo).astype(F)


def fit_symmetric_refined(x, nmax):
    """make_q3_quants (with its refinement): x ~ scale*l, l in -nmax..nmax-1, weights x^2.
    Returns (L = l + nmax, or 0 for an all-zero group; scale)."""
    with np.errstate(all="ignore"):
        m, amax = signed_max(x)
        zero = amax < GROUP_MAX_EPS
        iscale = F(-nmax) / m
        L = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        w = x * x
        Lf = L.astype(F)
        sumlx = seqsum(w * x * Lf)
        suml2 = seqsum(w * Lf * Lf)
        for _ in range(5):  # a block whose pass changed nothing would change nothing again
            for i in range(x.shape[1]):
                wi, xi, li = w[:, i], x[:, i], L[:, i].astype(F)
                slx = sumlx - wi * xi * li
                sl2 = suml2 - wi * li * li
                nl = np.clip(nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
                nlf = nl.astype(F)
                slx2 = slx + wi * xi * nlf
                sl22 = sl2 + wi * nlf * nlf
                take = (slx > 0) & (nl != L[:, i]) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                L[:, i] = np.where(take, nl, L[:, i])
                sumlx = np.where(take, slx2, sumlx).astype(F)
                suml2 = np.where(take, sl22, suml2).astype(F)
        scale = np.where(suml2 > 0, sumlx / suml2, F(0)).astype(F)
        L = np.where(zero[:, None], 0, L + nmax)
        return L, np.where(zero, F(0), scale).astype(F)


def fit_symmetric_search(x, nmax):
    """make_qx_quants with weights x^2: the best of 19 scales. Returns (L = l + nmax or 0; scale)."""
    with np.errstate(all="ignore"):
        m, amax = signed_max(x)
        zero = amax < GROUP_MAX_EPS
        w = x * x

        def sums(iscale):
            l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
            lf = l.astype(F)
            return l, seqsum(w * x * lf), seqsum(w * lf * lf)

        l, sumlx, suml2 = sums(F(-nmax) / m)
        L = l + nmax
        scale = np.where(suml2 != 0, sumlx / suml2, F(0)).astype(F)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            l, sumlx, suml2 = sums(-(F(nmax) + F(0.1) * F(step)) / m)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            L = np.where(better[:, None], l + nmax, L)
            scale = np.where(better, sumlx / suml2, scale).astype(F)
            best = np.where(better, scale * sumlx, best).astype(F)
        L = np.where(zero[:, None], 0, L)
        return L, np.where(zero, F(0), scale).astype(F)


def pack_2bit(L):
    """(nb, 256) 2-bit levels -> (nb, 64): element 128h + 32s + l in bits 2s of byte 32h + l."""
    L = L.reshape(-1, 2, 4, 32)
    out = L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)
    return out.reshape(-1, 64).astype(np.uint8)


def running_max(s):
    """Per row: the largest value if above 0, else +0 (C's `if (v > best) best = v` from 0: a -0.0
    never replaces it)."""
    m = s.max(axis=1)
    return np.where(m > 0, m, F(0)).astype(F)


def first_abs_max(s):
    """Per row: the first value of largest magnitude, 0 if all are 0 (a strict > from 0)."""
    m, _ = signed_max(s)
    return m


# ---- k-quants ----

def _q2_k(x):
    nb = x.shape[0]
    g = x.reshape(-1, 16)
    L, scales, mins = fit_scale_min(g, np.abs(g), 3, -0.5, 0.1, 15, True)
    L, scales, mins = L.reshape(nb, 256), scales.reshape(nb, 16), mins.reshape(nb, 16)
    max_scale = running_max(scales)
    max_min = running_max(mins)
    with np.errstate(all="ignore"):
        sc = np.where(max_scale[:, None] > 0, nearest_int((F(15) / max_scale)[:, None] * scales) & 0xFF, 0)
        sc |= np.where(max_min[:, None] > 0, (nearest_int((F(15) / max_min)[:, None] * mins) << 4) & 0xFF, 0)
        d = np.where(max_scale > 0, super_fp16(max_scale / F(15)), np.float16(0))
        dmin = np.where(max_min > 0, super_fp16(max_min / F(15)), np.float16(0))
        dj = d.astype(F)[:, None] * (sc & 0x0F).astype(F)
        dm = dmin.astype(F)[:, None] * (sc >> 4).astype(F)
        dj16, dm16 = np.repeat(dj, 16, axis=1), np.repeat(dm, 16, axis=1)
        requant = np.clip(nearest_int((x + dm16) / dj16), 0, 3)
    L = np.where(dj16 != 0, requant, L)
    return np.concatenate([sc.astype(np.uint8), pack_2bit(L), fp16_bytes(d), fp16_bytes(dmin)], axis=1)


def _q3_k(x):
    nb = x.shape[0]
    L, scales = fit_symmetric_refined(x.reshape(-1, 16), 4)
    L, scales = L.reshape(nb, 256), scales.reshape(nb, 16)
    max_scale = first_abs_max(scales)
    has = max_scale != 0
    with np.errstate(all="ignore"):
        iscale = F(-32) / max_scale
        ls = np.where(has[:, None], np.clip(nearest_int(iscale[:, None] * scales), -32, 31) + 32, 0)
        d = np.where(has, super_fp16(F(1) / iscale), np.float16(0))
    packed = np.zeros((nb, 12), np.int64)
    packed[:, :8] = ls[:, :8] & 0x0F
    packed[:, :8] |= (ls[:, 8:] & 0x0F) << 4
    for j in range(16):
        packed[:, 8 + j % 4] |= (ls[:, j] >> 4) << (2 * (j // 4))
    with np.errstate(all="ignore"):
        dj = np.repeat(d.astype(F)[:, None] * (ls - 32).astype(F), 16, axis=1)
        requant = np.clip(nearest_int(x / dj), -4, 3) + 4
    L = np.where(dj != 0, requant, L)
    high = L > 3
    L = np.where(high, L - 4, L)
    # Element i's high bit: bit i // 32 of mask byte i % 32.
    hmask = np.bitwise_or.reduce(high.reshape(nb, 8, 32).astype(np.int64) << np.arange(8)[None, :, None], axis=1)
    return np.concatenate([hmask.astype(np.uint8), pack_2bit(L), packed.astype(np.uint8), fp16_bytes(d)], axis=1)


def _pack_scale_min_k4(ls, lm):
    """8 six-bit scales and mins -> the 12 bytes Q4_K and Q5_K share."""
    out = np.zeros((ls.shape[0], 12), np.int64)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0x0F) | ((lm[:, 4:8] & 0x0F) << 4)
    return out.astype(np.uint8)


def _q45_k(x, nmax):
    nb = x.shape[0]
    g = x.reshape(-1, 32)
    av_x = np.sqrt(seqsum(g * g) / F(32)).astype(F)
    w = av_x[:, None] + np.abs(g)
    rmin, nstep = (-1.0, 20) if nmax == 15 else (-0.5, 15)
    L, scales, mins = fit_scale_min(g, w, nmax, rmin, 0.1, nstep, False)
    L, scales, mins = L.reshape(nb, 256), scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale = running_max(scales)
    max_min = running_max(mins)
    with np.errstate(all="ignore"):
        inv_scale = np.where(max_scale > 0, F(63) / max_scale, F(0)).astype(F)
        inv_min = np.where(max_min > 0, F(63) / max_min, F(0)).astype(F)
    ls = np.minimum(63, nearest_int(inv_scale[:, None] * scales) & 0xFF)
    lm = np.minimum(63, nearest_int(inv_min[:, None] * mins) & 0xFF)
    d, dmin = super_fp16(max_scale / F(63)), super_fp16(max_min / F(63))
    dj = np.repeat(d.astype(F)[:, None] * ls.astype(F), 32, axis=1)
    dm = np.repeat(dmin.astype(F)[:, None] * lm.astype(F), 32, axis=1)
    with np.errstate(all="ignore"):
        requant = np.clip(nearest_int((x + dm) / dj), 0, nmax)
    L = np.where(dj != 0, requant, L).reshape(nb, 4, 2, 32)  # chunk c: sub-blocks 2c, 2c + 1
    qs = ((L[:, :, 0] & 0x0F) | ((L[:, :, 1] & 0x0F) << 4)).reshape(nb, 128).astype(np.uint8)
    parts = [fp16_bytes(d), fp16_bytes(dmin), _pack_scale_min_k4(ls, lm)]
    if nmax == 31:  # fifth bit of sub-block j's element l: bit j of qh byte l
        hi = (L.reshape(nb, 8, 32) >> 4) & 1
        parts.append(np.bitwise_or.reduce(hi << np.arange(8)[None, :, None], axis=1).astype(np.uint8))
    return np.concatenate(parts + [qs], axis=1)


def _q6_k(x):
    nb = x.shape[0]
    L, scales = fit_symmetric_search(x.reshape(-1, 16), 32)
    L, scales = L.reshape(nb, 256), scales.reshape(nb, 16)
    max_scale = first_abs_max(scales)
    zero = np.abs(max_scale) < GROUP_MAX_EPS
    with np.errstate(all="ignore"):
        iscale = F(-128) / max_scale
        d = super_fp16(F(1) / iscale)
        sc = np.minimum(127, nearest_int(iscale[:, None] * scales))
        dj = np.repeat(d.astype(F)[:, None] * sc.astype(F), 16, axis=1)
        requant = np.clip(nearest_int(x / dj), -32, 31) + 32
    L = np.where(dj != 0, requant, L).reshape(nb, 2, 4, 32)  # half h, quarter k, l
    ql = np.concatenate([(L[:, :, 0] & 0x0F) | ((L[:, :, 2] & 0x0F) << 4),
                         (L[:, :, 1] & 0x0F) | ((L[:, :, 3] & 0x0F) << 4)], axis=2).reshape(nb, 128)
    qh = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6))
    out = np.concatenate([ql.astype(np.uint8), qh.reshape(nb, 64).astype(np.uint8),
                          sc.astype(np.int8).view(np.uint8), fp16_bytes(d)], axis=1)
    out[zero] = 0
    return out


# ---- IQ4 ----

def iq4_level(v):
    """Index of the table level nearest v, ties up (exact comparison of 2v with neighbour sums)."""
    v = np.asarray(v, F)
    return np.searchsorted(_IQ4_THRESHOLDS, v + v, side="right")


def iq4_block_scale(x):
    """Rows of 32 -> the best scale over 15 starting points (weights x^2); 0 for an all-zero row."""
    with np.errstate(all="ignore"):
        m, amax = signed_max(x)
        zero = amax < GROUP_MAX_EPS
        w = x * x

        def fit(iscale):
            q = IQ4NL_VALUES[iq4_level(iscale[:, None] * x)].astype(F)
            wq = w * q
            return seqsum(wq * x), seqsum(wq * q)

        d0 = -m / F(-127)
        sumqx, sumq2 = fit(F(1) / d0)
        d = np.where(sumq2 > 0, sumqx / sumq2, F(0)).astype(F)
        best = d * sumqx
        for t in range(-7, 8):
            sumqx, sumq2 = fit(F(t - 127) / m)
            better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            d = np.where(better, sumqx / sumq2, d).astype(F)
            best = np.where(better, d * sumqx, best).astype(F)
        return np.where(zero, F(0), d).astype(F)


def _iq4_nl(x):
    d = iq4_block_scale(x)
    q = iq4_level(safe_recip(d)[:, None] * x)
    return np.concatenate([fp16_bytes(d), pack_nibbles_32(q)], axis=1)


def _iq4_xs(x):
    nb = x.shape[0]
    g = x.reshape(-1, 32)
    scales = iq4_block_scale(g).reshape(nb, 8)
    d = -first_abs_max(scales) / F(32)
    l = np.clip(nearest_int(safe_recip(d)[:, None] * scales), -32, 31)
    dl = (d[:, None] * l.astype(F)).reshape(-1)
    q = iq4_level(safe_recip(dl)[:, None] * g)
    ls = l + 32
    low = (ls[:, 0::2] & 0x0F) | ((ls[:, 1::2] & 0x0F) << 4)
    high = np.bitwise_or.reduce((ls >> 4) << (2 * np.arange(8)), axis=1).astype("<u2").view(np.uint8).reshape(nb, 2)
    return np.concatenate([fp16_bytes(d), high, low.astype(np.uint8), pack_nibbles_32(q).reshape(nb, 128)], axis=1)


_QUANTIZERS = {
    "Q8_0": _q8_0,
    "Q4_0": lambda x: _q4_0_q5_0(x, 8), "Q5_0": lambda x: _q4_0_q5_0(x, 16),
    "Q4_1": lambda x: _q4_1_q5_1(x, 15), "Q5_1": lambda x: _q4_1_q5_1(x, 31),
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": lambda x: _q45_k(x, 15), "Q5_K": lambda x: _q45_k(x, 31),
    "Q6_K": _q6_k, "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs,
}


def quantize(name, x):
    """Flat uint8 bytes of float32 values x (any shape, a whole number of blocks) in type `name`."""
    if name not in _QUANTIZERS:
        raise ValueError(f"no reference quantizer for {name} (have {', '.join(_QUANTIZERS)})")
    block, nbytes = BLOCKS[name]
    x = np.ascontiguousarray(x, F).reshape(-1)
    if x.size % block:
        raise ValueError(f"{x.size} values are not a whole number of {name} blocks of {block}")
    out = _QUANTIZERS[name](x.reshape(-1, block))
    assert out.shape == (x.size // block, nbytes), (name, out.shape)
    return out.astype(np.uint8).reshape(-1)
