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


class Binding:
    """The argument list of one kernel of a kept launch.

    ``fixed``: the numbers known when the launch is built, by argument name (the call gives the
    others). ``descriptor``: makes the host descriptor over a tensor for argument ``name``:
    ``descriptor(name, box)`` returns a function of the tensor (a Gluon one carries a layout).
    ``dims``: for tensors given in another dim order than the kernel's, by argument name, the
    given tensor's dim that holds each of the kernel's dims (a permuted view's strides, read
    without making the view).

    A call copies the list of constants, then fills in each tensor it names (its argument, and
    its strides as one slice where they are consecutive) and the numbers it gives: short
    problems are bound by host time, and a backward call binds about 70 arguments."""

    __slots__ = ("kernel", "_constants", "_tensors", "_numbers")

    def __init__(
        self,
        kernel: Kernel,
        fixed: Mapping[str, int | float],
        descriptor: Callable[[str, tuple[int, ...]], Callable] | None = None,
        dims: Mapping[str, tuple[int, ...]] | None = None,
    ):
        self.kernel = kernel
        self._constants = [None] * len(kernel.args)
        tensors: dict[str, list] = {}  # name: [position, maker, [(dim, position), ...]]
        numbers = []
        for i, arg in enumerate(kernel.args):
            if arg.kind == "stride":
                dim = arg.dim if dims is None or arg.of not in dims else dims[arg.of][arg.dim]
                tensors.setdefault(arg.of, [-1, None, []])[2].append((dim, i))
            elif arg.kind == "tensor":
                entry = tensors.setdefault(arg.name, [-1, None, []])
                entry[0] = i
                if arg.name in kernel.boxes:
                    if descriptor is None:
                        raise ValueError(
                            f"{kernel.name} takes {arg.name} as a host descriptor: the launch must make one"
                        )
                    entry[1] = descriptor(arg.name, kernel.boxes[arg.name])
            elif arg.name in fixed:
                self._constants[i] = fixed[arg.name]
            else:
                numbers.append((arg.name, i))
        self._tensors = tuple((name, pos, make, _slices(strides)) for name, (pos, make, strides) in tensors.items())
        self._numbers = tuple(numbers)

    def __call__(self, given: Mapping) -> list:
        """The arguments, in the kernel's order, from the call's tensors and numbers by name."""
        args = self._constants.copy()
        for name, pos, make, strides in self._tensors:
            t = given[name]
            if pos >= 0:
                args[pos] = t if make is None else make(t)
            if strides:
                st = t.stride()
                for dims, where in strides:
                    args[where] = st[dims]
        for name, pos in self._numbers:
            args[pos] = given[name]
        return args


def _slices(strides: list[tuple[int, int]]) -> tuple:
    """(dims, positions) pairs for a tensor's strides: one pair of slices where dims and
    positions both run on by one, else a pair of ints per stride."""
    dims = [d for d, _ in strides]
    where = [p for _, p in strides]
    n = len(strides)
    if n > 1 and dims == list(range(dims[0], dims[0] + n)) and where == list(range(where[0], where[0] + n)):
        return ((slice(dims[0], dims[0] + n), slice(where[0], where[0] + n)),)
    return tuple(strides)
