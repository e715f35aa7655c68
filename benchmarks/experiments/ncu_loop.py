"""Where a kernel's inner loop spends its warps' time, from an Nsight Compute source page.

Reads the per-instruction SASS table that `ncu -i REPORT --page source --csv --print-source
sass` writes (gzipped or not) and takes the inner loop to be the instructions executed at
least half as often as the most executed one. Prints the loop's share of all stall samples,
each stall reason's share of the loop's samples, the loop body's instructions by opcode and
each opcode's share of the samples.

usage: python benchmarks/experiments/ncu_loop.py SOURCE.csv[.gz] [...]
The results of perf-notes' fp8 profile are in benchmarks/results/ncu-fp8/.
"""

from __future__ import annotations

import collections
import csv
import gzip
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def _rows(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    return rows[header], rows[header + 1:]


def _opcode(sass: str) -> str:
    words = sass.split()
    if words and words[0].startswith("@"):  # a predicate guards it
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def summarise(path: str) -> None:
    header, data = _rows(path)
    at = {name: i for i, name in enumerate(header)}

    def value(row, name):
        try:
            return int(row[at[name]])
        except (KeyError, IndexError, ValueError):
            return 0

    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    most = max(value(r, EXECUTED) for r in data)
    loop = [r for r in data if value(r, EXECUTED) >= most / 2]
    total = sum(value(r, SAMPLES) for r in data)
    in_loop = sum(value(r, SAMPLES) for r in loop)
    print(f"{path}: inner loop {len(loop)} instructions, executed {most} times; "
          f"{in_loop / total:.1%} of all stall samples")
    by_reason = {r: sum(value(row, r) for row in loop) / in_loop for r in reasons}
    top = sorted(by_reason.items(), key=lambda kv: -kv[1])[:9]
    print("  stall reasons:", ", ".join(f"{name[6:]} {share:.1%}" for name, share in top))
    count, samples = collections.Counter(), collections.Counter()
    for row in loop:
        op = _opcode(row[at["Source"]])
        count[op] += 1
        samples[op] += value(row, SAMPLES)
    print("  instructions:", ", ".join(f"{op} {n}" for op, n in count.most_common(14)))
    print("  samples:", ", ".join(f"{op} {n / in_loop:.1%}" for op, n in samples.most_common(10)))


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summarise(p)
