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


def warm_with(fn, ms: float = 100.0) -> None:
    """Run ``fn`` for ``ms``, so that the GPU's clocks settle where ``fn``'s own load holds them."""
    import time

    import torch

    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        for _ in range(4):
            fn()
        torch.cuda.synchronize()


def warm_gpu(ms: float = 100.0) -> None:
    """Keep the GPU busy with fp16 matmuls for ``ms`` (the A/B scripts' warm-up; the bench
    warms each window with the timed provider's own calls instead, ``warm_window``).

    Without it the first provider after a long host-side pause (FlexAttention's
    compile) is timed while the clocks ramp up, which biases short cells.
    """
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    warm_with(lambda: a @ a, ms)


ROUNDS = 4  # timing windows per provider and cell (time_in_rounds)
# How a GPU run timed its providers, recorded with its results (runs without it timed one
# window per provider, each after 100 ms of fp16 matmuls)
TIMING = (
    f"{ROUNDS} do_bench windows per provider, each after 100 ms of that provider's own calls, "
    "the providers' order reversed every other round; percentiles over all runs"
)


def warm_window(fn) -> list[float]:
    """One do_bench window: every run's time (ms), L2 flushed before each, after 100 ms of
    ``fn``'s own calls. Each provider is timed at the clocks its own load settles at,
    whatever ran before it. A warm-up by a foreign load (fp16 matmuls) left the window at that
    load's clocks: under the power limit the fp8 forward then read 10-18% slower, cuDNN
    3-15% on the H200, shifting the ratios."""
    from triton.testing import do_bench

    warm_with(fn)
    return do_bench(fn, warmup=10, rep=50, return_mode="all")


def time_in_rounds(calls: dict, window, rounds: int = ROUNDS) -> dict:
    """[p20, median, p80] ms per provider from ``rounds`` windows each, or the exception that
    stopped its timing (it is not timed again).

    The providers take turns, the order reversed every other round, so that each provider's
    windows sit at the same average place in the cell: the GPU's clocks drift by 5-15% over
    seconds, and with one window per provider a slow stretch decided a cell for whichever
    provider it fell on. ``window(fn)`` returns a window's run times; the bench passes
    ``warm_window``, CPU tests a stand-in that records the order.
    """
    if type(rounds) is not int or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    samples: dict[str, list[float]] = {name: [] for name in calls}
    failed: dict[str, Exception] = {}
    order = list(calls)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            if name in failed:
                continue
            try:
                samples[name] += window(calls[name])
            except Exception as e:  # a provider that fails while timed is reported, not fatal
                failed[name] = e
    return {name: failed[name] if name in failed else _quantiles(samples[name]) for name in calls}


def _quantiles(times: list[float]) -> list[float]:
    import torch

    t = torch.tensor(times, dtype=torch.float64)
    return [float(x) for x in torch.quantile(t, torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64))]


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
