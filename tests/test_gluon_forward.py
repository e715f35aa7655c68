"""The Gluon forward (TuningParams.gluon > 0): its rules, rendering, identity, ahead-of-time
compile for sm90 (on CPU), its fallbacks, the tuner's use of it, and on the GPU (marker
``gpu``) its results on odd shapes (fp16/bf16 by flash-attention's rule, fp8 by the fp8
rule), and gradients through it."""

import ast
import hashlib
import textwrap

import pytest
import torch
from helpers import compiled_child, gluon_cases, hopper

from fa2gen import compat
from fa2gen.generator import rendering
from fa2gen.generator.arch import fits
from fa2gen.generator.descriptors.attn_fwd_gluon import (
    GLUON_CANDIDATES,
    GLUON_FP8_CANDIDATES,
    AttnFwdGluon,
    gluon_k_stages,
    gluon_overlap,
)
from fa2gen.generator.identity import Variant
from fa2gen.generator.rendering import render, template_hash
from fa2gen.generator.spec import KernelSpec, SpecError, TuningParams, param_space, unsupported
from fa2gen.store.buckets import Bucket
from fa2gen.tuner.space import gluon_candidates, prune_reason, space_for

WS2 = TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host", gluon=2)
WS1 = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=3, loads="tma_host", gluon=1)


@pytest.mark.parametrize(
    "spec,params,match",
    [
        (KernelSpec(direction="bwd", head_dim=64), WS2, "steps"),
        (KernelSpec(head_dim=64, mask="local"), WS2, "causal"),
        (KernelSpec(head_dim=64, softcap=True), WS2, "softcap"),
        (KernelSpec(head_dim=80), WS2, "head dims"),
        (KernelSpec(head_dim=256), WS2, "head dims"),
        (KernelSpec(head_dim=64), WS2.replace(loads="pointer"), "tma_host"),
        (KernelSpec(head_dim=64), WS2.replace(block_n=32), "tiles"),
        (KernelSpec(head_dim=128), WS2.replace(block_n=256), "tiles"),
        (KernelSpec(dtype="fp8e4m3", head_dim=128), WS1.replace(block_m=128, num_warps=8, block_n=256), "tiles"),
        (KernelSpec(head_dim=64), WS1.replace(gluon=2), "two 64-row warp groups"),
        (KernelSpec(head_dim=64), WS2.replace(num_warps=4), "compute warps"),
        (KernelSpec(head_dim=64), WS1.replace(num_stages=1), "num_stages >= 2"),
        (KernelSpec(head_dim=64), WS1.replace(loads="tma_device"), "dense tensors through loads=tma_host"),
        (KernelSpec(head_dim=64, varlen=True), WS1, "plain grid"),
        (KernelSpec(head_dim=64, varlen=True), WS1.replace(loads="pointer"), "packed batch through loads=tma_device"),
        (KernelSpec(head_dim=64, varlen=True), TuningParams(128, 64, 8, 3, "pointer", persistent=1), "Gluon forward"),
    ],
)
def test_rules_name_what_the_gluon_forward_cannot_do(spec, params, match):
    assert match in unsupported(spec, params)
    with pytest.raises(SpecError, match=match):
        render(spec, params, name="x")


