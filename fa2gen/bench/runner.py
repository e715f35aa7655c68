"""Run benchmark cases across providers and collect TFLOP/s side by side."""

from __future__ import annotations

import datetime
import math
import platform
from dataclasses import asdict, dataclass, field

import torch

from .grid import Case, make_inputs
from .providers import PROVIDERS


MODES = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # FLOPs relative to the forward pass


@dataclass
class Result:
    case: Case
    mode: str = "fwd"
    tflops: dict[str, float] = field(default_factory=dict)  # provider -> TFLOP/s (median)
    ms: dict[str, list[float]] = field(default_factory=dict)  # provider -> [p20, median, p80]
    skipped: dict[str, str] = field(default_factory=dict)  # provider -> reason
    max_diff: dict[str, float] = field(default_factory=dict)  # provider -> max |out - fa2gen out|

    def to_dict(self) -> dict:
        return {"case": asdict(self.case), "mode": self.mode, "label": self.case.label(), "tflops": self.tflops,
                "ms": self.ms,
                "skipped": self.skipped, "max_diff_vs_fa2gen": self.max_diff}


def _time_cpu(fn, reps: int = 3) -> list[float]:
    import time

    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return [samples[0], samples[len(samples) // 2], samples[-1]]


def warm_gpu(ms: float = 100.0) -> None:
    """Keep the GPU busy for ``ms`` so that every provider is timed at working clocks.

    Without it the first provider after a long host-side pause (FlexAttention's
    compile) is timed while the clocks ramp up, which biases short cells.
    """
    import time

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


ROUNDS = 4  # timing windows per provider and cell (time_in_rounds)
# How a GPU run timed its providers, recorded with its results (tables written from runs
# without it timed one window per provider, after the same warm-up)
TIMING = (f"{ROUNDS} do_bench windows per provider, each after the same 100 ms of matmuls, "
          "the providers' order reversed every other round; percentiles over all runs")


def _window(fn) -> list[float]:
    """One do_bench window: every run's time (ms), L2 flushed before each. The GPU is warmed
    first, so that every window starts from the same state of its clocks, whichever provider
    ran before it."""
    from triton.testing import do_bench

    warm_gpu()
    return do_bench(fn, warmup=10, rep=50, return_mode="all")


def time_in_rounds(calls: dict, window, rounds: int = ROUNDS) -> dict:
    """[p20, median, p80] ms per provider from ``rounds`` windows each, or why it failed.

    The providers take turns, the order reversed every other round, so that each provider's
    windows sit at the same average place in the cell: the GPU's clocks drift by 5-15% over
    seconds, and with one window per provider a slow stretch decided a cell for whichever
    provider it fell on (perf-notes, "The bench timed in rounds"). ``window(fn)`` returns a
    window's run times; the bench passes ``_window`` (do_bench), CPU tests a stand-in that
    records the order.
    """
    if type(rounds) is not int or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    samples: dict[str, list[float]] = {name: [] for name in calls}
    failed: dict[str, str] = {}
    order = list(calls)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            if name in failed:
                continue
            try:
                samples[name] += window(calls[name])
            except Exception as e:  # a provider that fails while timed is reported, not fatal
                failed[name] = _why(e)
    return {name: failed.get(name) or _quantiles(samples[name]) for name in calls}


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def _quantiles(times: list[float]) -> list[float]:
    t = torch.tensor(times, dtype=torch.float64)
    return [float(x) for x in torch.quantile(t, torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64))]


def timed_call(forward_fn, mode: str, inputs, dout):
    """What to time for ``mode``: the forward; the backward alone, through a graph kept by
    one forward; or both. Each returns the tensors compared across providers."""
    if mode == "fwd":
        return forward_fn
    if mode == "bwd":
        out = forward_fn()
        return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)
    return lambda: torch.autograd.grad(forward_fn(), inputs, dout)


def _max_diff(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(_max_diff(x, y) for x, y in zip(a, b))
    return float((a.float() - b.float()).abs().max())


def _has_nan(x) -> bool:
    if isinstance(x, (tuple, list)):
        return any(_has_nan(t) for t in x)
    return bool(torch.isnan(x).any())


def run_case(case: Case, providers: list[str], device: torch.device, *, seed: int = 0, mode: str = "fwd") -> Result:
    q, k, v = make_inputs(case, device, seed=seed)
    fp8 = case.dtype.startswith("fp8")
    if fp8 and mode != "fwd":
        raise ValueError(f"{case.dtype} is forward only; got mode {mode!r}")
    dout = None
    if mode != "fwd":
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        g = torch.Generator(device=device).manual_seed(seed + 1)
        dout = torch.randn(q.shape, generator=g, device=device, dtype=torch.float32).to(q.dtype)
    # e4m3 values are exact in bf16: providers without fp8 run on the same values
    wide = tuple(t.to(torch.bfloat16) for t in (q, k, v)) if fp8 else (q, k, v)
    result = Result(case, mode)
    outputs, calls = {}, {}
    for name in providers:
        prov = PROVIDERS[name]
        why = prov.unavailable(case, device)
        if why:
            result.skipped[name] = why
            continue
        try:
            inputs = (q, k, v) if prov.takes_fp8 else wide
            fn = timed_call(prov.build(case, *inputs), mode, inputs, dout)
            outputs[name] = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
                calls[name] = fn
            else:
                result.ms[name] = _time_cpu(fn)
        except Exception as e:  # a backend that refuses a shape is reported, not fatal
            result.skipped[name] = _why(e)
    if calls:
        for name, ms in time_in_rounds(calls, _window).items():
            if isinstance(ms, str):
                result.skipped[name] = ms
                outputs.pop(name, None)
            else:
                result.ms[name] = ms
        torch.cuda.empty_cache()
    for name, ms in result.ms.items():
        result.tflops[name] = MODES[mode] * case.flops() / (ms[1] * 1e-3) / 1e12
    ref = outputs.get("fa2gen")
    if ref is not None:
        if _has_nan(ref):
            result.skipped["fa2gen"] = "NaN in output"
            result.tflops.pop("fa2gen", None)
        for name, out in outputs.items():
            if name != "fa2gen":
                result.max_diff[name] = _max_diff(out, ref)
    return result


def geomean(values) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def environment(device: torch.device) -> dict:
    import triton

    import fa2gen

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "fa2gen": fa2gen.__version__,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "device": "cpu",
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   timing=TIMING)
    return env
