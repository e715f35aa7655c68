"""GPU timing through triton.testing.do_bench (median of warm runs, L2 flushed)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float

    def tflops(self, flops: float) -> float:
        return flops / (self.median_ms * 1e-3) / 1e12


def measure(fn, *, warmup_ms: int = 25, rep_ms: int = 100) -> Timing:
    """Time ``fn`` on the current CUDA device. do_bench flushes L2 before every run."""
    from triton.testing import do_bench

    p20, median, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.2, 0.5, 0.8])
    return Timing(median_ms=median, p20_ms=p20, p80_ms=p80)


def graph_replay(fn):
    """``fn`` captured into a CUDA graph (after three warm-up runs on a side stream), as a
    function that replays it: timing the replay leaves the host's part of the call out."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def kernel_ms(fn, names=(), *, calls: int = 10) -> dict[str, float]:
    """GPU time per call of each kernel ``fn`` launches (ms), from the PyTorch profiler: the
    kernels alone, without the host's part. A kernel whose name contains one of ``names``
    is counted under that name; the others under their own (first 60 characters)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names must be a sequence of kernel-name strings, got {names!r:.80}")
    if type(calls) is not int or calls < 1:
        raise ValueError(f"calls must be a positive int, got {calls!r}")
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type != DeviceType.CUDA:  # kernels, not their launches
            continue
        name = next((n for n in names if n in event.key), event.key[:60])
        out[name] = out.get(name, 0.0) + event.device_time_total / 1e3 / calls
    return out