def test_gluon_points_of_the_space_are_exactly_the_valid_ones():
    points = [p for p in param_space(KernelSpec(dtype="bf16", head_dim=128, mask="causal")) if p.gluon]
    # (64 | 128 rows, 1 partition) or (128 rows, 2), x 2 widths x 4 stage counts x 3 grids
    assert len(points) == 3 * 2 * 4 * 3
    assert all(p.loads == "tma_host" and p.num_warps == p.block_m // 16 for p in points)
    spec = KernelSpec(dtype="bf16", head_dim=128, mask="causal")
    bodies = {}
    for p in points:  # each renders and parses; tiles and stages are constexprs, not code, but
        # for whether the softmax runs under P @ V (two partitions on 128 x 128 tiles, three
        # stages or more)
        src = render(spec, p, name=Variant(spec, p).name)
        ast.parse(src)
        bodies.setdefault((p.persistent, gluon_overlap(spec, p)), set()).add(src.split("\nLN2 = ", 1)[1])
    # a plain grid's programs take one tile, persistent ones loop over tiles; how many
    # programs per SM is the launch's business (and one constant's)
    assert sorted(bodies) == [(g, o) for g in (0, 1, 2) for o in (False, True)]
    assert all(len(b) == 1 for b in bodies.values())
    for overlap in (False, True):
        walking = next(iter(bodies[1, overlap]))
        assert walking.replace("PERSISTENT = 1", "PERSISTENT = 2") == next(iter(bodies[2, overlap]))
    plain, walking = next(iter(bodies[0, False])), next(iter(bodies[1, False]))
    assert "if True:  # one tile per program" in plain and "num_tiles, gl.num_programs(0))" not in plain
    assert plain.count("range(gl.program_id(0), num_tiles, gl.num_programs(0))") == 0
    # under the causal mask a persistent program's loader claims tiles from a counter and posts
    # each to the compute partitions; without a mask (equal tiles) programs walk every P-th
    assert walking.count("while t < num_tiles:") == 2 and walking.count("gl.atomic_add(TILES, 1, ") == 2
    assert "range(gl.program_id(0), num_tiles" not in walking and "TILES" not in plain
    full = KernelSpec(dtype="bf16", head_dim=128)
    unmasked = render(
        full,
        TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host", gluon=2, persistent=1),
        name="t",
    )
    assert unmasked.count("range(gl.program_id(0), num_tiles, gl.num_programs(0))") == 2  # loader and compute
    assert "TILES" not in unmasked
    assert not [p for p in param_space(KernelSpec(head_dim=96)) if p.gluon]
    # fp8 also takes 256-key steps, on two partitions only: the 72 points above and 4 stage
    # counts x 3 grids of 128 x 256
    fp8 = [p for p in param_space(KernelSpec(dtype="fp8e4m3", head_dim=128, mask="causal")) if p.gluon]
    wide = [p for p in fp8 if p.block_n == 256]
    assert len(fp8) == 3 * 2 * 4 * 3 + 4 * 3 and len(wide) == 4 * 3
    assert all(p.gluon == 2 and p.block_m == 128 for p in wide)
    with pytest.raises(SpecError, match="gluon"):
        TuningParams(gluon=3)
    with pytest.raises(SpecError, match="gluon"):
        TuningParams(gluon=True)


def test_only_hopper_runs_it():
    spec = KernelSpec(head_dim=128)
    assert fits(spec, WS2, "sm90") is None
    for arch in ("sm80", "sm86", "sm89"):
        assert "wgmma" in fits(spec, WS2, arch)


def test_renders_readable_gluon_with_its_knobs_and_launch():
    spec = KernelSpec(dtype="bf16", head_dim=128, mask="causal")
    src = render(spec, WS2, name=Variant(spec, WS2).name)
    tree = ast.parse(src)
    assigned = {n.targets[0].id: n.value for n in tree.body if isinstance(n, ast.Assign)}
    assert ast.literal_eval(assigned["CONFIG"]) == {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "GROUPS": 2}
    assert ast.literal_eval(assigned["LAUNCH"]) == {"num_warps": 4, "maxnreg": 168}
    assert ast.literal_eval(assigned["Q_ROWS"]) == 64
    assert "gl.constexpr(True)" in ast.unparse(assigned["CAUSAL"])
    assert "@gluon.jit" in src and "gl.warp_specialize" in src and "import triton.language" not in src
    head = src.split("from triton")[0]
    for knob in ("CAUSAL", "GROUPS", "BLOCK_M", "BLOCK_N", "HEAD_DIM", "STAGES", "num_warps", "maxnreg"):
        assert knob in head
    one = render(KernelSpec(head_dim=64), WS1, name="x")
    assert "gl.constexpr(False)" in one and '"num_warps": 4, "maxnreg": 128' in one
    assert "DESCALE_Q" not in one and "P_WIDTH = gl.constexpr(2)" in one
    fp8 = render(KernelSpec(dtype="fp8e4m3", head_dim=128), WS2, name="x")
    assert (
        "FP8 = gl.constexpr(True)" in fp8 and "P_WIDTH = gl.constexpr(4)" in fp8 and "MMA_K = gl.constexpr(32)" in fp8
    )
    kernel = next(n for n in ast.parse(fp8).body if isinstance(n, ast.FunctionDef) and n.name == "attn_fwd")
    assert [a.arg for a in kernel.args.args][:8] == ["Q", "K", "V", "O", "LSE", "DESCALE_Q", "DESCALE_K", "DESCALE_V"]


def test_a_packed_batch_builds_each_sequences_descriptors_in_the_partitions_that_use_them():
    """Host descriptors span the packed tensor (a box would cross into the next sequence): the
    packed form takes pointers and strides, and the loader (Q, K, V) and each compute partition
    (O) build descriptors over one sequence's rows, fenced for the warps that built them."""
    spec = KernelSpec(dtype="bf16", head_dim=128, mask="causal", varlen=True)
    params = WS2.replace(loads="tma_device", num_stages=3)
    src = render(spec, params, name=Variant(spec, params).name)
    kernel = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "attn_fwd")
    names = [a.arg for a in kernel.args.args]
    assert names[:5] == ["Q", "K", "V", "O", "LSE"] and names.index("CU_Q") < names.index("Hq") < names.index("Tq")
    [k] = AttnFwdGluon().kernels(spec, params)
    runtime = [n for n in names if n not in k.constexprs and n != "num_warps"]
    assert k.boxes == {} and [a.name for a in k.args] == runtime
    loader, compute = (src.split(f"def {f}(")[1].split("\n@gluon")[0] for f in ("_loader", "_compute"))
    assert loader.count("_sequence(") == 3 and compute.count("_sequence(") == 1
    assert "tma.make_tensor_descriptor" not in kernel_body(src) and "Tq + q0 + rows" in compute
    dense = render(KernelSpec(dtype="bf16", head_dim=128, mask="causal"), WS2, name="x")
    assert "_sequence" not in dense and "make_tensor_descriptor" not in dense
    # the tuner's packed spaces hold the Gluon kernels (the forward's plain grid and one
    # persistent program an SM), descriptors built in them
    space = space_for("sm90", "fwd", varlen=True)
    assert (
        space.gluon == (0, 1, 2)
        and space.persistent == (0, 1)
        and space_for("sm90", "bwd", varlen=True).gluon == (0, 1, 2)
        and space_for("sm90", "bwd", varlen=True).persistent == (0,)
    )
    bucket = Bucket("fwd", "bf16", 128, "causal", False, 1, 8192, 8192, 16, varlen=True)
    assert gluon_candidates(space, bucket.kernel_spec(), bucket) == [
        p.replace(loads="tma_device")
        for p in GLUON_CANDIDATES
        if not p.persistent or (p.persistent == 1 and p.block_n == 128)
    ]


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_a_persistent_packed_program_claims_tiles_and_builds_descriptors_per_tile(mask):
    """One program an SM on a packed batch: its loader claims tiles from the queue (with or
    without a mask), skips those past their sequence's end, and builds each tile's Q, K and V
    descriptors once the loads that read the last ones have landed; the compute partitions
    store O through the packed pointer, masked at the sequence's end (a box would cross into
    the next sequence)."""
    spec = KernelSpec(dtype="bf16", head_dim=64, mask=mask, varlen=True)
    params = WS2.replace(loads="tma_device", persistent=1)
    src = render(spec, params, name=Variant(spec, params).name)
    [k] = AttnFwdGluon().kernels(spec, params)
    assert "TILES" in [a.name for a in k.args]
    loader, compute = (src.split(f"def {f}(")[1].split("\n@gluon")[0] for f in ("_loader", "_compute"))
    assert loader.count("_claim_live(") == 2 and loader.count("_sequence(") == 3
    assert loader.index("_landed(") < loader.index("_sequence(")
    assert "_sequence(" not in compute and "_packed_tile(" in compute and "gl.store(o_ptrs" in compute
    assert "tma_store(" not in compute and "return" not in kernel_body(src).split("gl.warp_specialize")[0]


