"""The bench's Markdown table marks the entries whose runs spread (an unsteady median);
kernel_ms and graph_replay refuse bad arguments before they touch a GPU."""

import pytest

from fa2gen.bench.grid import Case
from fa2gen.bench.report import UNSTEADY_MARK, markdown
from fa2gen.bench.runner import Result
from fa2gen.bench.timing import graph_replay, kernel_ms


def _result(seqlen, fa2gen_ms, cudnn_ms):
    r = Result(Case(1, 2, seqlen, 64, False, "fp16"))
    for name, ms in (("fa2gen", fa2gen_ms), ("sdpa-cudnn", cudnn_ms)):
        r.ms[name] = ms
        r.tflops[name] = 1.0 / ms[1]
    return r


def test_only_entries_whose_runs_spread_are_marked():
    steady = _result(512, [1.0, 1.02, 1.1], [1.0, 1.0, 1.0])
    spread = _result(1024, [1.0, 1.3, 1.6], [2.0, 2.0, 2.1])
    text = markdown([steady, spread], ["fa2gen", "sdpa-cudnn"])
    rows = [line for line in text.splitlines() if line.startswith("| fp16")]
    assert UNSTEADY_MARK not in rows[0]
    assert rows[1].split(" | ")[1].endswith(UNSTEADY_MARK) and UNSTEADY_MARK not in rows[1].split(" | ")[2]
    assert "(1 entry)" in text


def test_a_steady_table_has_no_footnote():
    text = markdown([_result(512, [1.0, 1.0, 1.05], [1.0, 1.0, 1.0])], ["fa2gen", "sdpa-cudnn"])
    assert UNSTEADY_MARK not in text


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(fn=None), TypeError, "fn must be callable"),
        (dict(names="attn_bwd_dq"), TypeError, "names must be"),
        (dict(calls=0), ValueError, "calls must be a positive int"),
        (dict(calls=2.0), ValueError, "calls must be a positive int"),
    ],
)
def test_kernel_ms_names_the_bad_argument(kwargs, error, match):
    args = dict(fn=lambda: None, names=(), calls=1) | kwargs
    with pytest.raises(error, match=match):
        kernel_ms(args.pop("fn"), args.pop("names"), **args)


def test_graph_replay_names_the_bad_argument():
    with pytest.raises(TypeError, match="fn must be callable, got str"):
        graph_replay("attention")
