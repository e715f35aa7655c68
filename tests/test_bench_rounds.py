"""The bench's timing in rounds, with a stand-in window (a seam: it records the order and
returns chosen run times where the bench runs do_bench on the GPU)."""

import pytest

from fa2gen.bench.timing import time_in_rounds


class Windows:
    """Stand-in for do_bench: each window of provider ``name`` returns ``times[name]``, and
    the order of the windows is kept."""

    def __init__(self, times, fail=()):
        self.times, self.fail, self.order = times, fail, []

    def __call__(self, fn):
        name = fn()
        self.order.append(name)
        if name in self.fail:
            raise RuntimeError(f"{name} refused\nsecond line")
        return list(self.times[name])


def calls(*names):
    return {n: (lambda n=n: n) for n in names}


def test_providers_take_turns_in_reversed_order_every_other_round():
    w = Windows({"a": [1.0], "b": [1.0], "c": [1.0]})
    time_in_rounds(calls("a", "b", "c"), w, rounds=4)
    assert w.order == ["a", "b", "c", "c", "b", "a", "a", "b", "c", "c", "b", "a"]


def test_percentiles_pool_every_window():
    # one slow window out of four moves the 80th percentile, not the median
    w = Windows({"a": [1.0, 1.0, 1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0, 2.0, 2.0]})
    slow = iter([False, False, True, False])  # a's third window is slow

    def window(fn):
        times = w(fn)
        return [t * 3 for t in times] if fn() == "a" and next(slow) else times

    got = time_in_rounds(calls("a", "b"), window, rounds=4)
    assert got["b"] == pytest.approx([2.0, 2.0, 2.0])
    p20, median, p80 = got["a"]
    assert p20 == pytest.approx(1.0) and median == pytest.approx(1.0)
    assert p80 == pytest.approx(3.0)  # 20 runs, the last 5 sorted slow: the 80th percentile is the 16th


def test_a_provider_that_fails_while_timed_is_reported_and_the_others_still_timed():
    w = Windows({"a": [1.0], "b": [2.0]}, fail=("a",))
    got = time_in_rounds(calls("a", "b"), w, rounds=2)
    assert isinstance(got["a"], RuntimeError) and str(got["a"]).startswith("a refused")
    assert got["b"] == pytest.approx([2.0, 2.0, 2.0])
    assert w.order == ["a", "b", "b"]  # a is not timed again once it failed


@pytest.mark.parametrize("rounds", [0, -1, 1.5, True])
def test_rounds_must_be_a_positive_int(rounds):
    with pytest.raises(ValueError, match="rounds"):
        time_in_rounds(calls("a"), Windows({"a": [1.0]}), rounds=rounds)


def test_a_failure_is_reported_by_its_type_and_first_line():
    from fa2gen.bench.runner import _why

    assert _why(RuntimeError("a refused\nsecond line")) == "RuntimeError: a refused"