def kernel_body(src: str) -> str:
    return src.split("\ndef attn_fwd(")[1]


def test_the_softmax_runs_under_p_at_v_only_where_it_measured_faster():
    # notebook v59c: that schedule hands a V slot back a step later, which two stages cannot
    # spare (4-8% slower there) and three can with two partitions on 128 x 128 tiles (4-6.5%
    # faster; 128 x 64 with three: 0.97-1.02x); fp8 ran slower with it on both
    for dtype in ("fp16", "bf16", "fp8e4m3"):
        for stages in (2, 3):
            for block_n in (64, 128):
                for groups in (1, 2):
                    params = WS2.replace(num_stages=stages, block_n=block_n, gluon=groups)
                    src = render(KernelSpec(dtype=dtype, head_dim=128, mask="causal"), params, name="x")
                    overlap = stages == 3 and block_n == 128 and groups == 2 and dtype != "fp8e4m3"
                    assert ("def _step(" in src) == overlap and ("def _mask(" in src) != overlap, params


def test_fp8_wide_steps_wait_for_p_at_v_before_the_next_scores():
    # notebook v63: 64 x 256 scores take 128 registers a thread; with P and acc also in
    # flight ptxas spilled 1.9 KB, so on 256-key steps the two matmuls take turns.
    spec = KernelSpec(dtype="fp8e4m3", head_dim=128, mask="causal")
    whole = render(spec, WS2.replace(block_n=256), name="x")
    wide = whole.split("for j in range(1, n_own):", 1)[1]
    assert wide.index("_pv(") < wide.index("_scores(") < wide.index("_softmax(")
    assert "warpgroup_mma_wait(1" not in wide and "_masked(s, j" in wide
    # each matmul waited for once (no second wait for P @ V), and no unused mask helper
    assert "deps=(acc,)" not in wide and "def _mask(" not in whole
    narrow = render(spec, WS2, name="x").split("for j in range(1, n_own):", 1)[1]
    assert narrow.index("_scores(") < narrow.index("_pv(") and "warpgroup_mma_wait(1" in narrow


def test_the_shared_memory_estimate_counts_the_rings_the_template_allocates():
    # The template decides K's ring depth (one slot fewer than V's with the overlapped
    # softmax); the estimate that prunes the space must count the same.
    import re

    for dtype in ("bf16", "fp8e4m3"):
        spec = KernelSpec(dtype=dtype, head_dim=128, mask="causal")
        for p in (p for p in param_space(spec) if p.gluon):
            src = render(spec, p, name="x")
            found = re.search(r"^K_STAGES = gl\.constexpr\((\d+)\)", src, re.M)
            assert (int(found.group(1)) if found else p.num_stages) == gluon_k_stages(spec, p), p
            assert ("[K_STAGES] + K.block_type.shape" in src) == bool(found), p
    # the one persistent program an SM on 128 x 128 tiles with three stages fits at D=128 only so
    assert fits(KernelSpec(dtype="bf16", head_dim=128), WS2.replace(num_stages=3, persistent=1), "sm90") is None
    assert fits(KernelSpec(dtype="bf16", head_dim=128), WS2.replace(num_stages=4, persistent=1), "sm90")


