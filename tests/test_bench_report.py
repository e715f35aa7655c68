"""The bench's Markdown table marks the entries whose runs spread (an unsteady median)."""

from fa2gen.bench.grid import Case
from fa2gen.bench.report import UNSTEADY_MARK, markdown
from fa2gen.bench.runner import Result


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
