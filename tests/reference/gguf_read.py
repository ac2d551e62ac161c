"""Independent GGUF (v2/v3) reader with NumPy dequantisation, for the reference forward pass.

Written from the GGUF format description (ggml docs/gguf.md): header, key/value metadata of every
type (arrays included), tensor infos, data section aligned to `general.alignment` (default 32).
Tensor dims are in ggml order: ne[0] is the fastest-varying one, so a 2-D tensor with ne=[in, out]
is returned as a NumPy array of shape (out, in) (row-major, `out` rows of `in` values).

Only /usr/bin/python3 and numpy are needed.
"""
import struct

import numpy as np

GGUF_MAGIC = b"GGUF"

# Metadata value types.
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, \
    T_UINT64, T_INT64, T_FLOAT64 = range(13)
_SCALAR = {
    T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I", T_INT32: "<i",
    T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q", T_FLOAT64: "<d",
}
_NP_SCALAR = {
    T_UINT8: "<u1", T_INT8: "<i1", T_UINT16: "<u2", T_INT16: "<i2", T_UINT32: "<u4", T_INT32: "<i4",
    T_FLOAT32: "<f4", T_BOOL: "<u1", T_UINT64: "<u8", T_INT64: "<i8", T_FLOAT64: "<f8",
}

# ggml tensor types: id -> (name, block size in elements, bytes per block).
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}
GGML_TYPES.update({20: ("IQ4_NL", 32, 18), 23: ("IQ4_XS", 256, 136)})


class GGUFError(Exception):
    pass


class _Cursor:
    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated at byte {self.pos} (wanted {n} more)")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, t):
        fmt = _SCALAR[t]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.scalar(T_UINT64)
        return bytes(self.take(n)).decode("utf-8", errors="replace")

    def value(self, t):
        if t in _SCALAR:
            return self.scalar(t)
        if t == T_STRING:
            return self.string()
        if t == T_ARRAY:
            et = self.scalar(T_UINT32)
            n = self.scalar(T_UINT64)
            if et in _NP_SCALAR:  # numeric arrays in one read
                dt = np.dtype(_NP_SCALAR[et])
                arr = np.frombuffer(self.take(n * dt.itemsize), dtype=dt)
                return [bool(x) for x in arr] if et == T_BOOL else arr.tolist()
            return [self.value(et) for _ in range(n)]
        raise GGUFError(f"{self.path}: unknown metadata value type {t} at byte {self.pos}")


class Tensor:
    def __init__(self, name, ne, type_id, offset):
        self.name, self.ne, self.type_id, self.offset = name, ne, type_id, offset
        if type_id not in GGML_TYPES:
            raise GGUFError(f"tensor '{name}': unknown ggml type {type_id}")
        self.type_name, self.block, self.block_bytes = GGML_TYPES[type_id]
        self.n_elements = int(np.prod(ne)) if ne else 1

    @property
    def nbytes(self):
        return self.n_elements // self.block * self.block_bytes

    @property
    def shape(self):  # NumPy shape: reversed ggml dims
        return tuple(reversed(self.ne))


