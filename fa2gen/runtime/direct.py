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

import os

import torch

def _enabled() -> bool:
    value = os.environ.get("FA2GEN_DIRECT_LAUNCH", "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"FA2GEN_DIRECT_LAUNCH must be 0 (launch through Triton) or 1 (the default), got {value!r}")
    return value != "0"


ENABLED = _enabled()


def signature(args) -> tuple:
    """What of a launch's arguments can change its specialisation from call to call: int
    values, and tensors' dtypes and 16-byte alignment. (Descriptors and floats contribute
    nothing.)"""
    return tuple(a if a.__class__ is int else (a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
                 else None for a in args)


class DirectKernel:
    """One compiled kernel of a kept launch, with its grid and the constexpr arguments that
    follow the positional ones, and the signature of the call it was kept from."""

    __slots__ = ("device", "grid", "signature", "tail", "run", "function", "metadata", "modes", "hooks", "_driver",
                 "_knobs")

    @classmethod
    def keep(cls, kernel, grid, args, options) -> "DirectKernel | None":
        """After ``kernel[grid](*args, **options)`` has run: the kernel to launch directly, or
        None where it cannot be (the interpreter, launch or pre-run hooks set, a Triton
        without these pieces)."""
        from ..generator.cache import interpreting

        if interpreting():  # the interpreter's kernels run Python: nothing to skip
            return None
        try:
            from triton import knobs
            from triton.runtime.driver import driver

            if _hooked(knobs) or kernel.pre_run_hooks:
                return None
            device = driver.active.get_current_device()
            compiled = kernel.warmup(*args, grid=grid, **options)  # the kernel the launch ran
            binder = kernel.device_caches[device][4]
            values = tuple(binder(*args, **options)[0].values())
            run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
        except Exception:  # noqa: BLE001 - no such pieces (the interpreter, another Triton, no kernel)
            return None
        if len(values) < len(args) or any(a is not b for a, b in zip(values, args)):
            return None  # positional arguments that are not the kernel's leading parameters
        self = cls()
        self.device = device
        self.grid = (tuple(grid) + (1, 1))[:3]
        self.signature = signature(args)
        self.tail = values[len(args):]
        self.run, self.function, self.metadata = run, function, metadata
        self.modes = _modes(knobs)
        self.hooks = kernel.pre_run_hooks  # Triton's own list: hooks added later show in it
        self._driver, self._knobs = driver.active, knobs
        return self

    def __call__(self, args) -> bool:
        """Launch on ``args`` if they specialise as the kept call's did (True); else do
        nothing (False) and let the caller launch through Triton."""
        knobs = self._knobs
        if signature(args) != self.signature or _hooked(knobs) or _modes(knobs) != self.modes or self.hooks:
            return False
        drv = self._driver
        device = drv.get_current_device()
        if device != self.device:
            return False
        self.run(*self.grid, drv.get_current_stream(device), self.function, self.metadata, None, None, None,
                 *args, *self.tail)
        return True


def _hooked(knobs) -> bool:
    # Triton's launch hooks are chains, empty unless something (a profiler) added to them; a
    # hook set in their place is a plain callable.
    return any(h is not None and bool(getattr(h, "calls", True))
               for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def _modes(knobs) -> tuple:
    # Triton settings outside the arguments that pick another compiled kernel
    return knobs.runtime.debug, knobs.compilation.instrumentation_mode


def launch(kept: dict, name, kernel, grid, args, options) -> None:
    """``kernel[grid](*args, **options)``, through the launcher kept under ``name`` (any
    key naming the kernel) in ``kept`` (a kept launch's own dict) where the call fits it.
    The first launch goes through Triton and, when enabled, keeps the launcher for the next."""
    direct = kept.get(name)
    if direct and direct(args):
        return
    kernel[grid](*args, **options)
    if direct is None and ENABLED:
        kept[name] = DirectKernel.keep(kernel, grid, args, options) or False  # False: never
