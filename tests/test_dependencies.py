"""What a run depends on, declared once (`job.dependencies`): every Settings field says what a change of it changes,
and the fingerprint, the model's key and a warm worker's key follow those marks. A killed run resumed with a
value-changing option changed is refused, as is an `--update` with it changed; with any other option changed the
resume goes on; a warm worker given a job that differs in anything that changes rows builds again."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torchvision

from featdump.errors import ResumeMismatch
from featdump.job import dependencies, staging, warm
from featdump.job.options import option
from featdump.job.runner import extract
from featdump.job.settings import Settings

from .helpers import CrashAfterFirstBatch, images_fixture, read_output, settings_for

# A value each field can take other than the one `settings_for` gives it (or its default).
OTHER = {
    "model": "resnet34", "layers": ("fc",), "images": "elsewhere", "output": "elsewhere.h5", "weights": "w.pt",
    "seed": 1, "transform": "tinyvit:small", "trust_pickle": True, "batch_size": 2, "num_workers": 1,
    "device": "auto", "array": "imgBrick", "image_column": "image", "label_column": "kind", "split": "test",
    "reader": "folder", "reader_option": ("grey=3",), "image_root": "photos",
    "clip": 4, "fps": 2.0,
    "clip_every": 1.5, "clip_origin": 0.5, "clip_anchor": "end", "clip_pad": "repeat", "dtype": "float16",
    "reduce": ("flatten",), "pca_fit": "4", "compression": "lzf", "precision": "bf16", "decode": "cpu",
    "fast_decode": True, "compile": True, "compile_cache": "cache", "store_patience": 5.0, "scratch": "scratch",
    "proof": 0, "on_error": "fail", "overwrite": True, "update": True, "retry_skipped": True, "shard": "0/2",
    "shard_pattern": "part-{k}-of-{n}.h5", "merge_timeout": 10.0, "space_check": False, "command": "featdump extract",
}
FINGERPRINTED = {"model", "weights", "seed", "transform", "layers", "dtype", "reduce", "precision", "fast_decode",
                 "decode"}  # what files made before the marks record by name: a resume of one must still match


def changed(settings: Settings, name: str) -> Settings:
    extra = {"reduce": ("pca:2",)} if name == "pca_fit" else {}
    return dataclasses.replace(settings, **{name: OTHER[name], **extra})


def base(**overrides) -> Settings:
    return settings_for("images", "out.h5", **overrides)


def test_every_field_says_what_it_changes_and_a_field_without_a_mark_is_refused():
    marks = dependencies.marks_of(Settings)
    assert set(marks) == {field.name for field in dataclasses.fields(Settings)} == set(OTHER)
    assert all(mark <= set(dependencies.MARKS) for mark in marks.values())

    @dataclasses.dataclass(frozen=True)
    class Unmarked:
        marked: int = option(0, "said", changes=())
        silent: int = option(0, "not said")

    with pytest.raises(KeyError, match="Settings.silent does not say what it changes"):
        dependencies.marks_of(Unmarked)


def test_the_fields_recorded_by_name_are_those_files_already_record_and_any_new_one_defaults_to_none():
    recorded = dependencies.fingerprinted(base())
    assert FINGERPRINTED <= set(recorded)
    defaults = {field.name: field.default for field in dataclasses.fields(Settings)}
    assert all(defaults[name] is None for name in set(recorded) - FINGERPRINTED), \
        "a VALUES field that older files do not record must default to None, or they stop resuming"
    assert dependencies.fingerprinted(base(), layers=["avgpool"])["layers"] == ["avgpool"]  # as resolved


def test_every_model_field_is_a_keyword_of_load_model():
    import inspect

    from featdump.sources.models import load_model

    model_fields = set(dict(dependencies.model_key(base())))
    assert model_fields and model_fields <= set(inspect.signature(load_model).parameters)


@pytest.mark.parametrize("name", sorted(OTHER))
def test_a_warm_worker_s_key_changes_with_every_field_that_changes_rows_model_or_compiled_and_no_other(name):
    before, after = base(), changed(base(), name)
    if name == "pca_fit":
        before = dataclasses.replace(before, reduce=("pca:2",), pca_fit="3")
    touches = bool(dependencies.marks_of(Settings)[name] - {dependencies.LAYOUT})  # the file's layout: not a worker's
    assert (dependencies.run_key(before) != dependencies.run_key(after)) is touches


def test_the_model_key_is_load_model_s_keywords():
    assert dict(dependencies.model_key(base(seed=3))) == {"model": "resnet18", "weights": "none", "seed": 3,
                                                          "transform": None, "trust_pickle": False}


images = images_fixture({"a": 3, "b": 3}, size=(40, 32), scope="function")


def make_partial(settings: Settings) -> None:
    with pytest.raises(RuntimeError, match="simulated crash"):
        extract(settings, CrashAfterFirstBatch())


def checkpoint(tmp_path) -> str:
    torch.manual_seed(5)
    path = tmp_path / "w.pt"
    torch.save(torchvision.models.resnet18().state_dict(), path)
    return str(path)


REFUSED = {  # a value-changing field, another value, and what the refusal names
    "model": ("resnet34", "model: "), "layers": (("fc",), "layers: "), "seed": (1, "seed: 0 when started, 1 now"),
    "dtype": ("float16", "dtype: "), "reduce": (("flatten",), "reduce: "), "precision": ("bf16", "precision: "),
    "fast_decode": (True, "fast_decode: "), "weights": (None, "weights: "),
}


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_resume_or_an_update_with_a_value_changing_option_changed_is_refused(images, tmp_path):
    settings = settings_for(images, tmp_path / "out.h5")
    make_partial(settings)
    weights = checkpoint(tmp_path)
    for name, (value, named) in REFUSED.items():
        assert dependencies.VALUES in dependencies.marks_of(Settings)[name], name
        with pytest.raises(ResumeMismatch, match=named):
            extract(dataclasses.replace(settings, **{name: weights if name == "weights" else value}))
    extract(settings)  # the partial file untouched by the refusals: resumed and finished
    for name, (value, named) in REFUSED.items():
        if name == "layers":
            continue  # --update adds the layers it lacks
        named = "reduced with none; this command asks for flatten" if name == "reduce" else named  # a stored layer's
        with pytest.raises(ResumeMismatch, match=named):
            extract(dataclasses.replace(settings, update=True, **{name: weights if name == "weights" else value}))


GOES_ON = {"batch_size": 2, "num_workers": 1, "proof": 0, "on_error": "fail", "store_patience": 5.0,
           "space_check": False, "compression": "lzf", "device": "auto", "merge_timeout": 10.0}


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_resume_with_every_other_option_changed_goes_on_to_the_same_rows(images, tmp_path):
    """All at once: the fingerprint compares field by field, so none of them alone would refuse either."""
    assert not any(dependencies.VALUES in dependencies.marks_of(Settings)[name] for name in GOES_ON)
    clean, output = tmp_path / "clean.h5", tmp_path / "out.h5"
    extract(settings_for(images, clean))
    settings = settings_for(images, output)
    make_partial(settings)
    extract(dataclasses.replace(settings, **GOES_ON))
    resumed, expected = read_output(output), read_output(clean)
    assert resumed["paths"] == expected["paths"]
    np.testing.assert_allclose(resumed["avgpool"], expected["avgpool"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_warm_worker_given_a_job_that_differs_in_a_row_changing_field_builds_again(images, tmp_path):
    first = settings_for(images, tmp_path / "first.h5")
    others = {"seed": 1, "dtype": "float16"}  # another model; the same model, its rows stored otherwise
    with warm.kept_warm():
        staging.extract(first)
        for name, value in others.items():
            staging.extract(dataclasses.replace(first, output=tmp_path / f"{name}.h5", **{name: value}))
    for name, value in others.items():
        cold = dataclasses.replace(first, output=tmp_path / f"cold-{name}.h5", **{name: value})
        staging.extract(cold)
        layer = cold.layers[0]
        np.testing.assert_array_equal(read_output(tmp_path / f"{name}.h5")[layer], read_output(cold.output)[layer],
                                      err_msg=name)
