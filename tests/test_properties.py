"""Property tests: random valid calls of attention() (shapes, GQA ratios, head dims, masks,
windows, softcaps, dtypes, layouts) under the interpreter, forward and backward, judged against
the reference by flash-attention's rule. Seeded (derandomised) and bounded in examples, so a CI
run is repeatable; every failure found goes into ``property_corpus.json`` and is run first, by
name, on every run after. The same generator with lengths up to 4k and head dims up to 256
runs on the GPU (marker ``gpu``)."""

import json
from pathlib import Path

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fa2gen  # noqa: E402
from fa2gen.bench.correctness import check_backward, check_forward  # noqa: E402
from fa2gen.runtime.problem import make_problem  # noqa: E402

CORPUS = Path(__file__).with_name("property_corpus.json")
EXAMPLES = 30  # per property: about a minute of interpreter time each


@st.composite
def calls(draw, longest: int = 70, dims=(16, 24, 32, 40, 64, 72, 96, 128), window: int = 40):
    """One valid call: its shapes (B, Hq, Hkv, Nq, Nk, D) and attention() options."""
    hkv = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 3, 4]))
    shape = (
        draw(st.integers(1, 2)),
        hkv * group,
        hkv,
        draw(st.integers(1, longest)),
        draw(st.integers(1, longest)),
        draw(st.sampled_from(dims)),
    )
    options = {}
    kind = draw(st.sampled_from(["none", "causal", "window", "causal-window"]))
    if kind in ("causal", "causal-window"):
        options["causal"] = True
    if kind in ("window", "causal-window"):
        options["window_size"] = (draw(st.integers(-1, window)), draw(st.integers(-1, window)))
    if draw(st.booleans()):
        options["softcap"] = draw(st.sampled_from([2.0, 7.5, 30.0]))
    if draw(st.booleans()):
        options["sm_scale"] = draw(st.sampled_from([0.05, 0.3, 1.0]))
    dtype = draw(st.sampled_from(["fp16", "bf16"]))
    layout = draw(st.sampled_from(["bhnd", "bnhd"]))
    return {"shape": shape, "options": options, "dtype": dtype, "layout": layout, "seed": draw(st.integers(0, 99))}


def inputs(case, device="cpu"):
    from helpers import rand_qkv

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[case["dtype"]]
    return rand_qkv(*case["shape"], dtype=dtype, seed=case["seed"], layout=case["layout"], device=device)


def judge(case, backward: bool, device="cpu") -> None:
    q, k, v = inputs(case, device)
    options = {k: tuple(v) if k == "window_size" else v for k, v in case["options"].items()}
    problem = make_problem(q, k, v, **options)
    leaves = [t.detach().clone().requires_grad_(backward) for t in (q, k, v)]
    out, lse = fa2gen.attention(*leaves, return_lse=True, **options)
    verdict = check_forward(q, k, v, problem, out.detach(), lse)
    assert verdict.ok, f"{case}: {verdict}"
    if backward:
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(case["seed"])).to(out.dtype).to(device)
        out.backward(dout)
        grads = check_backward(q, k, v, problem, dout, *(t.grad for t in leaves))
        assert grads.ok, f"{case}: {grads}"


def corpus() -> list[dict]:
    return json.loads(CORPUS.read_text())["cases"]


@pytest.mark.interpreter
@pytest.mark.parametrize("case", corpus(), ids=lambda c: c["name"])
def test_past_failures_pass(case):
    judge(case, backward=case.get("backward", True))


_SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same examples every run: repeatable, no database needed
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.interpreter
@_SETTINGS
@given(calls())
def test_random_calls_match_the_reference_forward(case):
    judge(case, backward=False)


@pytest.mark.interpreter
@_SETTINGS
@given(calls())
def test_random_calls_match_the_reference_backward(case):
    judge(case, backward=True)


GPU_CALLS = calls(longest=4096, dims=(32, 64, 72, 96, 128, 160, 192, 256), window=1024)
GPU_SHARDS = 6  # seeded shards: separate tests, so that parallel workers share the examples


def _gpu_property(shard: int, backward: bool):
    @pytest.mark.gpu
    @settings(_SETTINGS, max_examples=8 if backward else 10, derandomize=False)
    @hypothesis.seed(shard)
    @given(GPU_CALLS)
    def test(case):
        judge(case, backward=backward, device="cuda")

    return test


for _shard in range(GPU_SHARDS):
    globals()[f"test_random_larger_calls_on_the_gpu_forward_{_shard}"] = _gpu_property(_shard, False)
    globals()[f"test_random_larger_calls_on_the_gpu_backward_{_shard}"] = _gpu_property(_shard, True)
