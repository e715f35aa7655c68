"""Where a kernel's warps stall, from Nsight Compute's source page: the share of the warp-stall
samples per stall reason over the whole kernel, and the instructions holding the most samples
with their two main reasons.

The CSV comes from a report with the SourceCounters section:
  ncu --section SourceCounters ... -o REPORT python ...
  ncu -i REPORT.ncu-rep --page source --csv --print-source sass > KERNEL.sass.csv

usage: python benchmarks/ncu_stalls.py KERNEL.sass.csv[.gz] ... [--top N]
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io

SAMPLES = "Warp Stall Sampling (All Samples)"


def read(path: str) -> list[dict[str, str]]:
    """The per-instruction rows of one kernel's source page (the first line names the kernel)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def summary(rows: list[dict[str, str]], top: int) -> str:
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    count = lambda r, k: int(r[k] or 0)  # noqa: E731
    total = sum(count(r, SAMPLES) for r in rows)
    if total == 0:
        return "no stall samples (was the SourceCounters section collected?)"
    by_reason = collections.Counter({k[6:]: sum(count(r, k) for r in rows) for k in reasons})
    out = [f"{len(rows)} instructions, {total} samples",
           "by reason: " + ", ".join(f"{k} {v / total:.1%}" for k, v in by_reason.most_common(8))]
    for r in sorted(rows, key=lambda r: -count(r, SAMPLES))[:top]:
        main = sorted(((count(r, k), k[6:]) for k in reasons), reverse=True)[:2]
        why = ", ".join(f"{k} {n / total:.1%}" for n, k in main if n)
        out.append(f"  {r['Address'][-5:]} {count(r, SAMPLES) / total:6.1%}  {r['Source'].strip()[:60]:60s} {why}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    for path in args.csv:
        print(f"== {path}\n{summary(read(path), args.top)}")


if __name__ == "__main__":
    main()