class GGUFFile:
    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.buf = memoryview(f.read())
        c = _Cursor(self.buf, path)
        if bytes(c.take(4)) != GGUF_MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (bad magic)")
        self.version = c.scalar(T_UINT32)
        if self.version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors = c.scalar(T_UINT64)
        n_kv = c.scalar(T_UINT64)
        self.kv = {}
        for _ in range(n_kv):
            key = c.string()
            t = c.scalar(T_UINT32)
            self.kv[key] = c.value(t)
        self.tensors = {}
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.scalar(T_UINT32)
            ne = [c.scalar(T_UINT64) for _ in range(n_dims)]
            type_id = c.scalar(T_UINT32)
            offset = c.scalar(T_UINT64)
            self.tensors[name] = Tensor(name, ne, type_id, offset)
        self.alignment = int(self.kv.get("general.alignment", 32))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError(f"{path}: general.alignment = {self.alignment} is not a power of two")
        self.data_offset = (c.pos + self.alignment - 1) // self.alignment * self.alignment
        for t in self.tensors.values():
            if t.n_elements % t.block:
                raise GGUFError(f"{path}: tensor '{t.name}' has {t.n_elements} elements, "
                                f"not a multiple of the {t.type_name} block of {t.block}")
            end = self.data_offset + t.offset + t.nbytes
            if t.offset % self.alignment or end > len(self.buf):
                raise GGUFError(f"{path}: tensor '{t.name}' (offset {t.offset}, {t.nbytes} bytes) "
                                f"is misaligned or runs past the end of the file")

    def get(self, key, default=None):
        return self.kv.get(key, default)

    def raw(self, name):
        t = self.tensors[name]
        start = self.data_offset + t.offset
        return np.frombuffer(self.buf[start:start + t.nbytes], dtype=np.uint8)

    def tensor(self, name, dtype=np.float32):
        """Dequantised tensor as a NumPy array of shape reversed(ne)."""
        if name not in self.tensors:
            raise GGUFError(f"{self.path}: tensor '{name}' is missing")
        t = self.tensors[name]
        flat = dequantize(self.raw(name), t.type_id, t.n_elements)
        return flat.reshape(t.shape).astype(dtype, copy=False)


def _f16(b):
    return b.view("<f2").astype(np.float32)


def dequantize(raw, type_id, n):
    """Flat float32 array of n values from raw bytes of ggml type type_id."""
    name, block, bb = GGML_TYPES[type_id]
    if name == "F32":
        return raw.view("<f4").astype(np.float32)
    if name == "F16":
        return raw.view("<f2").astype(np.float32)
    if name == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if name == "F64":
        return raw.view("<f8").astype(np.float32)
    if name in ("I8", "I16", "I32", "I64"):
        return raw.view({"I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}[name]).astype(np.float32)
    blocks = raw.reshape(-1, bb)
    fn = _BLOCK_DEQUANT.get(name)
    if fn is None:
        raise GGUFError(f"dequantisation of {name} is not implemented in the reference reader")
    out = fn(blocks)
    assert out.size == n
    return out.reshape(-1)


def _q8_0(b):
    d = _f16(b[:, 0:2].copy())
    q = b[:, 2:34].view(np.int8).astype(np.float32)
    return d * q


def _q4_0(b):
    d = _f16(b[:, 0:2].copy())
    qs = b[:, 2:18]
    lo = (qs & 0x0F).astype(np.float32) - 8  # elements 0..15
    hi = (qs >> 4).astype(np.float32) - 8    # elements 16..31
    return d * np.concatenate([lo, hi], axis=1)


def _q4_1(b):
    d = _f16(b[:, 0:2].copy())
    m = _f16(b[:, 2:4].copy())
    qs = b[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return d * q + m


def _q5_bits(qh_bytes, qs):
    qh = qh_bytes.copy().view("<u4")  # (nb, 1)
    j = np.arange(16, dtype=np.uint32)
    h_lo = ((qh >> j) & 1).astype(np.uint8) << 4          # bit j -> element j
    h_hi = ((qh >> (j + 16)) & 1).astype(np.uint8) << 4   # bit j+16 -> element j+16
    return np.concatenate([(qs & 0x0F) | h_lo, (qs >> 4) | h_hi], axis=1).astype(np.float32)


def _q5_0(b):
    d = _f16(b[:, 0:2].copy())
    return d * (_q5_bits(b[:, 2:6], b[:, 6:22]) - 16)


def _q5_1(b):
    d = _f16(b[:, 0:2].copy())
    m = _f16(b[:, 2:4].copy())
    return d * _q5_bits(b[:, 4:8], b[:, 8:24]) + m


def _k_scale_min(s):
    """6-bit scales and mins of Q4_K/Q5_K: 12 bytes -> (8 scales, 8 mins)."""
    s = s.astype(np.uint8)
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b):
    d = _f16(b[:, 0:2].copy())
    dmin = _f16(b[:, 2:4].copy())
    sc, mn = _k_scale_min(b[:, 4:16])
    qs = b[:, 16:144].reshape(-1, 4, 32)  # 4 chunks of 32 bytes, each holds 64 values
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)  # sub-block j
    return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).reshape(-1, 256)


