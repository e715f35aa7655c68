"""perf-notes v46's probe: dq_mode matmul's dQ kernel on a second stream, so that a chunk's dQ
overlaps the next chunk's dK/dV kernel, with the dS scratch split into 2, 4 or 8 chunks (and 4
on a high-priority stream), against the shipped order, at fp16 D=128; each form checked and
timed as bwd_cells does, SDPA cuDNN's backward in the same process. Writes $OUT/overlap.json.
Run from the repository root on the package as of v45."""
from __future__ import annotations
import json, os, sys
sys.path.insert(0, "benchmarks/experiments")
import torch
import bwd_cells
from fa2gen.bench.timing import measure
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime import backward as bwd
from fa2gen.runtime.launch import gluon_descriptor

P = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", dq_mode="matmul", gluon=1)


class Overlap(bwd.BackwardLaunch):
    __slots__ = ("side", "pieces")

    def setup(self, pieces, priority):
        self.side = torch.cuda.Stream(priority=priority)
        total = bwd.ds_head_bytes(self.problem) * self.problem.batch * self.problem.heads_kv
        limit = min(bwd.DS_SCRATCH_BYTES, max(bwd.ds_head_bytes(self.problem), -(-total // pieces)))
        self.ds_chunks = bwd.ds_chunks(self.problem, limit)
        return self

    def _dkdv_ds_matmul(self, run, module, shape, bs, hs, q, k, v, dout, lse, delta, dq, dk, dv):
        problem = self.problem
        g, nq, nk = problem.group, problem.seqlen_q, problem.seqlen_k
        qs = slice(hs.start * g, hs.stop * g)
        nb, nh = bs.stop - bs.start, hs.stop - hs.start
        scratch = torch.empty((nb, nh * g, nk, -(-nq // 8) * 8), dtype=q.dtype, device=q.device)[..., :nq]
        tensors = (q[bs, qs], k[bs, hs], v[bs, hs], dout[bs, qs], dk[bs, hs], dv[bs, hs], scratch)
        args = [gluon_descriptor(t, box, layout) for t, (box, layout) in zip(tensors, self.boxes["attn_bwd_dkdv"])]
        grid = (-(-nk // self.gluon.block_m), nb * nh)
        main = torch.cuda.current_stream()
        run(module.attn_bwd_dkdv, grid, *args, lse[bs, qs], delta[bs, qs], nh, g, nq, nk, problem.sm_scale,
            module.DS_ROWS, key=(id(module.attn_bwd_dkdv), grid), **shape)
        self.side.wait_stream(main)
        scratch.record_stream(self.side)
        (ds_box, ds_layout), _ = self.boxes["attn_bwd_dq_ds"]
        rows = dq[bs, qs]
        grid = (-(-nq // module.DS_ROWS), nb * nh * g)
        with torch.cuda.stream(self.side):
            run(module.attn_bwd_dq_ds, grid, gluon_descriptor(scratch, ds_box, ds_layout), args[1], rows,
                *rows.stride()[:3], nh * g, g, nq, nk, HEAD_DIM=problem.head_dim, launch=module.LAUNCH,
                key=(id(module.attn_bwd_dq_ds), grid))
        if bs.stop == problem.batch and hs.stop == problem.heads_kv:  # the last chunk: join
            main.wait_stream(self.side)


out = []
for d, n, causal in [(128, 2048, False), (128, 4096, False), (128, 16384, False), (128, 4096, True), (128, 16384, True)]:
    c = bwd_cells.Cell(d, n, causal, "fp16")
    row = {"cell": f"fp16 D={d} N={n} {'causal' if causal else 'full'}"}
    forms = [("sequential", bwd.BackwardLaunch(c.problem, P))]
    for pieces in (2, 4, 8):
        forms.append((f"overlap {pieces}", Overlap(c.problem, P).setup(pieces, 0)))
    forms.append(("overlap 4 hi-prio", Overlap(c.problem, P).setup(4, -1)))
    for name, kept in forms:
        ok, said, ms = c.check_and_time(kept)
        row[name] = (ok, round(ms, 4), len(kept.ds_chunks))
    row["cudnn"] = round(c.cudnn_ms(), 4)
    out.append(row)
    print(row, flush=True)
json.dump(out, open(os.path.join(os.environ["OUT"], "overlap.json"), "w"), indent=1)
