"""Time fp8's staged copy of V alone: the plain transpose, and the key-order one the Gluon
forward reads (perf-notes v57), where the version has it.

usage (GPU machine): python benchmarks/experiments/fp8_copy.py PACKAGE [BLOCK ...]
PACKAGE is a copy of a version's fa2gen (``git archive BRANCH fa2gen | tar -x -C PACKAGE``).
BLOCK: keys per program of the transpose, each timed in turn (default: the version's own).
Each line gives the time and the bandwidth of the copy (V read once and written once).
The results are in benchmarks/results/fwd-ab-v56-v57/v57-copy*.txt.
"""

import inspect
import os
import sys

sys.path.insert(0, os.path.abspath(sys.argv[1]))  # this version's fa2gen, ahead of any installed one

import torch  # noqa: E402
import triton  # noqa: E402

from fa2gen.runtime import fp8  # noqa: E402
from fa2gen.runtime.fp8 import transposed_v  # noqa: E402

orders = (False, True) if "key_order" in inspect.signature(transposed_v).parameters else (False,)
own = fp8._TRANSPOSE_BLOCK
blocks = [int(x) for x in sys.argv[2:]] or [own]
for block in blocks:
    for b, h, n in ((4, 16, 4096), (1, 16, 16384)):
        v = torch.randn(b, n, h, 128, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
        for key_order in orders:
            fp8._TRANSPOSE_BLOCK = own  # read at each call
            ref = transposed_v(v, key_order=key_order)
            fp8._TRANSPOSE_BLOCK = block
            assert torch.equal(ref.view(torch.uint8), transposed_v(v, key_order=key_order).view(torch.uint8))
            ms = triton.testing.do_bench(lambda: transposed_v(v, key_order=key_order), warmup=50, rep=300)
            gbs = 2 * v.numel() / (ms * 1e-3) / 1e9
            print(f"block {block} B{b} H{h} N{n} key_order={key_order}: {ms * 1000:.1f} us, {gbs:.0f} GB/s")
