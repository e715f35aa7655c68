"""Probe: V's transpose inside shared memory, as an fp8 forward's partition would do it.

One program per (BN x DH) tile of an fp8 V (rows: keys): the TMA lands the tile in a swizzled
buffer; the program loads it with a layout in which each thread holds a 4 x 4 byte block (keys
{b, 8a} x 4 neighbouring d, plus more), permutes each 16-key group into P's register order
(key 8a + 2q + b at column 4q + 2a + b) and stores it, transposed, into the (DH x BN) buffer an
fp8 wgmma reads as its B operand; REPS times, then writes the last result out for checking.

usage: python benchmarks/experiments/fp8_vt_smem.py sass [BN DH WORDS]  (compile for sm90, no GPU)
       python benchmarks/experiments/fp8_vt_smem.py run  (GPU: check and time both forms)
"""
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma


@gluon.constexpr_function
def _x_layout(BN, DH, WARPS):
    # [BN keys, DH] bytes; registers: key bits 0 and 3, d bits 0-1 (a 4 x 4 byte block), lanes:
    # key bits 1-2 and d bits 2-4, warps: key bits 4-5; the rest in registers
    k = lambda i: [1 << i, 0]
    d = lambda i: [0, 1 << i]
    reg = [k(0), k(3), d(0), d(1)]
    lane = [k(1), k(2), d(2), d(3), d(4)]
    nw = WARPS.bit_length() - 1
    warp = [k(4 + i) for i in range(nw)]
    reg += [k(i) for i in range(4 + nw, BN.bit_length() - 1)] + [d(i) for i in range(5, DH.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [BN, DH])


@gluon.constexpr_function
def _vt_layout(DH, BN):
    return gl.NVMMASharedLayout.get_default_for([DH, BN], gl.float8e4nv)


@gluon.jit
def _transpose(vs, vt, BN: gl.constexpr, DH: gl.constexpr, WARPS: gl.constexpr):
    x = vs.load(_x_layout(BN, DH, WARPS))
    x = x.reshape([BN // 16, 2, 4, 2, DH]).permute((0, 2, 1, 3, 4)).reshape([BN, DH])
    vt.store(x.permute((1, 0)))


@gluon.constexpr_function
def _w_layout(BN, DH, WARPS):
    # int32 words [BN keys, DH / 4]: registers key bits 0 and 3; lanes key bits 1-2, word bits 0-2
    k = lambda i: [1 << i, 0]
    w = lambda i: [0, 1 << i]
    W = DH // 4
    nw = WARPS.bit_length() - 1
    lanes_w = min(3, W.bit_length() - 1)
    reg = [k(0), k(3)]
    lane = [k(1), k(2)] + [w(i) for i in range(lanes_w)]
    lane += [k(4 + i) for i in range(5 - len(lane))]
    used_k = 4 + (5 - 2 - lanes_w)
    warp = [k(used_k + i) for i in range(nw)]
    reg += [k(i) for i in range(used_k + nw, BN.bit_length() - 1)] + [w(i) for i in range(lanes_w, W.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [BN, W])


@gluon.constexpr_function
def _as_words(layout):
    return gl.NVMMASharedLayout(swizzle_byte_width=layout.swizzle_byte_width, element_bitwidth=32, rank=2)


# the 4 x 4 byte transpose: words of keys (a, b) = (0,0), (0,1), (1,0), (1,1), each 4 neighbouring d,
# into 4 words, one per d, each the 4 keys in P's order (byte 2a + b)
_T44 = gl.constexpr("{ .reg .b32 t0, t1, t2, t3; prmt.b32 t0, $4, $5, 0x5140; prmt.b32 t1, $4, $5, 0x7362; "
        "prmt.b32 t2, $6, $7, 0x5140; prmt.b32 t3, $6, $7, 0x7362; prmt.b32 $0, t0, t2, 0x5410; "
        "prmt.b32 $1, t0, t2, 0x7632; prmt.b32 $2, t1, t3, 0x5410; prmt.b32 $3, t1, t3, 0x7632; }")


@gluon.jit
def _transpose_words(vs, vt, BN: gl.constexpr, DH: gl.constexpr, WARPS: gl.constexpr):
    W: gl.constexpr = DH // 4
    x = vs._reinterpret(gl.int32, [BN, W], _as_words(vs.layout)).load(_w_layout(BN, DH, WARPS))
    x = x.reshape([BN // 16, 2, 4, 2, W]).permute((0, 2, 4, 1, 3))  # [g, q, w, a, b]
    b0, b1 = x.split()
    a0b0, a1b0 = b0.split()
    a0b1, a1b1 = b1.split()
    o0, o1, o2, o3 = gl.inline_asm_elementwise(_T44, "=r,=r,=r,=r,r,r,r,r", [a0b0, a0b1, a1b0, a1b1],
                                               dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    y = gl.join(gl.join(o0, o1), gl.join(o2, o3)).permute((0, 1, 2, 4, 3))  # [g, q, w, i // 2, i % 2]
    y = y.reshape([BN // 4, DH])  # [key word, d]
    vt._reinterpret(gl.int32, [DH, BN // 4], _as_words(vt.layout)).store(y.permute((1, 0)))


@gluon.jit
def vt_probe(V, OUT, BN: gl.constexpr, DH: gl.constexpr, REPS: gl.constexpr, WORDS: gl.constexpr,
             num_warps: gl.constexpr):
    t = gl.program_id(0)
    vs = gl.allocate_shared_memory(V.dtype, V.block_type.shape, V.layout)
    vt = gl.allocate_shared_memory(V.dtype, [DH, BN], _vt_layout(DH, BN))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, V.block_type.nbytes)
    tma.async_copy_global_to_shared(V, [t * BN, 0], bar, vs)
    mbarrier.wait(bar, 0)
    for r in range(REPS):
        if WORDS:
            _transpose_words(vs, vt, BN, DH, num_warps)
        else:
            _transpose(vs, vt, BN, DH, num_warps)
        gl.thread_barrier()
    fence_async_shared()
    out_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    y = vt.load(out_l)
    rows = gl.arange(0, DH, layout=gl.SliceLayout(1, out_l))
    cols = gl.arange(0, BN, layout=gl.SliceLayout(0, out_l))
    gl.store(OUT + t * DH * BN + rows[:, None] * BN + cols[None, :], y)


def _signature(BN, DH):
    layout = gl.NVMMASharedLayout.get_default_for([BN, DH], gl.float8e4nv)
    return {"V": f"tensordesc<fp8e4nv[{BN},{DH}],{layout!r}>", "OUT": "*fp8e4nv", "BN": "constexpr",
            "DH": "constexpr", "REPS": "constexpr", "WORDS": "constexpr", "num_warps": "constexpr"}


def sass(BN=256, DH=64, WORDS=1):
    import collections
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from fa2gen.generator.ahead import assemble, nvidia_tool

    constexprs = {"BN": BN, "DH": DH, "REPS": 1, "WORDS": WORDS, "num_warps": 4}
    keys = {(vt_probe.arg_names.index(k),): v for k, v in constexprs.items()}
    kernel = triton.compile(GluonASTSource(vt_probe, _signature(BN, DH), keys, {}),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        report = assemble(kernel, "sm90", cubin.name, name="vt_probe")
        listing = subprocess.run([nvidia_tool("cuobjdump"), "--dump-sass", cubin.name], capture_output=True,
                                 text=True).stdout
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", listing))
    print(re.search(r"Used \d+ registers[^\n]*", report).group(0))
    print({o: c for o, c in sorted(ops.items()) if o.split(".")[0] in ("LDS", "STS", "PRMT", "SHFL", "LDSM", "STSM", "BAR")})


def run():
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    print("BN  DH  form      exact  us/all tiles  ns a tile an SM  smem GB/s (read + write)")
    for BN, DH in ((256, 64), (128, 64), (64, 128), (128, 32)):
        tiles = 4096
        v = torch.randn(tiles * BN, DH, device="cuda").to(torch.float8_e4m3fn)
        layout = gl.NVMMASharedLayout.get_default_for([BN, DH], gl.float8e4nv)
        desc = TensorDescriptor.from_tensor(v, [BN, DH], layout)
        c = torch.arange(BN, device="cuda") % 16
        key = torch.arange(BN, device="cuda") - c + (c % 4) // 2 * 8 + c // 4 * 2 + c % 2
        ref = v.view(tiles, BN, DH)[:, key, :].transpose(1, 2).contiguous().view(torch.uint8)
        for words in (0, 1):
            out = torch.full((tiles, DH, BN), 7, device="cuda", dtype=torch.uint8).view(torch.float8_e4m3fn)
            vt_probe[(tiles,)](desc, out, BN, DH, 1, words, num_warps=4)
            ok = torch.equal(out.view(torch.uint8), ref)
            ms = {r: triton.testing.do_bench(lambda: vt_probe[(tiles,)](desc, out, BN, DH, r, words, num_warps=4),
                                             rep=100) for r in (1, 33)}
            per = (ms[33] - ms[1]) / 32 * 1e3
            print(f"{BN:3d} {DH:3d}  {'words' if words else 'compiler'}  {str(ok):5s}  {per:12.1f}  "
                  f"{per * 1e3 / (tiles / 132):16.0f}  {2 * BN * DH * tiles / (per * 1e-6) / 1e9:9.0f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "sass":
        sass(*(int(x) for x in sys.argv[2:]))
    else:
        run()
