"""runtime.binding: a kernel's argument list from its descriptor's arguments."""

import pytest
import torch

from fa2gen.generator.descriptors import Kernel
from fa2gen.generator.descriptors.base import Arg, floats, ints, strides, tensors
from fa2gen.runtime.binding import Binding


def _kernel(boxes=None):
    args = tensors("Q") + tensors("K", "fp32") + strides("Q", "sqb sqh sqm") + ints("Nq H") + floats("sm_scale")
    return Kernel("k", args, boxes=boxes or {})


def test_a_binding_fills_the_kernels_arguments_in_order():
    q = torch.empty(2, 3, 5, 8).transpose(1, 2)  # strides not contiguous
    k = torch.empty(2, 3, 4, 8)
    made = []

    def maker(name, box):
        made.append((name, box))
        return lambda t: ("descriptor", name, box, t)

    bind = Binding(_kernel({"K": (1, 1, 4, 8)}), {"Nq": 5, "sm_scale": 0.25, "Q": "ignored"}, maker)
    assert made == [("K", (1, 1, 4, 8))]  # descriptor makers are built once, not per call
    for h in (3, 7):  # numbers not fixed come from the call
        args = bind({"Q": q, "K": k, "H": h})
        assert args[0] is q and args[1] == ("descriptor", "K", (1, 1, 4, 8), k)
        assert args[2:5] == list(q.stride()[:3]) and args[5:] == [5, h, 0.25]


def test_a_binding_reads_a_permuted_tensors_strides_without_the_view():
    q = torch.empty(2, 3, 5, 8)  # given as (B, H, N, D); the kernel's dims are (B, N, H)
    bind = Binding(_kernel(), {"Nq": 5, "sm_scale": 0.25}, dims={"Q": (0, 2, 1, 3)})
    args = bind({"Q": q, "K": torch.empty(1), "H": 3})
    assert args[0] is q and args[2:5] == list(q.transpose(1, 2).stride()[:3])


def test_a_binding_refuses_what_it_cannot_bind():
    with pytest.raises(ValueError, match="takes K as a host descriptor"):
        Binding(_kernel({"K": (1, 1, 4, 8)}), {})
    bind = Binding(_kernel(), {"Nq": 5, "sm_scale": 0.25})
    with pytest.raises(KeyError, match="H"):
        bind({"Q": torch.empty(1, 1, 1, 8), "K": torch.empty(1, 1, 1, 8)})


@pytest.mark.parametrize(
    "kind, dtype", [("tensor", ""), ("tensor", "fp16"), ("stride", "in"), ("int", "fp32"), ("pointer", "")]
)
def test_an_argument_declares_a_known_kind_and_only_a_tensor_an_element_type(kind, dtype):
    with pytest.raises(ValueError, match="argument x"):
        Arg("x", kind, dtype)