def test_a_persistent_program_keeps_two_q_slots_and_the_estimate_counts_them():
    """A persistent program loads the next tile's Q into Q's second slot while this tile runs;
    in 16-bit the output leaves through the tile's own Q slot (no buffer of its own), in fp8
    through O's. A plain grid keeps one Q buffer. The pruning estimate counts the same."""
    from fa2gen.generator.arch import smem_estimate

    for dtype in ("bf16", "fp8e4m3"):
        spec = KernelSpec(dtype=dtype, head_dim=128, mask="causal")
        for persistent in (0, 1):
            params = WS2.replace(persistent=persistent)
            src = render(spec, params, name="x")
            two = "[2 * GROUPS] + Q.block_type.shape" in src
            assert two == bool(persistent) and ("q_ready = _barriers(2, 1)" in src) == two, (dtype, persistent)
            assert ("tma_store(O, [b, h, row0, 0], q_buf)" in src) == (two and dtype == "bf16")
            q = 128 * 128 * spec.element_bytes
            kv = 2 * 2 * 128 * 128 * spec.element_bytes
            o = 128 * 128 * 2 if spec.fp8 else 0
            assert smem_estimate(spec, params) == (2 if persistent else 1) * q + kv + o, (dtype, persistent)


def test_identity_and_the_forward_hash_cover_the_gluon_template():
    spec = KernelSpec(head_dim=128)
    names = {Variant(spec, p).name for p in (WS2, WS2.replace(gluon=1, block_m=128), WS2.replace(gluon=0))}
    assert len(names) == 3 and any("gluon2" in n for n in names)
    sources = [rendering.template_source("fwd"), rendering._file_source(rendering.GLUON_TEMPLATE)]
    sources += [rendering._file_source(f) for f in rendering.INCLUDED["fwd"]]  # (the dropout draws)
    assert template_hash("fwd") == hashlib.sha256("".join(sources).encode()).hexdigest()[:16]


# Runs in a child without TRITON_INTERPRET: Gluon kernels only compile.
_CHILD = textwrap.dedent(r"""
    import json, subprocess, sys, tempfile
    from fa2gen.generator.ahead import assemble, compiled_kernels, nvidia_tool, performance_losses, spill_bytes
    from fa2gen.generator.arch import smem_estimate
    from fa2gen.generator.descriptors.attn_fwd_gluon import gluon_overlap, gluon_wide
    from fa2gen.generator.spec import KernelSpec, unsupported
    from fa2gen.generator.descriptors.attn_fwd_gluon import AttnFwdGluon
    import re
    from fa2gen.generator import sass as sass_loops  # its count of exponentials under a wgmma in flight
    out = []
    for spec in (KernelSpec(dtype="fp16", head_dim=64), KernelSpec(dtype="bf16", head_dim=128, mask="causal"),
                 KernelSpec(dtype="fp8e4m3", head_dim=128, mask="causal"),
                 KernelSpec(dtype="bf16", head_dim=128, mask="causal", varlen=True)):
        for params in AttnFwdGluon().candidates(spec):
            if unsupported(spec, params):  # three programs an SM: D=64 only
                continue
            (name, kernel), = compiled_kernels(spec, params, "sm90")
            with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
                report = assemble(kernel, "sm90", cubin.name, name=name)
                sass = subprocess.run([nvidia_tool("cuobjdump"), "--dump-sass", cubin.name], capture_output=True,
                                      text=True).stdout
            out.append({"label": params.label(), "d": spec.head_dim, "spill": spill_bytes(report),
                        "registers": int(re.search(r"Used (\d+) registers", report).group(1)),
                        # HGMMA: 16-bit operands; QGMMA: fp8
                        "gmma": len(re.findall(r"\b[HQ]GMMA\.", sass)), "setmaxnreg": "USETMAXREG" in sass,
                        "wait_one": "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass,
                        # the most between one wait for all wgmma groups and the next
                        "ex2_in_flight": max(sass_loops.ex2_in_flight(part.splitlines())
                                             for part in sass.split("WARPGROUP.DEPBAR.LE gsb0, 0x0")),
                        "ex2_run": sass_loops.ex2_run([x for x in sass.splitlines() if ";" in x]),  # instructions
                        "overlap": gluon_overlap(spec, params), "wide": gluon_wide(spec, params),
                        "shared": kernel.metadata.shared, "estimate": smem_estimate(spec, params),
                        "losses": list(performance_losses(report))})
    print(json.dumps(out))
""")


# The candidates allowed to spill, by at most this much: one persistent program an SM on
# 128 x 128 tiles, whose tile loop holds a few more values, which on short sequences measured
# 1.05-1.12x the shipped configs all the same (notebook v54); with three stages it spills
# 72 B (v62), 100 B with two Q slots (v69, faster all the same), none of it in the key loops
# (fa2gen.generator.sass: no local loads there).
# Three programs an SM on 64 x 64 tiles, each compute warp group at 136 registers (an
# 80-register launch): 32 B without a mask, read back once a tile, none in the key loops
# (fa2gen.generator.sass), and ran 1.05-1.08x the two-program form there all the same
# (notebook, "three programs an SM, each on an 80-register launch").
# From Triton 3.7 the three-stage persistent form holds more across its tile loop: 204 B
# under 3.9 at D=128, with 1-5 local loads a step in its key loops (the tuner measures it).
SPILL_ALLOWED = {
    "m128 n128 w8 s2 tma_host persistent1 gluon2": 256,
    "m128 n128 w8 s3 tma_host persistent1 gluon2": 100 if compat.version() < (3, 7) else 204,
    "m64 n64 w4 s3 tma_host persistent3 gluon1": 32,
    # a packed batch's persistent forms, at D=128 under the causal mask: 12 B and 52 B (3.6)
    "m128 n128 w8 s2 tma_device persistent1 gluon2": 256,
    "m128 n128 w8 s3 tma_device persistent1 gluon2": 100 if compat.version() < (3, 7) else 204,
}


