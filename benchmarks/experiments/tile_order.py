"""Model: how a persistent causal forward's tile order trades K/V traffic against balance.

A persistent grid of P programs walks the (query block, batch * head) tiles in a fixed order,
program p taking tiles p, p + P, p + 2P, ... Under a causal mask tile lengths differ (query
block i of a head walks i + 1 key blocks at BLOCK_M = BLOCK_N), so the order decides both:
- balance: the most key blocks any program walks over the mean (1.0 is perfect);
- traffic: how often each head's K/V blocks come from DRAM rather than L2. Here every program
  takes one key block per step, in lockstep, through a least-recently-used cache of the L2's
  size; Q and O, read and written once whatever the order, are left out.

Orders:
- block-major: the longest query block of every head first, then the next (the Gluon forward's
  persistent causal order of perf-notes v27, and the Triton template's): balanced, but a head's
  query blocks run a whole pass over all heads apart, so its K/V leaves L2 between them.
- rotating: head-major, so that a head's query blocks run together, each head's blocks
  rotated by the round in which its first tile falls times (1 - P % num_m), so that a
  program's query block moves by exactly one a round and it takes every length in turn; where
  the programs walk fewer than num_m - 1 tiles each, block-major (perf-notes v33).

It is a model, not a measurement: ncu's DRAM bytes on the device say what the L2 really does
(benchmarks/results/ncu-probe-h200.txt for the block-major order at N=512).

usage: python benchmarks/experiments/tile_order.py [--l2-mb 40] [--programs 264,132]
"""

from __future__ import annotations

import argparse
from collections import OrderedDict


def tile(order: str, t: int, num_tiles: int, num_m: int, programs: int) -> tuple[int, int]:
    """(batch * head, query block) of tile t, as the kernels compute it."""
    if order == "block-major":
        heads = num_tiles // num_m
        bh, r = t % heads, t // heads
    elif num_tiles < (num_m - 1) * programs:
        return tile("block-major", t, num_tiles, num_m, programs)
    else:
        bh = t // num_m
        step = 1 + num_m - programs % num_m
        r = (t % num_m + (bh * num_m // programs) % num_m * step) % num_m
    return bh, num_m - 1 - r


def simulate(order: str, heads: int, n: int, d: int, programs: int, block: int, l2_bytes: float,
             elt: int = 2) -> tuple[float, float]:
    """(K/V bytes from DRAM over the bytes of reading K/V once, balance) for one launch."""
    num_m = -(-n // block)
    num_tiles = heads * num_m
    walks = [[tile(order, t, num_tiles, num_m, programs) for t in range(p, num_tiles, programs)]
             for p in range(programs)]
    if len({x for w in walks for x in w}) != num_tiles:
        raise AssertionError(f"{order}: not every tile is walked exactly once")
    block_bytes = 2 * block * d * elt
    cache: OrderedDict = OrderedDict()
    cached = missed = 0
    pos = [[0, 0] for _ in range(programs)]  # (tile, key block) of each program
    steps = 0
    while True:
        busy = False
        for p in range(programs):
            ti, kb = pos[p]
            if ti == len(walks[p]):
                continue
            busy = True
            bh, pid_m = walks[p][ti]
            key = (bh, kb)
            if key in cache:
                cache.move_to_end(key)
            else:
                missed += block_bytes
                cached += block_bytes
                cache[key] = None
                while cached > l2_bytes:
                    cache.popitem(last=False)
                    cached -= block_bytes
            pos[p] = [ti + 1, 0] if kb + 1 == pid_m + 1 else [ti, kb + 1]
        if not busy:
            break
        steps += 1
    mean = sum(pid_m + 1 for w in walks for _, pid_m in w) / programs
    return missed / (heads * n * block_bytes / block), steps / mean


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--l2-mb", type=float, default=40.0, help="L2 the K/V blocks can use (the H200 has 50 MB)")
    ap.add_argument("--programs", default="264,132", help="persistent programs: 2 or 1 per SM of 132")
    ap.add_argument("--block", type=int, default=128)
    args = ap.parse_args()
    print("canonical grid (B*N = 16k, H = 2048 / D), causal, fp16; K/V reads over reading them once, balance")
    for d in (64, 128):
        for n in (512, 1024, 2048, 4096):
            heads = (16384 // n) * (2048 // d)
            for programs in map(int, args.programs.split(",")):
                row = [f"D={d:<3} N={n:<5} programs {programs}:"]
                for order in ("block-major", "rotating"):
                    traffic, balance = simulate(order, heads, n, d, programs, args.block, args.l2_mb * 1e6)
                    row.append(f"{order} {traffic:4.1f}x, {balance:.3f}")
                print(" | ".join(row))


if __name__ == "__main__":
    main()
