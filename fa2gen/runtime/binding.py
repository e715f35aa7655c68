"""A kernel's argument list from its descriptor's ``Kernel.args``, resolved once per kept launch.

A launch names what it has: tensors by their argument names (Q, DK, LSE, ...) and numbers
(Nq, sm_scale, ...). ``Binding`` turns a kernel's arguments into steps once, so that a call
only fills them in: the numbers fixed for the launch are constants, the rest come from the
call's own values, strides from the tensors' and host descriptors over the tensors the
kernel's ``boxes`` name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..generator.descriptors import Kernel

# step codes
_CONSTANT, _GIVEN, _STRIDE, _DESCRIPTOR = range(4)


class Binding:
    """The argument list of one kernel of a kept launch.

    ``fixed``: the numbers known when the launch is built, by argument name (the call gives the
    others). ``descriptor``: makes the host descriptor over a tensor for argument ``name``:
    ``descriptor(name, box)`` returns a function of the tensor (a Gluon one carries a layout)."""

    __slots__ = ("kernel", "_steps")

    def __init__(
        self,
        kernel: Kernel,
        fixed: Mapping[str, int | float],
        descriptor: Callable[[str, tuple[int, ...]], Callable] | None = None,
    ):
        self.kernel = kernel
        steps = []
        for arg in kernel.args:
            if arg.kind == "stride":
                steps.append((_STRIDE, arg.of, arg.dim))
            elif arg.kind == "tensor" and arg.name in kernel.boxes:
                if descriptor is None:
                    raise ValueError(f"{kernel.name} takes {arg.name} as a host descriptor: the launch must make one")
                steps.append((_DESCRIPTOR, arg.name, descriptor(arg.name, kernel.boxes[arg.name])))
            elif arg.kind != "tensor" and arg.name in fixed:
                steps.append((_CONSTANT, fixed[arg.name], None))
            else:
                steps.append((_GIVEN, arg.name, None))
        self._steps = tuple(steps)

    def __call__(self, given: Mapping) -> list:
        """The arguments, in the kernel's order, from the call's tensors and numbers by name."""
        args = []
        for code, a, b in self._steps:
            if code == _CONSTANT:
                args.append(a)
            elif code == _GIVEN:
                args.append(given[a])
            elif code == _STRIDE:
                args.append(given[a].stride(b))
            else:
                args.append(b(given[a]))
        return args
