"""Tessera's GGUF quantizers against the independent NumPy ones (gguf_quantize.py, gguf_read.py).

  check_quantize.py --pairs FILE.gguf
      FILE holds, per type T, `x.T` (float32 input), `q.T` (Tessera's blocks of x in type T) and
      optionally `d.T` (Tessera's dequantization of q.T, float32). Checks q.T == the NumPy
      quantization of x.T byte for byte, and d.T == the NumPy dequantization of q.T bit for bit.
  check_quantize.py --tessera BIN [--types q4_k,...] [--keep DIR]
      Writes one synthetic model with `BIN synth --dtype f32` and one per type with the same seed
      (the same float weights), then checks every tensor the typed file stores in that type against
      the NumPy quantization of the f32 file's tensor, and that the others are equal floats.

Exit 0 when all match; 1 naming the type, tensor and first differing block otherwise.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_quantize import BLOCKS, quantize  # noqa: E402
from gguf_read import GGML_TYPES, GGUFFile, dequantize  # noqa: E402

TYPE_ID = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}
# Shapes whose rows are whole super-blocks of 256 (dim, ffn), one layer, small vocabulary: every
# matrix takes the type, and NumPy quantizes the model in seconds.
SYNTH_SHAPE = ["--preset", "tiny", "--dim", "256", "--ffn", "256", "--layers", "1", "--heads", "4",
               "--kv-heads", "2", "--vocab", "320", "--seed", "7"]


def first_bad_block(want, got, block_bytes):
    bad = np.nonzero(want != got)[0]
    return int(bad[0]) // block_bytes if bad.size else -1


def check_blocks(label, type_name, x, raw):
    want = quantize(type_name, x)
    if want.size != raw.size:
        return f"{label}: {raw.size} bytes, the reference quantizes to {want.size}"
    block_bytes = BLOCKS[type_name][1]
    b = first_bad_block(want, raw, block_bytes)
    if b >= 0:
        n_bad = int(np.count_nonzero((want != raw).reshape(-1, block_bytes).any(axis=1)))
        s = slice(b * block_bytes, (b + 1) * block_bytes)
        return (f"{label}: {n_bad} of {raw.size // block_bytes} {type_name} blocks differ, first block {b}\n"
                f"  tessera   {raw[s].tobytes().hex()}\n  reference {want[s].tobytes().hex()}")
    return None


def check_pairs(path):
    g = GGUFFile(path)
    names = sorted(n[2:] for n in g.tensors if n.startswith("q."))
    failures = []
    for t in names:
        qt = g.tensors["q." + t]
        type_name = qt.type_name
        x = g.tensor("x." + t).reshape(-1)
        raw = np.asarray(g.raw("q." + t))
        err = check_blocks(f"q.{t}", type_name, x, raw)
        if err:
            failures.append(err)
        if "d." + t in g.tensors:
            ours = g.tensor("d." + t).reshape(-1)
            ref = dequantize(raw, qt.type_id, qt.n_elements)
            diff = np.nonzero(ours.view(np.uint32) != ref.view(np.uint32))[0]
            if diff.size:
                i = int(diff[0])
                failures.append(f"d.{t}: {diff.size} of {ours.size} dequantized values differ from the "
                                f"reference's, first element {i}: {ours[i]!r} vs {ref[i]!r}")
        print(f"{type_name:7s} {t}: {x.size} values, {raw.size} bytes checked")
    return names, failures


def check_synth(tessera, types, keep):
    failures = []
    tmp = keep or tempfile.mkdtemp(prefix="check_quantize_")
    os.makedirs(tmp, exist_ok=True)

    def synth(dtype):
        out = os.path.join(tmp, f"m-{dtype}.gguf")
        r = subprocess.run([tessera, "synth", *SYNTH_SHAPE, "--dtype", dtype, "-o", out],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"synth --dtype {dtype} failed: {r.stderr.strip()}")
        return GGUFFile(out)

    base = synth("f32")
    for dtype in types:
        type_name = dtype.upper()
        g = synth(dtype)
        n_typed = 0
        for name, t in g.tensors.items():
            x = base.tensor(name).reshape(-1)
            if t.type_name == type_name:
                n_typed += 1
                err = check_blocks(f"synth --dtype {dtype}: {name}", type_name, x, np.asarray(g.raw(name)))
                if err:
                    failures.append(err)
            elif t.type_name == "F32":
                if not np.array_equal(g.tensor(name).reshape(-1).view(np.uint32), x.view(np.uint32)):
                    failures.append(f"synth --dtype {dtype}: {name} (f32) differs from the f32 model's")
            else:
                failures.append(f"synth --dtype {dtype}: {name} is {t.type_name}, expected {type_name} or F32")
        if n_typed == 0:
            failures.append(f"synth --dtype {dtype}: no tensor was stored as {type_name}")
        print(f"{type_name:7s} synth: {n_typed} tensors checked")
    if not keep:
        for f in os.listdir(tmp):
            os.remove(os.path.join(tmp, f))
        os.rmdir(tmp)
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", help="GGUF with x.T / q.T / d.T tensors")
    ap.add_argument("--tessera", help="tessera binary: check `synth --dtype` for each type")
    ap.add_argument("--types", default=",".join(n.lower() for n in BLOCKS), help="comma-separated types")
    ap.add_argument("--keep", help="write the synth models here and keep them")
    a = ap.parse_args()
    if not a.pairs and not a.tessera:
        ap.error("give --pairs or --tessera")
    failures = []
    if a.pairs:
        names, f = check_pairs(a.pairs)
        failures += f
        if not names:
            failures.append(f"{a.pairs}: no q.* tensors")
    if a.tessera:
        failures += check_synth(a.tessera, [t.strip().lower() for t in a.types.split(",") if t.strip()], a.keep)
    for f in failures:
        print("MISMATCH " + f)
    print("all identical" if not failures else f"{len(failures)} mismatches")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
