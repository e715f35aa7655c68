"""Compile a variant for a target arch ahead of time, without a GPU.

Triton compiles to PTX for any target on any machine, and its bundled ptxas assembles
and reports each kernel's registers and spills. That catches compiler failures and
register-starved tiles before any GPU time is spent (``fa2gen generate --compile-for``,
``benchmarks/registers.py``). Needs compiled (not interpreted) Triton: TRITON_INTERPRET
must be unset when the generated module is first imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

from .. import compat
from .cache import interpreting, load_module
from .descriptors import Kernel, plan, template_of
from .spec import KernelSpec, TuningParams

_TRITON_TYPES = {"fp16": "fp16", "bf16": "bf16", "fp8e4m3": "fp8e4nv", "fp32": "fp32", "i32": "i32", "i64": "i64"}


@dataclass(frozen=True)
class Resources:
    registers: int | None
    spill_bytes: int
    shared_bytes: int
    # ptxas's notes of a performance loss it chose: the register split of a warp-specialised
    # kernel ignored (every setmaxnreg dropped), or its wgmmas serialised for want of registers
    losses: tuple[str, ...] = ()


def _signature(fn, kernel: Kernel, spec: KernelSpec, constexprs: dict, layouts: bool = False) -> dict:
    """Each argument's type as a launch gives it, from the descriptor's ``Kernel.args``: host
    descriptors with their boxes (and, ``layouts``, a Gluon kernel's shared-memory layouts,
    part of its type), pointers, ints and floats; ``constexprs`` by name."""
    from .gluon import descriptor_layout

    args = {a.name: a for a in kernel.args}
    sig = {}
    for name in fn.arg_names:
        arg = args.get(name)
        if name in constexprs:
            sig[name] = "constexpr"
        elif arg is None:
            raise ValueError(f"{kernel.name} takes {name}, which its descriptor's arguments do not list")
        elif arg.kind == "tensor":
            dtype = kernel.element(spec, name)
            box = kernel.boxes.get(name)
            if box is None:
                sig[name] = f"*{_TRITON_TYPES[dtype]}"
            else:
                layout = f",{descriptor_layout(box, dtype)!r}" if layouts else ""
                sig[name] = f"tensordesc<{_TRITON_TYPES[dtype]}[{','.join(map(str, box))}]{layout}>"
        else:
            sig[name] = "fp32" if arg.kind == "float" else "i32"
    return sig


def _divisible(fn, signature: dict, spec: KernelSpec) -> list[str]:
    """The arguments a launch on the GPU specialises as divisible by 16, so that the binary
    measured here is the one that runs: Triton marks a pointer whose address and an integer
    whose value is divisible by 16 (``tt.divisibility``), which lets loads be vectorised
    and prefetched asynchronously. Pointers: torch allocations are 256-byte aligned.
    Strides: those of contiguous (B, H, N, D) tensors, divisible by 16 when D is (and N, for
    the batch and head strides, as on the paper's grid). Without these, q and dO load
    synchronously and the register and shared-memory figures describe a binary that never
    runs."""
    skip = set(getattr(fn, "do_not_specialize", ()) or ())
    skip |= {fn.arg_names[i] for i in skip if isinstance(i, int)}
    return [
        name
        for name in fn.arg_names
        if name not in skip
        and (
            signature[name].startswith("*")
            or (signature[name] == "i32" and name.startswith("stride") and spec.head_dim % 16 == 0)
        )
    ]


def _attrs(fn, signature: dict, spec: KernelSpec) -> dict:
    """A Triton kernel's ``_divisible`` arguments, by position."""
    return {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in _divisible(fn, signature, spec)}


def compiled_kernels(spec: KernelSpec, params: TuningParams, arch: str = "sm90"):
    """Each kernel of a variant (``descriptors.plan``) compiled for ``arch`` (e.g. "sm90",
    "sm80") as a GPU launch specialises it, without a GPU: yields (kernel name, Triton's
    compiled kernel)."""
    if interpreting():
        raise RuntimeError("compiling ahead needs compiled Triton: unset TRITON_INTERPRET")
    for module_params, kernel in plan(spec, params):
        module = load_module(spec, module_params)
        if module_params.gluon:
            yield kernel.name, _compile_gluon(module, spec, module_params, arch, kernel.name)
            continue
        fn = getattr(module, kernel.name)
        signature = _signature(fn, kernel, spec, kernel.constexprs)
        attrs = _attrs(fn, signature, spec)
        yield kernel.name, compat.compile_triton(fn, signature, kernel.constexprs, attrs, arch, kernel.options)


def _compile_gluon(module, spec: KernelSpec, params: TuningParams, arch: str, kernel: str):
    # The launch options (warps of the default partition, register limit) are the module's.
    fn = getattr(module, kernel)
    constexprs, signature = gluon_signature(module, spec, params, kernel)
    attrs = {name: [["tt.divisibility", 16]] for name in _divisible(fn, signature, spec)}
    return compat.compile_gluon(fn, signature, constexprs, attrs, arch, dict(module.LAUNCH))


def gluon_signature(module, spec: KernelSpec, params: TuningParams, kernel: str) -> tuple[dict, dict]:
    """(constexprs, signature) of a Gluon kernel of ``module`` as an ahead-of-time compile
    sees it: its host descriptors' types carry their boxes and shared-memory layouts, which
    the launch's descriptors must match (runtime.launch.descriptor_maker)."""
    own = next(k for k in template_of(spec, params).kernels(spec, params) if k.name == kernel)
    constexprs = {**own.constexprs, "num_warps": module.LAUNCH["num_warps"]}
    return constexprs, _signature(getattr(module, kernel), own, spec, constexprs, layouts=True)


nvidia_tool = compat.nvidia_tool


def assemble(kernel, arch: str, cubin: str = os.devnull, *, name: str = "kernel") -> str:
    """Assemble a compiled kernel's PTX with the ptxas Triton itself would use for ``arch``
    (into ``cubin``); returns ptxas's verbose report. Raises if ptxas fails."""
    cc = int(arch.removeprefix("sm"))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.ptx")
        with open(path, "w") as f:
            f.write(kernel.asm["ptx"])
        gpu = f"sm_{cc}a" if cc >= 90 else f"sm_{cc}"
        done = subprocess.run(
            [compat.ptxas(arch), "-v", f"--gpu-name={gpu}", path, "-o", cubin], capture_output=True, text=True
        )
    if done.returncode:
        raise RuntimeError(f"ptxas failed on {name}: {done.stderr.strip()[:300]}")
    return done.stderr


def performance_losses(report: str) -> tuple[str, ...]:
    """ptxas's notes in ``report`` that it dropped a register split (setmaxnreg ignored, C7507)
    or serialised the wgmmas (C7512, and C7514/C7515: an accumulator read or written while its
    wgmma may be in flight), each as "CODE: what it says", once each. Other performance notes
    (C7519: a warpgroup.arrive injected) cost little and are left out."""
    found = re.findall(r"\((C75\d\d)\) Potential Performance Loss: ([^\n]*)", report)
    return tuple(
        sorted({f"{code}: {text.strip()}" for code, text in found if "setmaxnreg" in text or "serialized" in text})
    )


def spill_bytes(report: str) -> int:
    spill = re.search(r"(\d+) bytes spill stores", report)
    return int(spill.group(1)) if spill else 0


def compile_for(spec: KernelSpec, params: TuningParams, arch: str = "sm90") -> dict[str, Resources]:
    """Compile every kernel of a variant for ``arch`` and assemble it with ptxas. Raises
    what the compiler raises; returns each kernel's resources."""
    out = {}
    for name, kernel in compiled_kernels(spec, params, arch):
        report = assemble(kernel, arch, name=name)
        regs = re.search(r"Used (\d+) registers", report)
        out[name] = Resources(
            int(regs.group(1)) if regs else None,
            spill_bytes(report),
            kernel.metadata.shared,
            performance_losses(report),
        )
    return out
