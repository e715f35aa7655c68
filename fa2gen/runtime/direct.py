"""Launching a kept launch's kernels through their compiled launchers, past Triton's
per-call dispatch (on unless FA2GEN_DIRECT_LAUNCH=0).

A launch through ``kernel[grid](...)`` binds the arguments, specialises each (a tensor by
its 16-byte alignment, an int by its value being 1 or a multiple of 16), builds a cache key
and looks the compiled kernel up: about 9 us of Python per launch on a desktop CPU, three
launches a backward call. A kept launch (``launch.Launch``, ``backward.BackwardLaunch``)
launches the same kernel with arguments that differ only in where the tensors live, so
after its first launch it can call the compiled kernel's launcher directly, as long as the
call specialises the same way: every int argument equal to the first call's, every tensor
argument aligned as it was (a descriptor's specialisation is its dtype, box and layout,
fixed by the launch). Any other call takes Triton's path, as does every call while a
launch hook (a profiler) is set.
"""

from __future__ import annotations

import operator
import os
import threading

import torch

from .. import compat


def _enabled() -> bool:
    value = os.environ.get("FA2GEN_DIRECT_LAUNCH", "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"FA2GEN_DIRECT_LAUNCH must be 0 (launch through Triton) or 1 (the default), got {value!r}")
    return value != "0"


ENABLED = _enabled()


def _none(args) -> tuple:
    return ()


class Signature:
    """What of a launch's arguments can change its specialisation from call to call: int
    values, and tensors' dtypes and 16-byte alignment (descriptors and floats: nothing), as
    the kept call had them. A kept launch binds each argument position to one kind
    (``Binding``), so the positions of its ints and tensors are found once, from the kept
    call, and each call reads only those (0.5 us a forward launch's arguments, on a CPU where
    testing every argument's kind took 1.5)."""

    __slots__ = ("count", "ints", "tensors", "kept")

    def __init__(self, args):
        self.count = len(args)
        ints = [i for i, a in enumerate(args) if a.__class__ is int]
        self.ints = operator.itemgetter(*ints) if ints else _none
        self.tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        self.kept = self._of(args)

    def _of(self, args) -> tuple:
        return self.ints(args), [(args[i].dtype, args[i].data_ptr() % 16 == 0) for i in self.tensors]

    def matches(self, args) -> bool:
        """Whether ``args`` (bound as the kept call's were) specialise as the kept call's did."""
        return len(args) == self.count and self._of(args) == self.kept


class DirectKernel:
    """One compiled kernel of a kept launch, with its grid, and the ``Signature`` of the call it
    was kept from."""

    __slots__ = ("grid", "signature", "launcher", "modes", "hooks")

    @classmethod
    def keep(cls, kernel, grid, args, options) -> "DirectKernel | None":
        """After ``kernel[grid](*args, **options)`` has run: the kernel to launch directly, or
        None where it cannot be (the interpreter, launch or pre-run hooks set, a Triton
        without these pieces)."""
        from ..generator.cache import interpreting

        if interpreting():  # the interpreter's kernels run Python: nothing to skip
            return None
        try:
            if compat.launch_hooked() or compat.pre_run_hooks(kernel):
                return None
        except Exception:  # noqa: BLE001 - a Triton without these pieces
            return None
        launcher = compat.keep_launcher(kernel, grid, args, options)
        if launcher is None:
            return None
        self = cls()
        self.grid = (tuple(grid) + (1, 1))[:3]
        self.signature = Signature(args)
        self.launcher = launcher
        self.modes = compat.launch_modes()
        self.hooks = compat.pre_run_hooks(kernel)  # Triton's own list: hooks added later show in it
        return self

    def __call__(self, args) -> bool:
        """Launch on ``args`` if they specialise as the kept call's did (True); else do
        nothing (False) and let the caller launch through Triton."""
        if (
            not self.signature.matches(args)
            or compat.launch_hooked()
            or compat.launch_modes() != self.modes
            or self.hooks
        ):
            return False
        launcher = self.launcher
        if launcher.current_device() != launcher.device:
            return False
        launcher(self.grid, args)
        return True


# Triton compiles on a cache miss in whichever thread launches, without a lock: threads whose
# first calls meet the same kernel at once would each compile it. A kept launch's first
# launch (where a compile can happen) holds its kernel's lock; later ones never wait.
_first_launch_locks: dict = {}
_locks_lock = threading.Lock()


def _first_launch_lock(kernel) -> threading.Lock:
    with _locks_lock:
        lock = _first_launch_locks.get(kernel)
        if lock is None:
            lock = _first_launch_locks[kernel] = threading.Lock()
        return lock


def warmup(kernel, grid, args, options) -> None:
    """Compile ``kernel`` for ``args`` as ``launch`` would run it, without running it."""
    with _first_launch_lock(kernel):
        kernel.warmup(*args, grid=grid, **compat.codegen(options))


def launch(kept: dict, name, kernel, grid, args, options) -> None:
    """``kernel[grid](*args, **options)``, through the launcher kept under ``name`` (any
    key naming the kernel) in ``kept`` (a kept launch's own dict) where the call fits it.
    The first launch goes through Triton, one thread at a time per kernel, and, when
    enabled, keeps the launcher for the next."""
    direct = kept.get(name)
    if direct and direct(args):
        return
    options = compat.codegen(options)  # off the kept path: a launch through Triton only
    if direct is None:
        with _first_launch_lock(kernel):
            kernel[grid](*args, **options)
        if ENABLED:
            kept[name] = DirectKernel.keep(kernel, grid, args, options) or False  # False: never
        return
    kernel[grid](*args, **options)