def _q5_k(b):
    d = _f16(b[:, 0:2].copy())
    dmin = _f16(b[:, 2:4].copy())
    sc, mn = _k_scale_min(b[:, 4:16])
    qh = b[:, 16:48]                       # 32 bytes: bit j of qh[l] is the high bit of sub-block j
    qs = b[:, 48:176].reshape(-1, 4, 32)
    lo = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)
    j = np.arange(8, dtype=np.uint8)[None, :, None]
    hi = ((qh[:, None, :] >> j) & 1) << 4
    q = (lo | hi).astype(np.float32)
    return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).reshape(-1, 256)


def _q6_k(b):
    ql = b[:, 0:128].reshape(-1, 2, 64)    # two halves of 128 values
    qh = b[:, 128:192].reshape(-1, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 2, 8)
    d = _f16(b[:, 208:210].copy())         # (nb, 1)
    l0, l1 = ql[:, :, 0:32], ql[:, :, 32:64]
    q1 = (l0 & 0x0F) | (((qh >> 0) & 3) << 4)
    q2 = (l1 & 0x0F) | (((qh >> 2) & 3) << 4)
    q3 = (l0 >> 4) | (((qh >> 4) & 3) << 4)
    q4 = (l1 >> 4) | (((qh >> 6) & 3) << 4)
    q = np.stack([q1, q2, q3, q4], axis=2).astype(np.float32) - 32  # (nb, 2, 4, 32)
    # scale index inside a half: is = l // 16 (+2 per quarter); (d * sc) * q as ggml rounds it
    s = sc.reshape(-1, 2, 4, 2)[..., None]  # (nb, 2, quarter, l//16, 1)
    ds = d[:, :, None, None, None] * s
    return (ds * q.reshape(-1, 2, 4, 2, 16)).reshape(-1, 256)


def _q2_k(b):
    """16 scale bytes (scale | min << 4 per 16), 64 bytes of 2-bit quants, fp16 d, fp16 dmin.
    Element 128h + 32s + l is bits 2s of byte 32h + l; its 16 is 8h + 2s + l // 16."""
    sc = b[:, 0:16]
    d = _f16(b[:, 80:82].copy())
    dmin = _f16(b[:, 82:84].copy())
    qs = b[:, 16:80].reshape(-1, 2, 1, 32)
    q = ((qs >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3).astype(np.float32)
    dl = (d * (sc & 0x0F).astype(np.float32)).reshape(-1, 2, 4, 2, 1)
    ml = (dmin * (sc >> 4).astype(np.float32)).reshape(-1, 2, 4, 2, 1)
    return (dl * q.reshape(-1, 2, 4, 2, 16) - ml).reshape(-1, 256)


def _q3_k(b):
    """32 bytes high-bit mask, 64 bytes 2-bit quants, 12 bytes of 6-bit scales, fp16 d.
    Element 128h + 32s + l: bits 2s of byte 32 + 32h + l, high bit 4h + s of mask byte l (clear: -4),
    scale j = 8h + 2s + l // 16 stored with an offset of 32."""
    hm = b[:, 0:32]
    qs = b[:, 32:96].reshape(-1, 2, 1, 32)
    s = b[:, 96:108].astype(np.int32)
    d = _f16(b[:, 108:110].copy())
    low = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)  # scales 0..7, 8..15
    j = np.arange(16)
    top = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    scale = ((low | (top << 4)) - 32).astype(np.float32)
    sh = np.arange(4, dtype=np.uint8)[None, None, :, None]
    q = ((qs >> (2 * sh)) & 3).astype(np.int32)
    bit = (hm[:, None, None, :] >> (4 * np.arange(2, dtype=np.uint8)[None, :, None, None] + sh)) & 1
    q = (q - 4 * (1 - bit.astype(np.int32))).astype(np.float32)
    dl = (d * scale).reshape(-1, 2, 4, 2, 1)
    return (dl * q.reshape(-1, 2, 4, 2, 16)).reshape(-1, 256)


IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _iq4_nl(b):
    d = _f16(b[:, 0:2].copy())
    qs = b[:, 2:18]
    return d * IQ4NL_VALUES[np.concatenate([qs & 0x0F, qs >> 4], axis=1)]


def _iq4_xs(b):
    """fp16 d, u16 of 2-bit scale tops, 4 bytes of scale low nibbles, 8 x 16 bytes of IQ4_NL nibbles;
    sub-block j's scale is d * (6-bit value - 32)."""
    d = _f16(b[:, 0:2].copy())
    h = b[:, 2:4].copy().view("<u2").astype(np.int32)  # (nb, 1)
    lo = b[:, 4:8].astype(np.int32)
    j = np.arange(8)
    ls = ((lo[:, j // 2] >> (4 * (j % 2))) & 0x0F) | (((h >> (2 * j)) & 3) << 4)
    dl = d * (ls - 32).astype(np.float32)  # (nb, 8)
    qs = b[:, 8:136].reshape(-1, 8, 16)
    idx = np.concatenate([qs & 0x0F, qs >> 4], axis=2)  # (nb, 8, 32)
    return (dl[:, :, None] * IQ4NL_VALUES[idx]).reshape(-1, 256)


_BLOCK_DEQUANT = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
    "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}
_BLOCK_DEQUANT.update({"Q2_K": _q2_k, "Q3_K": _q3_k, "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs})


# The IQ2/IQ3 codebook formats (blocks of 256). Their codebooks are format data: parsed from the
# one copy in the source tree (core/src/gguf/iq_grids.cpp); the bit layouts below are read from
# ggml's block definitions, and the 7-bit sign codes are expanded here (eighth bit = parity).
_IQ_GRIDS = None


def _iq_grid(name):
    global _IQ_GRIDS
    if _IQ_GRIDS is None:
        import os
        import re
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "core", "src", "gguf",
                            "iq_grids.cpp")
        src = open(path).read()
        _IQ_GRIDS = {}
        for ty, nm, body in re.findall(r"const (uint64_t|uint32_t) (\w+)\[\d+\] = \{(.*?)\};", src, re.S):
            vals = [int(v, 16) for v in re.findall(r"0x([0-9a-fA-F]+)", body)]
            width = 8 if ty == "uint64_t" else 4
            _IQ_GRIDS[nm] = np.array(vals, "<u8" if width == 8 else "<u4").view(np.uint8).reshape(len(vals), width)
    return _IQ_GRIDS[name]


def _iq_signs7(s7):
    """7 stored sign bits -> 8 sign bits with an even count."""
    s7 = s7.astype(np.int64)
    parity = np.zeros_like(s7)
    for k in range(7):
        parity ^= (s7 >> k) & 1
    return s7 | (parity << 7)


def _iq_apply(db, mags, signs8):
    """db (nb, 32) per group of 8, mags (nb, 32, 8) magnitudes, signs8 (nb, 32) bits -> (nb*256,)."""
    neg = ((signs8[:, :, None] >> np.arange(8)) & 1).astype(bool)
    v = db[:, :, None] * mags.astype(np.float32)
    return np.where(neg, -v, v).astype(np.float32).reshape(-1, 256)


def _iq_db(d, ls, half):
    """ggml's group scale: d*(0.5 + l)*half, in float32 (half = 0.25 for IQ2, 0.5 for IQ3_XXS)."""
    return (d * (np.float32(0.5) + ls.astype(np.float32))) * np.float32(half)


def _iq2_xxs(b):
    d = _f16(b[:, 0:2].copy())
    q = b[:, 2:66].reshape(-1, 8, 8)
    idx = q[:, :, 0:4].reshape(-1, 32).astype(np.int64)
    aux = q[:, :, 4:8].copy().view("<u4").reshape(-1, 8).astype(np.int64)
    s7 = ((aux[:, :, None] >> (7 * np.arange(4))) & 127).reshape(-1, 32)
    ls = np.repeat(aux >> 28, 4, axis=1)
    return _iq_apply(_iq_db(d, ls, 0.25), _iq_grid("kIq2XxsGrid")[idx], _iq_signs7(s7))


def _iq2_scales16(sc):
    """Bytes of two 4-bit scales (low nibble: the first 16) -> per group of 8 (nb, 32)."""
    g = np.arange(32)
    return (sc[:, g // 4].astype(np.int64) >> (4 * ((g % 4) // 2))) & 15


def _iq2_xs(b):
    d = _f16(b[:, 0:2].copy())
    qs = b[:, 2:66].copy().view("<u2").reshape(-1, 32).astype(np.int64)
    ls = _iq2_scales16(b[:, 66:74])
    return _iq_apply(_iq_db(d, ls, 0.25), _iq_grid("kIq2XsGrid")[qs & 511], _iq_signs7(qs >> 9))


def _iq2_s(b):
    d = _f16(b[:, 0:2].copy())
    g = np.arange(32)
    qh = b[:, 66:74].astype(np.int64)
    idx = b[:, 2:34].astype(np.int64) | (((qh[:, g // 4] >> (2 * (g % 4))) & 3) << 8)
    ls = _iq2_scales16(b[:, 74:82])
    return _iq_apply(_iq_db(d, ls, 0.25), _iq_grid("kIq2SGrid")[idx], b[:, 34:66].astype(np.int64))


def _iq3_xxs(b):
    d = _f16(b[:, 0:2].copy())
    idx = b[:, 2:66].astype(np.int64)  # entry e holds elements 4e..4e+3
    aux = b[:, 66:98].copy().view("<u4").reshape(-1, 8).astype(np.int64)
    s7 = ((aux[:, :, None] >> (7 * np.arange(4))) & 127).reshape(-1, 32)
    ls = np.repeat(aux >> 28, 4, axis=1)
    mags = _iq_grid("kIq3XxsGrid")[idx].reshape(-1, 32, 8)
    return _iq_apply(_iq_db(d, ls, 0.5), mags, _iq_signs7(s7))


def _iq3_s(b):
    d = _f16(b[:, 0:2].copy())
    e = np.arange(64)
    qh = b[:, 66:74].astype(np.int64)
    idx = b[:, 2:66].astype(np.int64) | (((qh[:, e // 8] >> (e % 8)) & 1) << 8)
    ib = np.arange(32) // 4
    ls = (b[:, 106:110][:, ib // 2].astype(np.int64) >> (4 * (ib % 2))) & 15
    db = d * (np.float32(1) + np.float32(2) * ls.astype(np.float32))
    mags = _iq_grid("kIq3SGrid")[idx].reshape(-1, 32, 8)
    return _iq_apply(db, mags, b[:, 74:106].astype(np.int64))


GGML_TYPES.update({16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
                   21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82)})
_BLOCK_DEQUANT.update({"IQ2_XXS": _iq2_xxs, "IQ2_XS": _iq2_xs, "IQ2_S": _iq2_s, "IQ3_XXS": _iq3_xxs,
                       "IQ3_S": _iq3_s})


def describe(g):
    """Short text summary: metadata (arrays abbreviated) and tensors."""
    lines = [f"GGUF v{g.version}, alignment {g.alignment}, data at {g.data_offset}"]
    for k, v in g.kv.items():
        if isinstance(v, list):
            v = f"[{len(v)} items] " + repr(v[:4])[:80]
        lines.append(f"  {k} = {v!r}"[:160])
    for t in g.tensors.values():
        lines.append(f"  tensor {t.name} {t.type_name} ne={t.ne}")
    return "\n".join(lines)
