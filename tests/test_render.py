import ast
import itertools

import pytest

from fa2gen.generator import render
from fa2gen.generator.identity import Variant
from fa2gen.generator.rendering import template_source
from fa2gen.generator.spec import DTYPES, HEAD_DIMS, MASKS, KernelSpec, TuningParams, param_space

STRUCTURAL_SPECS = [
    KernelSpec(dtype=dt, head_dim=d, mask=m, softcap=sc)
    for dt, d, m, sc in itertools.product(DTYPES, (64, 80), MASKS, (False, True))
]


@pytest.mark.parametrize("spec", STRUCTURAL_SPECS, ids=lambda s: f"{s.dtype}-d{s.head_dim}-{s.mask}-sc{int(s.softcap)}")
def test_every_param_point_renders_and_parses(spec):
    """Every point renders; only the header (name, CONFIG), the load path and the grid
    (persistent or not: the tile body is the same, inside a loop) vary.

    Parsing 1250 whole modules per spec is slow, so each point's header is parsed on
    its own and its body must equal a fully parsed representative body of its load path.
    """
    bodies = {}
    for params in param_space(spec):
        if params.gluon:  # the Gluon template's points: tests/test_gluon_forward.py
            continue
        src = render(spec, params, name=Variant(spec, params).name)
        head, body = src.split("\nLOG2E", 1)
        tree = ast.parse(head)
        config = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "CONFIG")
        assert ast.literal_eval(config.value) == {
            "BLOCK_M": params.block_m,
            "BLOCK_N": params.block_n,
            "num_warps": params.num_warps,
            "num_stages": params.num_stages,
        }
        structure = (params.loads, params.persistent)
        if structure not in bodies:
            ast.parse(src)
            bodies[structure] = body
        assert body == bodies[structure]
    # Block sizes, warps and stages are constexpr/launch values: only the load path and the
    # grid change code; the persistent grid's programs per SM only its comment.
    assert {loads for loads, _ in bodies} == {"pointer", "tma_device", "tma_host"}
    assert len(set(bodies.values())) == len(bodies) == 9
    for loads in ("pointer", "tma_device", "tma_host"):
        one, two = bodies[loads, 1], bodies[loads, 2]
        assert one.replace("of 1 program(s) per SM", "of 2 program(s) per SM") == two


def test_every_head_dim_renders():
    for d in HEAD_DIMS:
        spec = KernelSpec(head_dim=d, mask="local", softcap=True)
        ast.parse(render(spec, TuningParams(), name=Variant(spec, TuningParams()).name))


def test_structure_follows_spec():
    def src(**kw):
        spec = KernelSpec(**{k: v for k, v in kw.items() if k in KernelSpec.__dataclass_fields__})
        params = TuningParams(loads=kw.get("loads", "pointer"))
        return render(spec, params, name=Variant(spec, params).name)

    plain = src()
    assert "tanh" not in plain.split("import triton")[1] and "win_left)" not in plain and ".load([" not in plain
    assert "offs_d[None, :] < HEAD_DIM" not in plain  # no head padding at D=64
    assert "offs_d[None, :] < HEAD_DIM" in src(head_dim=80)
    assert "tanh" in src(softcap=True)
    assert "k_base.load([b, hk, start_n, 0])" in src(loads="tma_host")
    device = src(loads="tma_device")
    assert "k_base.load([start_n, 0])" in device and device.count("tl.make_tensor_descriptor(") == 4
    assert "tl.load(" not in src(loads="tma_host").split("def attn_fwd")[1].split("tl.store(LSE")[0]
    causal = src(mask="causal")
    assert "offs_m[:, None] + diag" in causal and "win_right" not in causal.split("def attn_fwd")[1].split(
        "m_i = tl.full"
    )[0].replace("win_left, win_right,", "")
    local = src(mask="local")
    assert local.count("_attend_blocks(") == 4  # definition + three key ranges


def test_template_header_lists_knobs():
    head = template_source("fwd").split("import triton")[0]
    for knob in (
        "mask",
        "softcap",
        "loads",
        "pad_head",
        "fp8",
        "persistent",
        "BLOCK_M",
        "BLOCK_N",
        "num_warps",
        "num_stages",
    ):
        assert knob in head
    head = template_source("bwd").split("import triton")[0]
    for knob in ("mask", "softcap", "loads", "pad_head", "dq_mode", "OUTER", "INNER", "num_warps", "num_stages"):
        assert knob in head


def test_render_rejects_unvalidated_input():
    with pytest.raises(TypeError):
        render({"head_dim": 64}, TuningParams(), name="x")


