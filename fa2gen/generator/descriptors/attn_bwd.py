"""attn_bwd.py.jinja: the Triton backward (delta, dK/dV, dQ), and the Gluon backward's delta
and dQ passes (``spec.triton_part``)."""

from __future__ import annotations

from ..spec import PASS_WARPS, pass_rows
from .base import BackwardTemplate, Kernel, alibi_args, dropout_args, floats, ints, strides, tensors

# The memory-bound passes (delta, and the atomic paths' dQ store): their own small tiles and
# warps (spec.pass_rows, PASS_WARPS)
PASS_KERNELS = ("attn_bwd_delta", "attn_bwd_dq_store")

# Each tensor's batch, head and row strides as the template names them
STRIDES = {
    t: strides(t, " ".join(f"stride_{t.lower()}{d}" for d in ("b", "h", row)))
    for t, row in (("Q", "m"), ("K", "n"), ("V", "n"), ("O", "m"), ("DO", "m"), ("DQ", "m"), ("DK", "n"), ("DV", "n"))
}


class AttnBwd(BackwardTemplate):
    file = "attn_bwd.py.jinja"
    gluon = (0,)

    def flags(self, spec, params, triton):
        return {
            "dq_atomic": params.dq_mode in ("atomic", "tma_reduce"),  # dQ added into fp32 sums
            "dq_mode": params.dq_mode,
            "loads": params.loads,
            "mask": spec.mask,
            "pad_head": spec.head_dim != spec.head_dim_padded,
            "softcap": spec.softcap,
            "varlen": spec.varlen,
            "alibi": spec.alibi,
            "dropout": spec.dropout,
        }

    def kernels(self, spec, params):
        dims = {"HEAD_DIM": spec.head_dim, "HEAD_DIM_PAD": spec.head_dim_padded}
        tiles = {**dims, "OUTER": params.block_m, "INNER": params.block_n}
        options = {"num_warps": params.num_warps, "num_stages": params.num_stages}
        passes = {"num_warps": PASS_WARPS, "num_stages": 1}
        rows = {**dims, "BLOCK": pass_rows(spec)}
        # packed batches: each sequence's first query and key row, and the packed query rows
        # (LSE and delta are (Hq, Tq))
        cu_q, cu_qk = (tensors("CU_Q", "i32"), tensors("CU_Q CU_K", "i32")) if spec.varlen else ((), ())
        tq = ints("Tq") if spec.varlen else ()
        sums_rows = "Tq" if spec.varlen else "Nq"  # (dQ's sums of a packed batch: (Hq, Tq, D))
        delta = Kernel(
            "attn_bwd_delta",
            tensors("O", "out")
            + tensors("DO")
            + tensors("DELTA", "fp32")
            + cu_q
            + self._strides("O DO")
            + ints("Hq Nq")
            + tq,
            rows,
            passes,
        )
        dq_store = Kernel(
            "attn_bwd_dq_store",
            tensors("DQACC", "fp32") + tensors("DQ") + STRIDES["DQ"] + ints(f"Hq {sums_rows}") + floats("sm_scale"),
            rows,
            passes,
        )
        # Host descriptors (loads=tma_host): block_m rows of what a program owns, block_n of what
        # a step takes; with dq_mode tma_reduce dK/dV also adds each step's fp32 dQ through one
        dp, m, n = spec.head_dim_padded, params.block_m, params.block_n
        dkdv = {t: (1, 1, m if t in ("K", "V", "DK", "DV") else n, dp) for t in ("Q", "K", "V", "DO", "DK", "DV")}
        if params.dq_mode == "tma_reduce":
            dkdv["DQACC"] = (1, 1, n, dp)
        dq = {t: (1, 1, m if t in ("Q", "DO", "DQ") else n, dp) for t in ("Q", "K", "V", "DO", "DQ")}
        if params.loads != "tma_host":
            dkdv = dq = {}
        # (each takes every tensor's strides, descriptors or not)
        scales = floats("softcap") + ints("win_left win_right")
        inputs = tensors("Q K V DO") + tensors("LSE DELTA", "fp32")
        sums = tensors("DQACC", "fp32") if params.dq_mode != "separate" else ()
        dkdv_args = (
            inputs + tensors("DK DV") + sums + cu_qk + self._strides("Q K V DO DK DV") + self.sizes("Hkv") + scales
        )
        dq_args = inputs + tensors("DQ") + cu_qk + self._strides("Q K V DO DQ") + self.sizes("Hq") + scales
        extra = tq + alibi_args(spec) + dropout_args(spec)
        dkdv_args, dq_args = dkdv_args + extra, dq_args + extra
        # dQ in a kernel of its own, or added into fp32 sums by the dK/dV kernel and stored by a pass
        last = Kernel("attn_bwd_dq", dq_args, tiles, options, dq) if params.dq_mode == "separate" else dq_store
        return (delta, Kernel("attn_bwd_dkdv", dkdv_args, tiles, options, dkdv), last)

    @staticmethod
    def _strides(names: str):
        return tuple(a for t in names.split() for a in STRIDES[t])

    def smem(self, spec, params):
        # the P and dS tiles; with dq_mode tma_reduce also the fp32 dQ tile staged for its bulk
        # reduction
        staged_dq = params.block_n * spec.head_dim_padded * 4 if params.dq_mode == "tma_reduce" else 0
        return (
            self.owned_and_streamed(spec, params) + 2 * params.block_m * params.block_n * spec.element_bytes + staged_dq
        )

    def prune(self, arch, spec, params):
        # The Triton dK/dV kernel's dQ atomics lost every bucket of the H200 re-tune
        # (tuner.space.BWD_SPACES): on sm90 dq_mode atomic is the Gluon one pass only.
        if arch == "sm90" and params.dq_mode == "atomic":
            return (
                "dq_mode atomic on sm90 is the Gluon one pass (gluon=1); the Triton kernel's atomics lost every bucket"
            )
        return None
