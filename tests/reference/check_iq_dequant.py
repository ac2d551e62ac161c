"""Tessera's IQ2/IQ3 dequantization against the NumPy one in gguf_read.py.

  check_iq_dequant.py FILE.gguf
      FILE holds, per type T, `q.T` (blocks of type T) and `d.T` (Tessera's dequantization of q.T,
      float32). Exit 0 when every d.T equals the NumPy dequantization of q.T bit for bit; 1 naming
      the type and first differing element otherwise.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_read import GGUFFile, dequantize  # noqa: E402


def main():
    g = GGUFFile(sys.argv[1])
    checked = 0
    for name, t in g.tensors.items():
        if not name.startswith("q."):
            continue
        want = dequantize(g.raw(name), t.type_id, t.n_elements)
        got = g.tensor("d." + name[2:]).reshape(-1)
        bad = np.nonzero(want.view(np.uint32) != got.view(np.uint32))[0]
        if bad.size:
            i = int(bad[0])
            print(f"{name[2:]}: element {i} (block {i // 256}): tessera {got[i]!r}, numpy {want[i]!r}")
            return 1
        checked += 1
    print(f"{checked} types agree")
    return 0 if checked else 1


if __name__ == "__main__":
    sys.exit(main())