@pytest.mark.parametrize("mask", MASKS)
def test_backward_points_render_and_parse(mask):
    from fa2gen.generator.spec import SpecError

    for d, softcap in ((64, False), (80, True)):
        spec = KernelSpec(direction="bwd", head_dim=d, mask=mask, softcap=softcap)
        points = [p for p in param_space(spec) if not p.gluon]  # Gluon's: tests/test_gluon_backward.py
        assert {p.loads for p in points} == {"pointer", "tma_host"}
        assert {p.dq_mode for p in points} == {"separate", "atomic", "tma_reduce"}
        assert all(p.loads == "tma_host" for p in points if p.dq_mode == "tma_reduce")
        bodies = {}
        for params in points:
            src = render(spec, params, name=Variant(spec, params).name)
            bodies.setdefault((params.loads, params.dq_mode), set()).add(src.split("\nLOG2E", 1)[1])
        # tiles, warps and stages are constexpr/launch values: only the load path and the
        # dQ mode change code
        assert all(len(b) == 1 for b in bodies.values()) and len({next(iter(b)) for b in bodies.values()}) == 5
        for (loads, dq_mode), body in ((key, next(iter(b))) for key, b in bodies.items()):
            tree = ast.parse(src.split("\nLOG2E", 1)[0] + "\nLOG2E" + body)
            kernels = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            dq_kernel = "attn_bwd_dq" if dq_mode == "separate" else "attn_bwd_dq_store"
            assert {"attn_bwd_delta", "attn_bwd_dkdv", dq_kernel} <= kernels
            assert ("tl.atomic_add" in body) == (dq_mode == "atomic")
            assert ("DQACC.atomic_add(" in body) == (dq_mode == "tma_reduce")
        assert ".load([b, h, start_m, 0])" in next(iter(bodies["tma_host", "separate"]))
        with pytest.raises(SpecError, match="in the Gluon kernels of a packed batch only"):
            render(spec, TuningParams(loads="tma_device"), name="x")
    with pytest.raises(SpecError, match="backward knob"):
        render(KernelSpec(head_dim=64), TuningParams(dq_mode="atomic"), name="x")


def test_backward_template_header_lists_knobs():
    head = template_source("bwd").split("import triton")[0]
    for knob in ("mask", "softcap", "pad_head", "OUTER", "INNER", "num_warps", "num_stages"):
        assert knob in head


def test_the_gluon_forward_sums_its_rows_in_chains_where_triton_adds_a_tree():
    """compat.sums_in_tree: from 3.8 Triton adds a reduction's values in a thread as a tree, and
    the Gluon forward's softmax adds each row itself (_row_sum); 3.6 and 3.7 keep gl.sum. Only
    that template and the Gluon backward depend on the version."""
    gluon = TuningParams(128, 128, 8, 3, "tma_host", gluon=2)
    for dtype in ("fp16", "bf16", "fp8e4m3"):
        spec = KernelSpec(dtype=dtype, head_dim=128)
        older = render(spec, gluon, name="x", triton="3.7.1")
        newer = render(spec, gluon, name="x", triton="3.8.0")
        assert "_row_sum(p)" not in older and "+ gl.sum(p, 1)" in older
        assert "_row_sum(p)" in newer and "def _chain(" in newer and "+ gl.sum(p, 1)" not in newer
        assert render(spec, gluon, name="x", triton="3.9.0") == newer
        assert render(spec, gluon, name="x", triton="3.6.0") == older
        ast.parse(newer)
    others = [
        (KernelSpec(dtype="bf16", head_dim=128), TuningParams(128, 64, 4, 2, "tma_host")),
        (KernelSpec(direction="bwd", dtype="bf16", head_dim=64), TuningParams(64, 64, 4, 2, "tma_host")),
    ]
    for spec, params in others:
        assert render(spec, params, name="x", triton="3.6.0") == render(spec, params, name="x", triton="3.9.0")


def test_the_gluon_backward_places_its_ring_barrier_and_waits_for_dq_as_this_triton_needs():
    """From 3.7 (compat.barrier_at_first_reader, carried_accumulator_serialises) the Gluon
    backward issues the barrier owed to a step's loads before the ring's wait, and its dQ
    kernel waits for each step's dQ matmul within the step; 3.6 renders as before."""
    spec = KernelSpec(direction="bwd", dtype="bf16", head_dim=128, mask="causal")
    for params in (
        TuningParams(64, 64, 4, 2, "tma_host", gluon=2),
        TuningParams(64, 64, 4, 2, "tma_host", dq_mode="matmul", gluon=1),
    ):
        older = render(spec, params, name="x", triton="3.6.0")
        newer = render(spec, params, name="x", triton="3.7.1")
        assert render(spec, params, name="x", triton="3.9.0") == newer
        ring_wait = "        mbarrier.wait(bars.index(slot), (t // STAGES) & 1)"
        loops = 2 if params.gluon == 2 else 1  # dK/dV's loop, and the dQ kernel's
        assert newer.count("barrier()  # the one Triton owes the last step's loads") == loops
        assert older.count("the one Triton owes") == 0
        for text in (older, newer):
            ast.parse(text)
            assert text.count(ring_wait) == loops
        in_flight = "dq = warpgroup_mma_init("
        assert (in_flight in older, in_flight in newer) == ((params.gluon == 2), False)
    # the one pass has no ring of this shape: the same under every version
    atomic = TuningParams(128, 64, 8, 2, "tma_host", dq_mode="atomic", gluon=1)
    assert render(spec, atomic, name="x", triton="3.6.0") == render(spec, atomic, name="x", triton="3.9.0")


