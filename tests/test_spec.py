import dataclasses

import pytest
import triton

from fa2gen.generator import identity, rendering
from fa2gen.generator.identity import Variant
from fa2gen.generator.spec import KernelSpec, SpecError, TuningParams, unsupported


def test_defaults_are_valid():
    KernelSpec()
    TuningParams()


@pytest.mark.parametrize(
    "field,value",
    [
        ("direction", "bwd_typo"),
        ("dtype", "fp32"),
        ("head_dim", 12),
        ("head_dim", 264),
        ("head_dim", 64.0),
        ("head_dim", True),
        ("mask", "causal\nimport os"),
        ("softcap", 1),
        ("softcap", "yes"),
    ],
)
def test_spec_rejects(field, value):
    with pytest.raises(SpecError, match=field):
        KernelSpec(**{field: value})


@pytest.mark.parametrize(
    "field,value",
    [
        ("block_m", 48),
        ("block_m", 512),
        ("block_n", "64"),
        ("num_warps", 3),
        ("num_stages", 0),
        ("num_stages", True),
        ("loads", "tma; os.system('x')"),
    ],
)
def test_params_reject(field, value):
    with pytest.raises(SpecError, match=field):
        TuningParams(**{field: value})


def test_from_dict_round_trip_and_unknown_fields():
    s = KernelSpec(dtype="bf16", head_dim=80, mask="local", softcap=True)
    assert KernelSpec.from_dict(s.to_dict()) == s
    p = TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=3, loads="tma_host")
    assert TuningParams.from_dict(p.to_dict()) == p
    with pytest.raises(SpecError, match="unknown"):
        TuningParams.from_dict({**p.to_dict(), "__class__": "x"})
    with pytest.raises(SpecError, match="mapping"):
        KernelSpec.from_dict(["fwd"])


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        KernelSpec().head_dim = 128


def test_head_dim_padding():
    assert KernelSpec(head_dim=80).head_dim_padded == 128
    assert KernelSpec(head_dim=64).head_dim_padded == 64
    assert KernelSpec(head_dim=16).head_dim_padded == 16
    assert KernelSpec(head_dim=200).head_dim_padded == 256


def test_name_and_digest_are_stable_and_derived():
    v = Variant(KernelSpec(dtype="bf16", head_dim=96, mask="causal"), TuningParams(128, 64, 4, 3, "tma_host"))
    again = Variant(KernelSpec(dtype="bf16", head_dim=96, mask="causal"), TuningParams(128, 64, 4, 3, "tma_host"))
    assert v.name == again.name and v.digest == again.digest
    assert v.name.startswith("fa2gen_fwd_bf16_d96_causal_m128_n64_w4_s3_tma_host_")
    assert v.name.endswith(v.digest) and len(v.digest) == 12
    assert v.name.isidentifier()


def test_every_field_changes_the_digest():
    base = Variant(KernelSpec(), TuningParams())
    changed = [
        Variant(KernelSpec(dtype="bf16"), TuningParams()),
        Variant(KernelSpec(head_dim=72), TuningParams()),
        Variant(KernelSpec(mask="local"), TuningParams()),
        Variant(KernelSpec(softcap=True), TuningParams()),
        Variant(KernelSpec(), TuningParams(block_m=128)),
        Variant(KernelSpec(), TuningParams(block_n=32)),
        Variant(KernelSpec(), TuningParams(num_warps=8)),
        Variant(KernelSpec(), TuningParams(num_stages=3)),
        Variant(KernelSpec(), TuningParams(loads="tma_device")),
        Variant(KernelSpec(), TuningParams(loads="tma_host")),
        Variant(KernelSpec(), TuningParams(persistent=1)),
        Variant(KernelSpec(dtype="fp8e4m3"), TuningParams()),
    ]
    digests = {base.digest} | {v.digest for v in changed}
    assert len(digests) == len(changed) + 1


def test_digest_covers_template_and_triton_version(monkeypatch):
    v0 = Variant(KernelSpec(), TuningParams()).digest
    monkeypatch.setattr(triton, "__version__", "0.0.0-other")
    v1 = Variant(KernelSpec(), TuningParams()).digest
    monkeypatch.undo()
    monkeypatch.setattr(identity, "template_hash", lambda direction: "feedfacefeedface")
    v2 = Variant(KernelSpec(), TuningParams()).digest
    assert len({v0, v1, v2}) == 3
    assert rendering.template_hash("fwd") != "feedfacefeedface"


