"""Instructions per loop of compiled kernels, from their SASS, without a GPU.

For every loop that holds tensor-core instructions (HGMMA; QGMMA in fp8): its instructions,
its matmuls, its local-memory loads (spilled registers read back) and its exponentials: all of
them, those issued while a matmul is still in flight, and the longest run issued back to back.
Loops nest: an outer loop's count includes its inner loops. A shorter loop for the same
matmuls is less non-matmul work per FLOP; whether that is faster is for the GPU to say.
``benchmarks/sass_loops.py`` prints it for chosen variants; the tests check the shipped forms'
loops with it.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

from . import ahead
from .descriptors.attn_bwd import PASS_KERNELS
from .spec import KernelSpec, TuningParams


def loop_stats(sass: str) -> list[dict]:
    """Backward branches in disassembly order: each closes a loop from its target label."""
    labels, body = {}, []
    for line in sass.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(body)
            continue
        ins = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if ins:
            body.append(ins.group(1))
    loops = []
    for end, ins in enumerate(body):
        branch = re.search(r"BRA\s+.*?(\.L_x_\d+)", ins)
        start = labels.get(branch.group(1)) if branch else None
        if start is not None and start < end:
            span = body[start : end + 1]
            hgmma = sum("HGMMA" in x or "QGMMA" in x for x in span)
            if hgmma:
                loops.append(
                    {
                        "instructions": len(span),
                        "hgmma": hgmma,
                        "ldl": sum("LDL" in x for x in span),
                        "ex2": sum("MUFU.EX2" in x for x in span),
                        "ex2_in_flight": ex2_in_flight(span),
                        "ex2_run": ex2_run(span),
                    }
                )
    return loops


def ex2_run(span: list[str]) -> int:
    """The most exponentials issued back to back. A long run fills the queue that the
    tensor-core instructions issue through too (see the Gluon forward's ``_row_sum``)."""
    longest = run = 0
    for ins in span:
        run = run + 1 if "MUFU.EX2" in ins else 0
        longest = max(longest, run)
    return longest


def ex2_in_flight(span: list[str]) -> int:
    """Exponentials issued while a wgmma group is in flight: after a wait that leaves one
    group outstanding (DEPBAR.LE gsb0, 0x1) and before the next wait for all (0x0)."""
    count, open_ = 0, False
    for ins in span:
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in ins:
            open_ = True
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in ins:
            open_ = False
        elif open_ and "MUFU.EX2" in ins:
            count += 1
    return count


def opcode_counts(sass: str) -> collections.Counter:
    """Instructions by opcode (with its modifiers, predicates dropped)."""
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    return collections.Counter(ops)


def analyse(
    direction: str, head_dim: int, mask: str, params: TuningParams, arch: str = "sm90", dtype: str = "fp16"
) -> dict:
    """Per kernel of the variant: spill bytes, ptxas's performance notes, loops and opcodes."""
    spec = KernelSpec(direction=direction, dtype=dtype, head_dim=head_dim, mask=mask)
    out = {}
    for name, kernel in ahead.compiled_kernels(spec, params, arch):
        if name in PASS_KERNELS:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            cubin = os.path.join(tmp, "k.cubin")
            report = ahead.assemble(kernel, arch, cubin, name=name)
            sass = subprocess.run(
                [ahead.nvidia_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True, check=True
            ).stdout
        out[name] = {
            "spill_bytes": ahead.spill_bytes(report),
            "losses": ahead.performance_losses(report),
            "loops": loop_stats(sass),
            "opcodes": opcode_counts(sass),
        }
    return out
