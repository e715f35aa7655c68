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
