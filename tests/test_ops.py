"""fa2gen's custom operators: torch.library.opcheck on each (schema, fake implementation,
autograd registration, AOT dispatch), and torch.compile(fullgraph=True) over the public
functions with no graph break and no recompilation past the dynamic-shape one."""

import pytest
import torch
from helpers import rand_fp8, rand_qkv
from test_kvcache import cache_inputs
from test_varlen import packed
from torch._dynamo.utils import counters

import fa2gen
from fa2gen.runtime import ops  # noqa: F401  (registers the operators)
from fa2gen.runtime.dropout import draw_seed


def leaves(*tensors):
    return tuple(t.detach().clone().requires_grad_() for t in tensors)


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "shape, options",
    [
        ((1, 2, 2, 17, 17, 64), (False, None, -1, -1, 0.0, False, None, 0.0)),
        ((2, 4, 2, 21, 33, 40), (True, 0.3, -1, 0, 5.0, True, None, 0.0)),
        ((1, 2, 1, 9, 30, 32), (False, None, 4, 2, 0.0, False, "alibi", 0.2)),
    ],
    ids=["plain", "gqa-causal-softcap", "window-alibi-dropout"],
)
def test_opcheck_attention_and_its_backward(shape, options):
    q, k, v = leaves(*rand_qkv(*shape, seed=sum(shape)))
    options = list(options)
    if options[6] == "alibi":
        options[6] = torch.linspace(0.1, 0.5, shape[1])
    seed = draw_seed("cpu") if options[7] > 0 else None
    torch.library.opcheck(torch.ops.fa2gen.attention.default, (q, k, v, *options, seed))
    out, lse = torch.ops.fa2gen.attention(q, k, v, *options, seed)
    dout = torch.randn_like(out)
    args = (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, *options, seed)
    torch.library.opcheck(torch.ops.fa2gen.attention_backward.default, args)


@pytest.mark.interpreter
def test_opcheck_fp8_varlen_and_kvcache():
    (q, k, v), descales = rand_fp8(1, 2, 2, 19, 23, 64)
    # (opcheck's schema test compares tensors with arithmetic that PyTorch lacks for fp8: the others)
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    fp8_args = (q, k, v, True, None, -1, 0, 0.0, *descales)
    torch.library.opcheck(torch.ops.fa2gen.attention_fp8.default, fp8_args, test_utils=utils)
    q, k, v, cq, ck = packed([5, 0, 13], [7, 3, 13], Hq=4, Hkv=2, D=32, seed=1)
    q, k, v = leaves(q, k, v)
    options = (cq, ck, 13, 13, True, None, -1, 0, 0.0, False, None, 0.0, None)
    torch.library.opcheck(torch.ops.fa2gen.attention_varlen.default, (q, k, v, *options))
    out, lse = torch.ops.fa2gen.attention_varlen(q, k, v, *options)
    args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, *options)
    torch.library.opcheck(torch.ops.fa2gen.attention_varlen_backward.default, args)
    q, kc, vc, lens, table, k, v = cache_inputs(2, 2, 4, 2, 64, 40, [3, 20], page=16, new=2, seed=2)
    args = (q, kc, vc, lens, table, k, v, True, None, -1, 0, 0.0, None)
    torch.library.opcheck(torch.ops.fa2gen.attention_with_kvcache.default, args)


class Layer(torch.nn.Module):
    """A small attention layer: projections, fa2gen.attention with GQA, an output projection."""

    def __init__(self, dim=64, heads=4, kv_heads=2, head_dim=32):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = torch.nn.Linear(dim, heads * head_dim, dtype=torch.float16)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * head_dim, dtype=torch.float16)
        self.o = torch.nn.Linear(heads * head_dim, dim, dtype=torch.float16)

    def forward(self, x, dropout_p=0.0):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, self.head_dim).unbind(2)
        out = fa2gen.attention(q, k.transpose(1, 2), v.transpose(1, 2), causal=True, dropout_p=dropout_p)
        return self.o(out.transpose(1, 2).reshape(b, n, -1))


