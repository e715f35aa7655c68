"""Run benchmark cases across providers and collect TFLOP/s side by side."""

from __future__ import annotations

import datetime
import math
import platform
from dataclasses import asdict, dataclass, field

import torch

from .grid import Case, make_inputs
from .providers import PROVIDERS
from .timing import TIMING, time_in_rounds, warm_window

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
        return {
            "case": asdict(self.case),
            "mode": self.mode,
            "label": self.case.label(),
            "tflops": self.tflops,
            "ms": self.ms,
            "skipped": self.skipped,
            "max_diff_vs_fa2gen": self.max_diff,
        }


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


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


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
        for name, ms in time_in_rounds(calls, warm_window).items():
            if isinstance(ms, Exception):
                result.skipped[name] = _why(ms)
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
        env.update(
            device=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count, timing=TIMING
        )
    return env
