"""A template's own knobs (``descriptors.Knob``): declared in its descriptor alone, then taken,
validated, stored, labelled and loaded by TuningParams, searched by the tuner's space and
given to ``fa2gen generate``, with no other change.

The tests declare a toy knob on the Triton forward's descriptor (monkeypatched onto the
class; its template does not read it, so the code it renders is unchanged)."""

import dataclasses

import jinja2
import optuna
import pytest
from typer.testing import CliRunner

from fa2gen.cli import app
from fa2gen.generator.descriptors import template_knobs
from fa2gen.generator.descriptors.attn_fwd import AttnFwd
from fa2gen.generator.descriptors.base import Knob
from fa2gen.generator.identity import Variant
from fa2gen.generator.spec import KernelSpec, SpecError, TuningParams, param_space, unsupported
from fa2gen.tuner.space import local_moves, space_for

TOY = Knob("toy", (0, 1, 2), 0, "a knob for the tests", searched={"sm90": (0, 2)})


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(AttnFwd, "knobs", (TOY,))
    return TOY


def test_no_shipped_template_declares_a_knob_twice():
    assert all(k.name == name for name, (k, _) in template_knobs().items())


def test_a_declared_knob_is_a_params_attribute_stored_under_its_own_name(toy):
    base = TuningParams(128, 64, 4, 2, "tma_host")
    assert base.toy == 0 and base.to_dict() == TuningParams(128, 64, 4, 2, "tma_host").to_dict()
    p = base.replace(toy=2)
    assert p.toy == 2 and p != base and hash(p) != hash(base)
    assert p.to_dict() == {**base.to_dict(), "toy": 2}
    assert TuningParams.from_dict(p.to_dict()) == p
    assert p.label() == base.label() + " toy=2"
    # a knob at its default is the point without it: one point, one name, one stored form
    assert base.replace(toy=0) == base and "toy" not in base.replace(toy=0).to_dict()
    # a template reads it as it reads any other knob
    assert jinja2.Template("{{ params.toy }} {{ params.block_m }}").render(params=p) == "2 128"


def test_a_knob_is_validated_like_the_fields(toy):
    base = TuningParams()
    with pytest.raises(SpecError, match="toy"):
        base.replace(toy=3)
    with pytest.raises(SpecError, match="toy"):
        base.replace(toy=True)  # (a bool is not the int 1)
    with pytest.raises(SpecError, match="unknown knob 'nope'"):
        base.replace(nope=1)
    with pytest.raises(SpecError, match="unknown field"):
        TuningParams.from_dict({**base.to_dict(), "nope": 1})
    with pytest.raises(SpecError, match="extra"):  # a file names each knob itself
        TuningParams.from_dict({**base.to_dict(), "extra": [["toy", 1]]})
    with pytest.raises(AttributeError):
        base.nope  # noqa: B018


def test_a_knob_renders_only_with_its_own_template(toy):
    spec = KernelSpec(head_dim=128)
    plain = TuningParams(128, 64, 4, 2, "tma_host")
    assert unsupported(spec, plain.replace(toy=1)) is None
    gluon = TuningParams(128, 128, 8, 3, "tma_host", gluon=2)
    assert unsupported(spec, gluon) is None
    assert "toy is read by attn_fwd.py.jinja only" in unsupported(spec, gluon.replace(toy=1))
    points = param_space(spec)
    assert plain.replace(toy=1) in points and plain in points and not any(p.toy and p.gluon for p in points)
    assert not any(p.extra for p in param_space(KernelSpec(direction="bwd", head_dim=128)))


def test_without_the_declaration_a_stored_knob_is_refused(toy, monkeypatch):
    stored = TuningParams().replace(toy=1).to_dict()
    monkeypatch.setattr(AttnFwd, "knobs", ())
    with pytest.raises(SpecError, match="unknown field"):
        TuningParams.from_dict(stored)


def test_the_tuner_searches_a_knob_where_its_descriptor_says(toy):
    fwd = space_for("sm90", "fwd")
    without = dataclasses.replace(fwd, extra=())
    assert fwd.choices()["toy"] == (0, 2) and fwd.size() == 2 * without.size()
    assert "toy" not in space_for("sm80", "fwd").choices() and "toy" not in space_for("sm90", "bwd").choices()
    p = TuningParams(128, 64, 8, 2, "tma_host")
    assert fwd.contains(p) and fwd.contains(p.replace(toy=2)) and not fwd.contains(p.replace(toy=1))
    assert fwd.point(p.replace(toy=2))["toy"] == 2 and fwd.point(p)["toy"] == 0
    assert p.replace(toy=2) in local_moves(fwd, p)
    # a space that searches it is a new space: its studies get new names
    assert fwd.digest() != without.digest()


def test_a_study_proposes_and_records_the_knob(toy):
    space = space_for("sm90", "fwd")
    distributions = {n: optuna.distributions.CategoricalDistribution(v) for n, v in space.choices().items()}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    p = TuningParams(128, 64, 8, 2, "tma_host").replace(toy=2)
    study.enqueue_trial(space.point(p))
    trial = study.ask(distributions)
    assert TuningParams.from_dict(trial.params) == p


def test_a_study_searches_the_knob_and_reads_back_its_points(toy, tmp_path):
    from fa2gen.store.buckets import Bucket
    from fa2gen.tuner.evaluate import CostModelEvaluator
    from fa2gen.tuner.run import open_storage
    from fa2gen.tuner.study import params_of, tune_bucket

    storage = open_storage(f"sqlite:///{tmp_path / 's.sqlite'}")
    bucket = Bucket("fwd", "fp16", 128, "causal", False, 1, 4096, 4096, 64)
    default = TuningParams(128, 64, 4, 2, "tma_host")
    r = tune_bucket(
        bucket,
        CostModelEvaluator(),
        space_for("sm90", "fwd"),
        storage=storage,
        name_prefix="t",
        trials=30,
        default=default,
    )
    trials = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage).get_trials()
    assert {t.params["toy"] for t in trials} == {0, 2}  # (the default enqueued at 0; the sampler tried 2)
    assert all(params_of(t.params).toy == t.params["toy"] for t in trials)
    assert r.best is not None and params_of(r.best.to_dict()) == r.best


def test_generate_takes_a_knob(toy):
    runner = CliRunner()
    ok = runner.invoke(app, ["generate", "--knob", "toy=2"])
    plain = runner.invoke(app, ["generate"])
    assert ok.exit_code == 0 and plain.exit_code == 0, ok.output
    # another variant, named so (the toy changes nothing the template reads, only the name)
    assert "_toy2_" in ok.output and "_toy2_" not in plain.output
    for bad, why in (("toy=3", "toy"), ("nope=1", "unknown knob"), ("toy", "NAME=VALUE")):
        r = runner.invoke(app, ["generate", "--knob", bad])
        assert r.exit_code != 0 and why in r.output, r.output


def test_a_knob_makes_another_variant(toy):
    spec = KernelSpec()
    base = TuningParams(128, 64, 4, 2, "tma_host")
    a, b = Variant(spec, base), Variant(spec, base.replace(toy=1))
    assert a.name != b.name and a.digest != b.digest and "_toy1_" in b.name and "toy" not in a.name