@pytest.mark.interpreter
def test_compiled_layer_matches_eager_with_no_graph_break_and_one_dynamic_recompile():
    torch.manual_seed(0)
    layer = Layer()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    for n in (24, 37, 51):  # three sequence lengths
        x = torch.randn(2, n, 64, dtype=torch.float16)
        for model in (compiled, layer):
            model.zero_grad()
        want = layer(x)
        want.float().square().sum().backward()
        eager_grads = [p.grad.clone() for p in layer.parameters()]
        layer.zero_grad()
        got = compiled(x)
        got.float().square().sum().backward()
        assert torch.equal(got, want)
        assert all(torch.equal(p.grad, g) for p, g in zip(layer.parameters(), eager_grads))
    assert not counters["graph_break"]
    # the first length compiles statically, the second marks the length dynamic; the third reuses it
    assert counters["stats"]["unique_graphs"] == 2


@pytest.mark.interpreter
def test_compiled_dropout_draws_a_seed_per_call_and_repeats_under_a_manual_seed():
    torch.manual_seed(1)
    layer = Layer()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(1, 20, 64, dtype=torch.float16)
    torch.manual_seed(5)
    a = compiled(x, 0.3)
    b = compiled(x, 0.3)
    torch.manual_seed(5)
    assert torch.equal(compiled(x, 0.3), a) and not torch.equal(a, b)
    torch.manual_seed(5)
    assert torch.equal(layer(x, 0.3), a)  # the same seeds as eager draws


@pytest.mark.interpreter
def test_compiled_varlen_and_kvcache_calls():
    q, k, v, cq, ck = packed([5, 0, 13], [7, 3, 13], Hq=4, Hkv=2, D=32, seed=3)

    def varlen(q, k, v, cq, ck):
        return fa2gen.attention_varlen(q, k, v, cq, ck, 13, 13, causal=True)

    counters.clear()
    got = torch.compile(varlen, fullgraph=True, backend="aot_eager")(q, k, v, cq, ck)
    assert torch.equal(got, varlen(q, k, v, cq, ck)) and not counters["graph_break"]
    q, kc, vc, lens, table, k, v = cache_inputs(2, 1, 4, 2, 64, 40, [3, 20], page=16, new=1, seed=4)
    kc2, vc2 = kc.clone(), vc.clone()

    def step(q, kc, vc, lens, table, k, v):
        return fa2gen.attention_with_kvcache(q, kc, vc, lens, block_table=table, k=k, v=v)

    got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, kc, vc, lens, table, k, v)
    want = step(q, kc2, vc2, lens, table, k, v)
    assert torch.equal(got, want) and torch.equal(kc, kc2) and torch.equal(vc, vc2)  # the append happened
    assert not counters["graph_break"]


# -- GPU ------------------------------------------------------------------------------------


def _gpu_layer():
    torch.manual_seed(0)
    return Layer(dim=256, heads=8, kv_heads=2, head_dim=64).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["inductor", "cuda-graphs"])
def test_inductor_and_cuda_graphs_match_eager_forward_and_backward(mode):
    layer = _gpu_layer()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(layer, fullgraph=True, mode=mode)
    for n in (300, 517, 1024, 517):  # a length seen before replays its graph
        x = torch.randn(2, n, 256, device="cuda", dtype=torch.float16)
        layer.zero_grad()
        want = layer(x)
        want.float().square().mean().backward()
        eager_grads = [p.grad.clone() for p in layer.parameters()]
        for _ in range(3):  # (cudagraph trees record on a later run; every run must match)
            layer.zero_grad()
            got = compiled(x)
            got.float().square().mean().backward()
            torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
            for p, g in zip(layer.parameters(), eager_grads):
                torch.testing.assert_close(p.grad, g, atol=2e-2, rtol=2e-2)
    assert not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] <= 2