def test_compiles_for_sm90_without_spills():
    got = compiled_child(_CHILD)
    at_d64 = [p for p in GLUON_CANDIDATES if p.persistent == 3]  # compiled for the D=64 spec alone
    # a packed batch's: the plain grid's and one persistent program an SM on 128 x 128 tiles
    packed = [p for p in GLUON_CANDIDATES if not p.persistent or (p.persistent == 1 and p.block_n == 128)]
    assert at_d64 and len(got) == 3 * len(GLUON_CANDIDATES) - 2 * len(at_d64) + len(GLUON_FP8_CANDIDATES) + len(packed)
    assert sum("tma_device" in k["label"] for k in got) == len(packed)
    for k in got:
        # warp-specialised (registers moved between partitions), asynchronous wgmma with one
        # group left in flight (but on fp8's 256-key steps, whose matmuls take turns), nothing
        # spilled under the launch's register limit (but the allowance above), no wgmma
        # serialised by ptxas
        assert k["spill"] <= SPILL_ALLOWED.get(k["label"], 0), k
        assert k["gmma"] > 0 and k["setmaxnreg"] and k["wait_one"] != k["wide"] and k["losses"] == [], k
        assert k["registers"] <= (168 if "m128" in k["label"] else 128), k
        # the estimate the tuner prunes by is the compiled kernel's shared memory less its
        # barriers and posted words (a few hundred bytes): a buffer the template adds without
        # the estimate would let the tuner compile variants that cannot launch
        assert 0 <= k["shared"] - k["estimate"] <= 1024, k
        # In the overlap form (two partitions, 128 x 128 tiles, three stages, 16-bit) block
        # j's softmax runs while block j-1's P @ V is on the tensor cores (notebook v59,
        # v59c): a branch in the key loop or a barrier after the wait for P @ V had ptxas wait
        # for it before the first exponential.
        if k["overlap"]:
            assert k["ex2_in_flight"] >= 8, k
        # The softmax's exponentials interleave with the row sum's adds: at most 3-8 issue back
        # to back under 3.6 to 3.9. Triton 3.8's tree sums had made runs of 16-25, which held
        # up the other partition's wgmma issue (docs/performance.md, "Row sums").
        assert k["ex2_run"] <= 8, k


def test_tuner_measures_the_gluon_candidates_the_bucket_can_run():
    space = space_for("sm90", "fwd")
    assert space.gluon == (0, 1, 2) and space_for("sm90", "bwd").gluon == (0, 1, 2)
    assert space_for("sm80", "fwd").gluon == (0,)
    three = WS1.replace(persistent=3)  # three programs an SM: D=64 only
    long = Bucket.parse("fwd/fp16/d128/causal/sc0/g1/q4096/k4096/bh128")
    assert gluon_candidates(space, long.kernel_spec(), long) == [p for p in GLUON_CANDIDATES if p != three]
    d64 = Bucket.parse("fwd/fp16/d64/causal/sc0/g1/q4096/k4096/bh128")
    assert gluon_candidates(space, d64.kernel_spec(), d64) == list(GLUON_CANDIDATES)
    short = Bucket.parse("fwd/fp16/d128/none/sc0/g1/q64/k64/bh128")
    assert gluon_candidates(space, short.kernel_spec(), short) == [WS1, WS1.replace(persistent=2)]
    fp8 = Bucket.parse("fwd/fp8e4m3/d128/none/sc0/g1/q4096/k4096/bh128")
    assert gluon_candidates(space, fp8.kernel_spec(), fp8) == [
        p for p in GLUON_FP8_CANDIDATES + GLUON_CANDIDATES if p != three
    ]
    # the 256-key steps: one persistent program an SM at most (two do not fit, notebook v64)
    wide = GLUON_FP8_CANDIDATES[0]
    assert prune_reason(space, fp8.kernel_spec(), fp8, wide) is None
    assert prune_reason(space, fp8.kernel_spec(), fp8, wide.replace(persistent=1)) is None
    assert "at most" in prune_reason(space, fp8.kernel_spec(), fp8, wide.replace(persistent=2))
    other = Bucket.parse("fwd/fp16/d96/none/sc0/g1/q4096/k4096/bh128")
    assert gluon_candidates(space, other.kernel_spec(), other) == []
    assert gluon_candidates(space_for("sm80"), long.kernel_spec(), long) == []
    assert "outside" in prune_reason(space_for("sm80"), long.kernel_spec(), long, WS2)


@pytest.mark.interpreter
def test_interpreter_falls_back_to_the_triton_template():
    """Gluon has no interpreter: a call given Gluon params runs the Triton template's
    default, and computes the right answer."""
    from helpers import rand_qkv, run_and_check

    from fa2gen.runtime.launch import Launch, gluon_ready

    q, k, v = rand_qkv(1, 2, 1, 37, 45, 64, seed=3)
    verdict, _, _ = run_and_check(q, k, v, WS1, causal=True)
    assert verdict.ok, str(verdict)
    from fa2gen.runtime.problem import make_problem

    problem = make_problem(q, k, v, causal=True)
    assert not gluon_ready(problem, q, k, v, q)
    from fa2gen.runtime.defaults import default_params

    assert Launch(problem, WS1).fallback().params == default_params(problem.kernel_spec(), "cpu", problem.seqlen_q)


