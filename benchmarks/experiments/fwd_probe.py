"""The forward kernels ncu profiles in benchmarks/results/ncu-probe-h200.txt: fa2gen's shipped
config and SDPA cuDNN on fp16 D=128 N=512 (B=32, H=16), full and causal; fp8 D=128 N=4k full
(B=4, H=16) with the shipped config and with the two-group Gluon form; bf16 D=128 N=4k full,
shipped and cuDNN. Each fa2gen kernel runs three times (the first compiles it), cuDNN twice.

usage (on the GPU machine):
  ncu --clock-control none --kernel-name regex:'attn_fwd|cudnn|fprop|sdpa' \\
      --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \\
      --section SchedulerStats --section Occupancy --section LaunchStats \\
      python benchmarks/experiments/fwd_probe.py > ncu-probe.txt
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa2gen.bench.grid import Case, make_inputs
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

TWO_GROUPS = TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host", gluon=2)


def run(tag: str, case: Case, params: TuningParams | None = None, cudnn: bool = False) -> None:
    q, k, v = make_inputs(case, torch.device("cuda"))
    if cudnn:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(2):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
        label = "cuDNN"
    else:
        problem = make_problem(q, k, v, causal=case.causal)
        params = params or select_params(problem, cuda_device_info(q.device.index or 0))
        for _ in range(3):  # the first compiles
            forward(q, k, v, problem, params)
        label = params.label()
    torch.cuda.synchronize()
    print(tag, label, flush=True)


def main() -> None:
    for causal in (False, True):
        case = Case(32, 16, 512, 128, causal, "fp16")
        name = "causal" if causal else "full"
        run(f"fp16 N=512 {name}", case)
        run(f"fp16 N=512 {name}", case, cudnn=True)
    fp8 = Case(4, 16, 4096, 128, False, "fp8e4m3")
    run("fp8 N=4k full", fp8)
    run("fp8 N=4k full", fp8, TWO_GROUPS)
    bf16 = Case(4, 16, 4096, 128, False, "bf16")
    run("bf16 N=4k full", bf16)
    run("bf16 N=4k full", bf16, cudnn=True)


if __name__ == "__main__":
    main()