def test_persistent_knob():
    v = Variant(KernelSpec(), TuningParams(128, 64, 4, 3, "tma_host", persistent=2))
    assert "_persistent2_" in v.name and TuningParams(persistent=2).label().endswith(" persistent2")
    for bad in (4, -1, True, 1.0):
        with pytest.raises(SpecError, match="persistent"):
            TuningParams(persistent=bad)
    assert "forward knob" in unsupported(KernelSpec(direction="bwd"), TuningParams(persistent=1))
    assert unsupported(KernelSpec(), TuningParams(persistent=1)) is None


def test_three_programs_an_sm_are_the_64_row_gluon_forms_at_d64():
    """persistent=3 launches the one-partition Gluon form with 80 registers a thread, which
    is what lets three programs share an SM: nothing else takes it, and where three do not
    fit in shared memory the arch rules it out."""
    from fa2gen.generator.arch import fits

    three = TuningParams(64, 64, 4, 3, "tma_host", persistent=3, gluon=1)
    d64 = KernelSpec(head_dim=64, mask="causal")
    assert unsupported(d64, three) is None and fits(d64, three, "sm90") is None
    assert "64-row partition" in unsupported(d64, three.replace(gluon=0))  # the Triton template
    assert "64-row partition" in unsupported(d64, three.replace(block_m=128, num_warps=8, gluon=2))
    assert "head dim 64" in unsupported(KernelSpec(head_dim=128), three)
    assert "head dim 64" in unsupported(KernelSpec(dtype="fp8e4m3", head_dim=128), three.replace(num_stages=2))
    # 16-bit D=64: 16 KB of Q and 8 KB a K or V slot, so three stages fit three times, four do not
    assert "three programs an SM" in fits(d64, three.replace(num_stages=4), "sm90")
    assert fits(KernelSpec(dtype="fp8e4m3", head_dim=64), three.replace(num_stages=5), "sm90") is None
    assert fits(d64, three.replace(num_stages=4, persistent=2), "sm90") is None  # two: not checked per SM


def _edited_templates(monkeypatch, filename: str, edit):
    """Render from a copy of the templates in which ``filename`` is ``edit(its text)``."""
    import jinja2

    sources = {
        f: rendering._file_source(f)
        for f in set(rendering.TEMPLATES.values()) | set(rendering.GLUON_TEMPLATES.values())
    }
    edited = edit(sources[filename])
    assert edited != sources[filename]
    sources[filename] = edited
    patched = jinja2.Environment(
        loader=jinja2.DictLoader(sources),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    monkeypatch.setattr(rendering, "_environment", lambda: patched)
    monkeypatch.setattr(identity, "render", rendering.render)
    identity.code_digest.cache_clear()


def test_code_digest_follows_the_code_not_the_comments(monkeypatch):
    """An entry is valid while its params render to the same code: a comment or docstring edit
    in a template changes no variant's digest, and a code edit changes exactly the digests of
    the variants that render it (here: the Gluon forward's causal tile queue)."""
    from fa2gen.generator.identity import code_digest
    from fa2gen.generator.spec import param_space

    specs = [KernelSpec(dtype="fp16", head_dim=64, mask=m) for m in ("none", "causal")]
    variants = [(s, p) for s in specs for p in param_space(s) if p.gluon]
    assert variants
    code_digest.cache_clear()
    before = {v: code_digest(*v) for v in variants}
    template = rendering.GLUON_TEMPLATES["fwd"]
    try:
        _edited_templates(
            monkeypatch,
            template,
            lambda t: (
                t.replace("# Claims need no ordering", "# Reworded: claims need no ordering").replace(
                    '    """Tile t\'s query block', '    """Reworded. Tile t\'s query block'
                )
                + "\n# a comment at the end\n\n"
            ),
        )
        assert {v: code_digest(*v) for v in variants} == before
        monkeypatch.undo()
        _edited_templates(
            monkeypatch,
            template,
            lambda t: t.replace(
                't = gl.atomic_add(TILES, 1, sem="relaxed")', 't = gl.atomic_add(TILES, 1, sem="relaxed") + 0'
            ),
        )
        changed = {v for v in variants if code_digest(*v) != before[v]}
        assert changed and changed == {(s, p) for s, p in variants if s.mask == "causal" and p.persistent > 0}
    finally:
        monkeypatch.undo()
        code_digest.cache_clear()
    assert {v: code_digest(*v) for v in variants} == before