def test_each_descriptor_gives_its_template_exactly_the_variables_it_reads():
    """A template reads only what its descriptor declares, and the descriptor declares nothing
    its template does not read: the descriptor is the template's whole contract."""
    import jinja2.meta

    from fa2gen.generator import rendering
    from fa2gen.generator.descriptors import TEMPLATES, template_of

    points = {
        ("fwd", 0): (KernelSpec(dtype="bf16", head_dim=72, mask="local", softcap=True), TuningParams()),
        ("fwd", 1): (KernelSpec(dtype="fp16", head_dim=64), TuningParams(64, 64, 4, 3, "tma_host", gluon=1)),
        ("fwd", 2): (KernelSpec(dtype="fp8e4m3", head_dim=128), TuningParams(128, 128, 8, 3, "tma_host", gluon=2)),
        ("bwd", 0): (KernelSpec(direction="bwd", dtype="fp16", head_dim=64), TuningParams()),
        ("bwd", 1): (
            KernelSpec(direction="bwd", dtype="bf16", head_dim=128),
            TuningParams(64, 64, 4, 2, "tma_host", gluon=1),
        ),
        ("bwd", 2): (
            KernelSpec(direction="bwd", dtype="bf16", head_dim=64),
            TuningParams(64, 64, 4, 2, "tma_host", gluon=2),
        ),
        ("decode", 0): (KernelSpec(direction="decode", dtype="bf16", head_dim=72, paged=True), TuningParams()),
    }
    assert {(t.direction, g) for t in TEMPLATES for g in t.gluon} == set(points)
    env = rendering._environment()
    for (direction, gluon), (spec, params) in points.items():
        descriptor = template_of(spec, params)
        assert (descriptor.direction, params.gluon) == (direction, gluon) and gluon in descriptor.gluon
        reads = jinja2.meta.find_undeclared_variables(env.parse(rendering._file_source(descriptor.file)))
        assert set(descriptor.variables(spec, params, "x")) == reads, descriptor.file
    assert set(rendering.TEMPLATES.values()) | set(rendering.GLUON_TEMPLATES.values()) == {t.file for t in TEMPLATES}


def test_each_descriptors_kernels_are_its_modules_with_their_constexprs_and_arguments():
    """descriptors.plan lists the kernels a variant runs; each is a function of the module it
    names, whose constexpr parameters are exactly the descriptor's constexprs (a Gluon
    kernel's num_warps comes from its module's LAUNCH) and whose other parameters are the
    descriptor's arguments, in order; a descriptor box names a tensor argument."""
    from fa2gen.generator.descriptors import parts, plan

    specs = [KernelSpec(dtype="fp16", head_dim=64), KernelSpec(dtype="fp8e4m3", head_dim=128, mask="causal")]
    specs += [KernelSpec(direction="bwd", dtype="bf16", head_dim=d, mask="causal") for d in (72, 128)]
    # (a paged cache's page size is a constexpr of both its kernels)
    specs += [KernelSpec(direction="decode", dtype="bf16", head_dim=128, mask="causal", paged=p) for p in (False, True)]
    for spec in specs:
        points = param_space(spec)
        for params in [p for i, p in enumerate(points) if p.gluon or i % 13 == 0]:
            modules = {p: ast.parse(render(spec, p, name="x")) for _, p in parts(spec, params)}
            for module_params, kernel in plan(spec, params):
                found = [f for f in ast.walk(modules[module_params]) if isinstance(f, ast.FunctionDef)]
                [fn] = [f for f in found if f.name == kernel.name]
                constexprs = {
                    a.arg
                    for a in fn.args.args
                    if isinstance(a.annotation, ast.Attribute) and a.annotation.attr == "constexpr"
                }
                assert constexprs - {"num_warps"} == set(kernel.constexprs), (spec, params, kernel.name)
                others = [a.arg for a in fn.args.args if a.arg not in constexprs]
                assert others == [a.name for a in kernel.args], (spec, params, kernel.name)
                tensors = [a.name for a in kernel.args if a.kind == "tensor"]
                assert [n for n in tensors if n in kernel.boxes] == list(kernel.boxes), (spec, params, kernel.name)
                assert (kernel.options is None) == bool(module_params.gluon)