# ---------------------------------------------------------------------------------------------
# GPU (sm90)

# (B, Hq, Hkv, Nq, Nk, D), causal, layout: GQA, Nq != Nk both ways, rows that see no key,
# decoding, odd lengths, strided (B, N, H, D) inputs, a long sequence
ODD = [
    ((2, 6, 2, 200, 333, 64), False, "bhnd"),
    ((2, 6, 2, 200, 333, 64), True, "bhnd"),
    ((1, 4, 4, 1, 257, 128), True, "bhnd"),
    ((3, 8, 1, 129, 129, 128), True, "bhnd"),
    ((1, 2, 2, 300, 100, 64), True, "bhnd"),
    ((2, 4, 4, 257, 257, 128), False, "bnhd"),
    ((1, 8, 2, 4096 + 33, 4096 + 33, 128), True, "bhnd"),
]


# Three programs an SM (persistent=3) run at D=64 only: the odd shapes at D=64, and a GQA
# causal shape, one without a mask and a long causal one with more tiles than programs.
THREE = [p for p in GLUON_CANDIDATES if p.persistent == 3]
ANY_D = [p for p in GLUON_CANDIDATES if p.persistent != 3]
ODD64 = [c for c in ODD if c[0][5] == 64] + [
    ((4, 16, 4, 512 + 33, 512 + 33, 64), True, "bhnd"),
    ((8, 16, 16, 1024, 1024, 64), False, "bhnd"),
    ((2, 8, 2, 4096 + 33, 4096 + 33, 64), True, "bnhd"),
]


@gluon_cases(ANY_D, ODD, "the Gluon forward")
def test_gluon_forward_on_odd_shapes(params, dtype, shape, causal, layout):
    from helpers import rand_qkv, run_and_check

    from fa2gen.runtime.launch import gluon_ready
    from fa2gen.runtime.problem import make_problem

    q, k, v = rand_qkv(*shape, dtype=dtype, device="cuda", layout=layout, seed=sum(shape))
    # the Gluon kernel itself runs (run_and_check's output is contiguous, like q here or not)
    assert gluon_ready(make_problem(q, k, v, causal=causal), q, k, v, torch.empty_like(q))
    verdict, _, _ = run_and_check(q, k, v, params, causal=causal)
    assert verdict.ok, str(verdict)


@gluon_cases(THREE + [p.replace(num_stages=2) for p in THREE], ODD64, "the Gluon forward")
def test_three_programs_an_sm_on_odd_shapes(params, dtype, shape, causal, layout):
    """The 64-row one-partition form with three programs an SM, each on an 80-register
    launch (its compute warp group at 136): the same walks and queue as two programs, on a
    grid of 3 x SMs."""
    from helpers import rand_qkv, run_and_check

    from fa2gen.generator.cache import load_module
    from fa2gen.runtime.problem import make_problem

    q, k, v = rand_qkv(*shape, dtype=dtype, device="cuda", layout=layout, seed=sum(shape) + params.num_stages)
    assert load_module(make_problem(q, k, v, causal=causal).kernel_spec(), params).LAUNCH["maxnreg"] == 80
    verdict, _, _ = run_and_check(q, k, v, params, causal=causal)
    assert verdict.ok, str(verdict)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="the Gluon forward runs on sm90")
@pytest.mark.parametrize("params", THREE, ids=lambda p: p.label())
@pytest.mark.parametrize(
    "shape,causal,layout", ODD64, ids=[f"{s}-{'causal' if c else 'full'}-{lay}" for s, c, lay in ODD64]
)
def test_three_programs_an_sm_fp8(params, shape, causal, layout):
    """fp8 on three programs an SM, judged by the fp8 rule (docs/fp8.md)."""
    test_gluon_fp8_forward_on_odd_shapes(params, shape, causal, layout)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="the Gluon forward runs on sm90")
