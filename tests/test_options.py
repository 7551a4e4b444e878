"""Options: each declared once; a bad value fails with the same one line through the CLI, a config file and the
API, before anything is opened or written."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

import featdump
from featdump.errors import BadOption, ConfigProblem, UsageProblem
from featdump.faces.cli import main
from featdump.job.settings import OPTIONS, Settings

# A bad value of every option: as Python/TOML values, and as the CLI's text where the option takes one.
BAD = {
    "model": ("", ""),
    "layers": ([","], ","),
    "seed": ("1.5", "1.5"),
    "transform": ("nocolon", "nocolon"),
    "trust_pickle": ("yes", None),
    "batch_size": (0, "0"),
    "num_workers": (-3, "-3"),
    "device": ("mps", "mps"),
    "dtype": ("int8", "int8"),
    "reduce": ("mean", "mean"),
    "compression": ("zstd9", "zstd9"),
    "precision": ("fp64", "fp64"),
    "decode": ("gpuu", "gpuu"),
    "fast_decode": (1, None),
    "compile": ("yes", None),
    "compile_cache": ("", ""),
    "on_error": ("skp", "skp"),
    "overwrite": ("no", None),
    "update": (0, None),
    "retry_skipped": ("all", None),
    "shard": ("5/3", "5/3"),
    "shard_pattern": ("part-{k}.h5", "part-{k}.h5"),
    "merge_timeout": (0, "0"),
    "store_patience": (-1, "-1"),
    "scratch": ("", ""),
    "proof": (-1, "-1"),
    "clip": (0, "0"),
    "fps": (-2, "-2"),
    "clip_every": ("often", "often"),
    "clip_anchor": ("middle", "middle"),
    "clip_pad": ("black", "black"),
    "clip_origin": ("soon", "soon"),
    "space_check": ("off", None),
    "pca_fit": ("1", "1"),
    "array": ("", ""),
    "image_column": ("", ""),
    "label_column": ("", ""),
    "split": ("", ""),
    "reader": ("", ""),
    "image_root": ("", ""),
    "reader_option": ("novalue", "novalue"),
}
FREE_TEXT = {"weights"}  # any text is a weights name or a checkpoint path, checked when the model loads


def test_every_option_has_a_bad_value_here():
    assert set(BAD) | FREE_TEXT == set(OPTIONS)


def api_error(images, name, value) -> str:
    options = {"model": "resnet18", "layers": "avgpool", name: value}
    with pytest.raises(BadOption) as raised:
        featdump.extract(images, images.parent / "out.h5", **options)
    return str(raised.value)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_fails_alike_through_the_api_a_config_file_and_the_cli(tmp_path, image_folder, name):
    value, text = BAD[name]
    expected = api_error(image_folder, name, value)
    assert "\n" not in expected and expected

    config = tmp_path / "job.toml"
    toml_value = '"' + value + '"' if isinstance(value, str) else '[","]' if isinstance(value, list) \
        else str(value).lower()
    base = {"model": '"resnet18"', "layers": '["avgpool"]'}
    config.write_text("".join(f"{key} = {text}\n" for key, text in {**base, name: toml_value}.items()))
    runner = CliRunner()
    result = runner.invoke(main, ["extract", "--config", str(config), str(image_folder), str(tmp_path / "out.h5")])
    assert result.exit_code == 2
    assert result.stderr == f"Error: {config}: {expected}\n"

    if text is not None:  # flags take no value on the command line
        arguments = ["extract", "-m", "resnet18", "-l", "avgpool", OPTIONS[name].flag, text]
        if name in ("model", "layers"):
            arguments = ["extract", *(["-l", "avgpool"] if name == "model" else ["-m", "resnet18"]),
                         OPTIONS[name].flag, text]
        result = runner.invoke(main, [*arguments, str(image_folder), str(tmp_path / "out.h5")])
        assert result.exit_code == 2, result.output
        assert result.stderr == f"Error: {expected}\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["images", "job.toml"]  # no OUT.lock, OUT.partial


def test_environment_values_are_checked_the_same_way(image_folder, tmp_path):
    result = CliRunner().invoke(main, ["extract", "-m", "resnet18", "-l", "avgpool", str(image_folder),
                                       str(tmp_path / "out.h5")], env={"FEATDUMP_EXTRACT_BATCH_SIZE": "0"})
    assert result.exit_code == 2
    assert result.stderr == "Error: 'batch_size' must be at least 1, not 0. On the command line: --batch-size.\n"


def test_settings_check_themselves_and_normalise():
    settings = Settings(model="resnet18", layers="layer1, avgpool", images="imgs", output="out.h5", merge_timeout=5)
    assert settings.layers == ("layer1", "avgpool") and settings.merge_timeout == 5.0
    assert str(settings.images) == "imgs"
    with pytest.raises(BadOption, match="'images' must be a path"):
        Settings(model="resnet18", layers="avgpool", images=None, output="out.h5")
    with pytest.raises(BadOption):
        dataclasses.replace(settings, batch_size=-1)
    assert issubclass(BadOption, UsageProblem) and issubclass(ConfigProblem, UsageProblem)


def test_the_cli_options_are_the_declared_ones():
    command = main.commands["extract"]
    engine = {"ray_address", "shards", "merge_shards"}  # how a job is spread over a cluster (engines/ray.py)
    declared = {param.name for param in command.params} - {"images", "output", "config"} - engine
    assert declared == set(OPTIONS)
    for param in command.params:
        if param.name in OPTIONS and OPTIONS[param.name].help:
            declared = OPTIONS[param.name].help
            assert (param.generated if callable(declared) else param.help) == declared
