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
    # scale index inside a half: is = l // 16 (+2 per quarter)
    s = sc.reshape(-1, 2, 4, 2)[..., None]  # (nb, 2, quarter, l//16, 1)
    q = q.reshape(-1, 2, 4, 2, 16) * s
    return (d[:, :, None, None, None] * q).reshape(-1, 256)


_BLOCK_DEQUANT = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
    "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}


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
