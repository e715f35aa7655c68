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
from .gluon import descriptor_dtype
from .spec import KernelSpec, TuningParams

_TENSORS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
_TRITON_TYPES = {"fp16": "fp16", "bf16": "bf16", "fp8e4m3": "fp8e4nv", "fp32": "fp32"}


@dataclass(frozen=True)
class Resources:
    registers: int | None
    spill_bytes: int
    shared_bytes: int
    # ptxas's notes of a performance loss it chose: the register split of a warp-specialised
    # kernel ignored (every setmaxnreg dropped), or its wgmmas serialised for want of registers
    losses: tuple[str, ...] = ()


def _signature(fn, kernel: Kernel, spec: KernelSpec, params: TuningParams) -> dict:
    sig = {}
    element = _TRITON_TYPES[spec.dtype]
    boxes = kernel.boxes if params.loads == "tma_host" else {}
    for name in fn.arg_names:
        if name in kernel.constexprs:
            sig[name] = "constexpr"
        elif name in boxes:
            box = ",".join(map(str, boxes[name]))
            sig[name] = f"tensordesc<{_TRITON_TYPES[descriptor_dtype(spec, name)]}[{box}]>"
        elif name in _TENSORS:
            sig[name] = f"*{_TRITON_TYPES[spec.out_dtype] if name == 'O' else element}"
        elif name in ("LSE", "DELTA", "DQACC") or name.startswith("DESCALE"):
            sig[name] = "*fp32"
        elif name in ("sm_scale", "softcap"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def _attrs(fn, signature: dict, spec: KernelSpec) -> dict:
    """The specialisation a launch on the GPU gives these arguments, so that the binary
    measured here is the one that runs: Triton marks a pointer whose address and an integer
    whose value is divisible by 16 (``tt.divisibility``), which lets loads be vectorised
    and prefetched asynchronously. Pointers: torch allocations are 256-byte aligned.
    Strides: those of contiguous (B, H, N, D) tensors, divisible by 16 when D is (and N, for
    the batch and head strides, as on the paper's grid). Without these, q and dO load
    synchronously and the register and shared-memory figures describe a binary that never
    runs."""
    skip = set(getattr(fn, "do_not_specialize", ()) or ())
    skip |= {fn.arg_names[i] for i in skip if isinstance(i, int)}
    attrs = {}
    for i, name in enumerate(fn.arg_names):
        kind = signature[name]
        if name in skip or kind == "constexpr":
            continue
        if kind.startswith("*") or (kind == "i32" and name.startswith("stride") and spec.head_dim % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


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
        signature = _signature(fn, kernel, spec, module_params)
        attrs = _attrs(fn, signature, spec)
        yield kernel.name, compat.compile_triton(fn, signature, kernel.constexprs, attrs, arch, kernel.options)


def _compile_gluon(module, spec: KernelSpec, params: TuningParams, arch: str, kernel: str):
    # The launch options (warps of the default partition, register limit) are the module's.
    fn = getattr(module, kernel)
    constexprs, signature = gluon_signature(module, spec, params, kernel)
    attrs = {
        name: [["tt.divisibility", 16]] for name in ("LSE", "DELTA", "DQ_PTR", "TILES") if name in fn.arg_names
    }  # (pointers only: the one pass's DQACC is a descriptor)
    return compat.compile_gluon(fn, signature, constexprs, attrs, arch, dict(module.LAUNCH))


def gluon_signature(module, spec: KernelSpec, params: TuningParams, kernel: str) -> tuple[dict, dict]:
    """(constexprs, signature) of a Gluon kernel of ``module`` as an ahead-of-time compile
    sees it: its host descriptors' types carry their boxes and shared-memory layouts, which
    the launch's descriptors must match (runtime.backward, runtime.launch)."""
    from .gluon import descriptor_layout

    fn = getattr(module, kernel)
    own = next(k for k in template_of(spec, params).kernels(spec, params) if k.name == kernel)
    constexprs = {**own.constexprs, "num_warps": module.LAUNCH["num_warps"]}
    boxes = {name: list(box) for name, box in own.boxes.items()}
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in boxes:
            dtype = descriptor_dtype(spec, name)
            box = boxes[name]
            signature[name] = (
                f"tensordesc<{_TRITON_TYPES[dtype]}[{','.join(map(str, box))}],{descriptor_layout(box, dtype)!r}>"
            )
        elif name in ("LSE", "DELTA") or name.startswith("DESCALE"):
            signature[name] = "*fp32"
        elif name == "DQ_PTR":
            signature[name] = f"*{_TRITON_TYPES[spec.dtype]}"
        elif name == "TILES":  # the causal persistent forward's tile counter
            signature[name] = "*i32"
        elif name == "sm_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return constexprs, signature


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
