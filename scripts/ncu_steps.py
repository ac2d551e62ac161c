#!/usr/bin/env python3
"""Where a GPU run's kernel time goes, step by step, from Nsight Compute's per-launch durations.

    ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \\
        build/bin/tessera run -m MODEL --backend cuda -n 4 --ignore-eos "Once" > ncu.csv
    scripts/ncu_steps.py ncu.csv

A step starts at each embedding launch (the model's first op). Prints the kernels and their summed
duration of every step, then the last step by kernel (name, grid, block): launches, total and mean
microseconds, largest first. Durations are of each kernel alone (ncu serialises launches), so a step's
sum is its GPU time without the gaps between kernels; compare it with the step's wall time.
"""
import collections
import csv
import sys


def rows(path):
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no ncu --csv --page raw table (a line starting with \"ID\")")
    table = list(csv.reader(lines[start:]))
    header, body = table[0], table[1:]
    if body and body[0] and body[0][0] == "":  # the units row
        body = body[1:]
    try:
        name, grid, block, time = (header.index(c) for c in
                                   ("Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum"))
    except ValueError as e:
        sys.exit(f"{path}: column missing ({e}); run ncu with --metrics gpu__time_duration.sum")
    for r in body:
        if len(r) > time:
            yield r[name], r[grid], r[block], float(r[time].replace(",", "")) / 1e3  # ns -> us


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    steps = []
    for kernel, grid, block, us in rows(sys.argv[1]):
        if "embedding" in kernel or not steps:
            steps.append([])
        steps[-1].append((kernel, grid, block, us))
    if not steps:
        sys.exit(f"{sys.argv[1]}: no kernels")
    for i, step in enumerate(steps):
        print(f"step {i}: {len(step)} kernels, {sum(s[3] for s in step):.1f} us")
    by_kernel = collections.defaultdict(lambda: [0, 0.0])
    for kernel, grid, block, us in steps[-1]:
        key = (kernel.split("(")[0][:90], grid, block)
        by_kernel[key][0] += 1
        by_kernel[key][1] += us
    print(f"\nlast step by kernel: {'launches':>8} {'total us':>10} {'mean us':>8}  kernel  grid  block")
    for (kernel, grid, block), (n, total) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
        print(f"{'':20} {n:8d} {total:10.1f} {total / n:8.2f}  {kernel}  {grid}  {block}")


if __name__ == "__main__":
    main()