@pytest.mark.parametrize("params", ANY_D + list(GLUON_FP8_CANDIDATES), ids=lambda p: p.label())
@pytest.mark.parametrize(
    "shape,causal,layout", ODD, ids=[f"{s}-{'causal' if c else 'full'}-{lay}" for s, c, lay in ODD]
)
def test_gluon_fp8_forward_on_odd_shapes(params, shape, causal, layout):
    """e4m3 inputs with per-(batch, head) factors, judged by the fp8 rule (docs/fp8.md)."""
    from helpers import rand_fp8

    from fa2gen.bench.correctness import check_forward
    from fa2gen.runtime.fp8 import check_descales, transposed_v
    from fa2gen.runtime.launch import forward, gluon_ready
    from fa2gen.runtime.problem import make_problem

    (q, k, v), scales = rand_fp8(*shape, device="cuda", seed=sum(shape), layout=layout)
    problem = make_problem(q, k, v, causal=causal)
    out = torch.full(q.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    assert gluon_ready(problem, q, k, transposed_v(v), out)  # the Gluon kernel itself runs
    lse = torch.full((problem.batch, problem.heads_q, problem.seqlen_q), float("nan"), device="cuda")
    descales = check_descales(problem, q.device, *scales)
    forward(q, k, v, problem, params, out=out, lse=lse, descales=descales)
    verdict = check_forward(q, k, v, problem, out, lse, descales=descales)
    assert verdict.ok, str(verdict)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="the Gluon forward runs on sm90")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "shape,causal",
    [
        ((4, 16, 4, 512 + 33, 512 + 33, 128), True),
        ((8, 16, 16, 1024, 1024, 64), False),
        ((3, 8, 2, 200, 333, 128), True),
    ],
    ids=["gqa-causal", "full", "nq<nk"],
)
def test_persistent_gluon_forward_walks_many_tiles(dtype, shape, causal):
    """More tiles than programs (two per SM, run in two waves of one): every program walks
    several, carrying ring phases and Q's buffer from one tile to the next."""
    from helpers import rand_qkv, run_and_check

    params = TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=3, loads="tma_host", gluon=2, persistent=2)
    q, k, v = rand_qkv(*shape, dtype=dtype, device="cuda", seed=sum(shape))
    verdict, _, _ = run_and_check(q, k, v, params, causal=causal)
    assert verdict.ok, str(verdict)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="the Gluon forward runs on sm90")
@pytest.mark.parametrize(
    "params",
    [
        TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=3, loads="tma_host", gluon=2, persistent=2),
        TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host", gluon=2, persistent=1),
        *THREE,
    ],
    ids=lambda p: p.label(),
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("waves", [0, 1, 2], ids=["one-tile", "grid+1", "2grid+1"])
def test_persistent_programs_that_take_none_one_or_more_tiles(params, causal, waves):
    """A persistent program loads the next tile's Q into the other of two slots and posts each
    tile's number in that slot's own word, so the end-of-tiles word lands in either slot: one
    tile in all (every other program takes none), and one tile more than the grid, or than two
    grids, so that one program takes one tile more than the rest. Under the mask tiles come
    from a counter, and which program takes how many is up to the race."""
    from helpers import rand_qkv, run_and_check

    grid = params.persistent * torch.cuda.get_device_properties(0).multi_processor_count
    tiles = waves * grid + 1  # one query block a (batch, head): 77 rows, or 45 on 64-row tiles
    rows, d = (77, 128) if params.block_m == 128 else (45, 64)  # three programs an SM: D=64 only
    q, k, v = rand_qkv(tiles, 1, 1, rows, rows, d, dtype=torch.float16, device="cuda", seed=tiles)
    verdict, _, _ = run_and_check(q, k, v, params, causal=causal)
    assert verdict.ok, str(verdict)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="the Gluon forward runs on sm90")
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("persistent", [0, 2], ids=["plain", "persistent2"])
@pytest.mark.parametrize(
    "shape",
    [(8, 16, 4, 1000 + 9, 1000 + 9, 128), (4, 16, 4, 1009, 700, 128), (16, 16, 4, 200, 777, 64)],
    ids=["square", "nq>nk", "nq<nk"],
)
def test_causal_partitions_skip_the_key_blocks_their_rows_do_not_see(stages, persistent, shape):
    """On 64-key blocks the first of two partitions stops a block before the tile's last and
    hands the skipped slots back once they land, at every ring depth; with more tiles (512-1024)
    than a persistent grid's 264 programs, each program walks several such tiles, reusing
    slots across them. Nq > Nk: the first rows see no key; Nq < Nk: more keys than queries."""
    from helpers import rand_qkv, run_and_check

    params = TuningParams(
        block_m=128, block_n=64, num_warps=8, num_stages=stages, loads="tma_host", gluon=2, persistent=persistent
    )
    q, k, v = rand_qkv(*shape, dtype=torch.bfloat16, device="cuda", seed=sum(shape) + stages)
    verdict, _, _ = run_and_check(q, k, v, params, causal=True)
    assert verdict.ok, str(verdict)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="the Gluon forward runs on sm90")
@pytest.mark.parametrize("persistent", [0, 1], ids=["plain", "persistent1"])
@pytest.mark.parametrize(
    "stages,shape",
    [(3, (4, 16, 4, 700, 1009, 128)), (3, (4, 16, 4, 1009, 945, 128)), (4, (4, 16, 4, 1000, 1064, 64))],
    ids=["nq<nk", "nq>nk", "d64-4stages"],
)
def test_overlapped_softmax_with_a_shorter_k_ring_where_partitions_skip_blocks(stages, persistent, shape):
    """The overlapped softmax (two partitions on 128 x 128 tiles, three stages or more) keeps
    K a slot shallower than V. In these shapes one of a tile's partitions skips its last key
    block in most query blocks, and with 384-512 tiles a persistent program walks several,
    refilling both rings across tiles after the skipped slots were handed back."""
    from helpers import rand_qkv, run_and_check

    params = TuningParams(
        block_m=128, block_n=128, num_warps=8, num_stages=stages, loads="tma_host", gluon=2, persistent=persistent
    )
    q, k, v = rand_qkv(*shape, dtype=torch.float16, device="cuda", seed=sum(shape) + stages)
    verdict, _, _ = run_and_check(q, k, v, params, causal=True)
    assert verdict.ok, str(verdict)


QUEUED = [
    TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host", gluon=2, persistent=1),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=3, loads="tma_host", gluon=1, persistent=1),
]


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="the Gluon forward runs on sm90")
@pytest.mark.parametrize("params", QUEUED, ids=lambda p: p.label())
def test_causal_tile_counter_is_left_at_zero_on_each_stream(params):
    """The causal persistent forward's programs claim tiles from a counter that its last
    program sets back to zero: launches one after another on a stream, and on another
    stream with its own counter, each compute every tile (one and two compute partitions)."""
    from helpers import rand_qkv

    from fa2gen.bench.correctness import check_forward
    from fa2gen.runtime.launch import forward, zero_counters
    from fa2gen.runtime.problem import make_problem

    q, k, v = rand_qkv(4, 16, 4, 1000 + 9, 1000 + 9, 128, dtype=torch.float16, device="cuda", seed=5)
    problem = make_problem(q, k, v, causal=True)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), torch.cuda.current_stream(), side):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = torch.full_like(q, float("nan"))
            lse = torch.full((4, 16, 1009), float("nan"), device="cuda")
            forward(q, k, v, problem, params, out=out, lse=lse)
            counter = zero_counters(q.device, 2)
        torch.cuda.synchronize()
        assert not counter.any()  # (the stream's buffer: at least the two words)
        verdict = check_forward(q, k, v, problem, out, lse)
        assert verdict.ok, str(verdict)
    assert zero_counters(q.device, 2).data_ptr() != counter.data_ptr()  # the side stream's own


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="the Gluon forward runs on sm90")
def test_causal_queue_under_cuda_graphs():
    """Two graphs of the causal persistent forward, captured on the one capture stream and
    replayed in the other order, then an eager call: each has a counter its replay zeroes."""
    from helpers import rand_qkv

    from fa2gen.bench.correctness import check_forward
    from fa2gen.runtime.launch import Launch, forward
    from fa2gen.runtime.problem import make_problem

    params = QUEUED[0]
    cases = []
    for seed in (1, 2):
        q, k, v = rand_qkv(2, 16, 4, 700 + seed, 700 + seed, 128, dtype=torch.bfloat16, device="cuda", seed=seed)
        problem = make_problem(q, k, v, causal=True)
        launch = Launch(problem, params)
        out = torch.empty_like(q)
        lse = torch.empty(problem.batch, problem.heads_q, problem.seqlen_q, device="cuda")
        forward(q, k, v, problem, params, out=out, lse=lse, launch=launch)  # compiled outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward(q, k, v, problem, params, out=out, lse=lse, launch=launch)
        cases.append((q, k, v, problem, out, lse, graph))
    for q, k, v, problem, out, lse, graph in reversed(cases):
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        verdict = check_forward(q, k, v, problem, out, lse)
        assert verdict.ok, str(verdict)
    q, k, v, problem, out, lse, _ = cases[0]
    out.fill_(float("nan"))
    forward(q, k, v, problem, params, out=out, lse=lse)
    assert check_forward(q, k, v, problem, out, lse).ok


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="the Gluon forward runs on sm90")
def test_gluon_forward_falls_back_where_descriptors_cannot_go():
    from helpers import rand_qkv, run_and_check

    from fa2gen.runtime.defaults import default_params
    from fa2gen.runtime.launch import Launch, gluon_ready
    from fa2gen.runtime.problem import make_problem

    q, k, v = rand_qkv(1, 4, 4, 300, 300, 64, device="cuda", seed=9)
    # a base 2 bytes past a 16-byte boundary: no descriptor can address it
    shifted = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")[1:].view(q.shape).copy_(q)
    problem = make_problem(shifted, k, v)
    assert not gluon_ready(problem, shifted, k, v, q) and gluon_ready(problem, q, k, v, q)
    verdict, _, _ = run_and_check(shifted, k, v, WS2)
    assert verdict.ok, str(verdict)
    assert Launch(problem, WS2).fallback().params == default_params(problem.kernel_spec(), "sm90", 300)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="the Gluon forward runs on sm90")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_through_a_gluon_forward(monkeypatch, causal):
    """attention() with the Gluon forward dispatched: its LSE feeds the backward."""
    from helpers import rand_qkv

    import fa2gen
    import fa2gen.runtime.api as api
    from fa2gen.bench.correctness import check_backward
    from fa2gen.runtime.dispatch import clear_memo
    from fa2gen.runtime.problem import make_problem

    chosen = []

    def params(problem, dev, direction="fwd"):
        chosen.append(WS2)
        return WS2

    monkeypatch.setattr(api, "select_params", params)
    clear_memo()
    q, k, v = rand_qkv(2, 8, 2, 1000 + 37, 1000 + 37, 128, dtype=torch.bfloat16, device="cuda", seed=11)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fa2gen.attention(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    out.backward(dout)
    # the call's launch ran the Gluon kernel (a fallback would have loaded its own launch's module)
    from fa2gen.runtime import dispatch

    ran = [launch for launch in dispatch._launches.values() if launch.params.gluon]
    assert chosen and ran and all(launch.module is not None for launch in ran)
    clear_memo()
    problem = make_problem(q, k, v, causal=causal)
    verdict = check_backward(q.detach(), k.detach(), v.detach(), problem, dout, q.grad, k.grad, v.grad)
    assert verdict.ok, str(verdict)
