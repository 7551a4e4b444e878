"""The command line: help everywhere, exact messages and exit codes for bad input, real processes."""

from __future__ import annotations

import gc
import json
import sys
from importlib.metadata import entry_points

import h5py
import pytest
from click.testing import CliRunner

from featdump.faces.cli import console, main
from featdump.inputs.readers import reader_names

from .helpers import featdump_env, run_featdump, write_images


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.mark.parametrize("command", [[], ["extract"], ["list-layers"], ["info"], ["merge"], ["show"]])
def test_help_on_every_command(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    assert "Usage: " in result.output
    assert "featdump " in result.output.split("Options:")[0]  # an example command line


def test_extract_help_says_update_adds_images_and_layers():
    result = invoke("extract", "--help")
    said = " ".join(result.output.split())
    assert "the images it lacks" in said and "the layers --layers names that it lacks" in said, said


def test_layers_given_with_a_space_are_told_to_use_a_comma(tmp_path):
    write_images(tmp_path / "images", {"a": 1})
    for last in ([tmp_path / "images", tmp_path / "out.h5"], [tmp_path / "out.h5"]):  # extra argument; IMAGES missing
        result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer1", "layer4.1.relu:2", *last)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.strip().endswith("Layers are comma-separated: -l layer1,layer4.1.relu:2."), result.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_help_and_version_as_a_process():
    result = run_featdump("--help", process=True)
    assert result.returncode == 0 and "list-layers" in result.stdout
    assert run_featdump("--version", process=True).stdout.startswith("featdump, version ")
    assert run_featdump("extract", "--help", process=True).returncode == 0


def test_list_layers_tree_shows_shapes_and_calls():
    result = invoke("list-layers", "resnet18")
    assert result.exit_code == 0
    line = next(line for line in result.output.splitlines() if line.strip().startswith("layer3.0.downsample.1 "))
    assert "BatchNorm2d" in line and "1x" in line and "(256, 14, 14)" in line
    assert line.startswith("      layer3.0.downsample.1")  # depth 4: three levels of indentation
    relu = next(line for line in result.output.splitlines() if line.strip().startswith("layer1.0.relu "))
    assert "2x" in relu and "layer1.0.relu:1 ... layer1.0.relu:2" in relu


def test_list_layers_json_and_depth():
    result = invoke("list-layers", "resnet18", "--json", "--depth", "2")
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert {row["depth"] for row in rows} == {0, 1, 2}
    assert rows[0]["selector"] == "@" and rows[0]["path"] == "" and rows[0]["shapes"] == [[1000]]  # the model
    assert {"path": "layer1.0", "selector": "layer1.0", "type": "BasicBlock", "depth": 2, "calls": 1,
            "shapes": [[64, 56, 56]], "batch_dims": [0], "per_image": True, "tuple_output": False} in rows


def test_unknown_model_names_close_models():
    result = invoke("list-layers", "resnet19")
    assert result.exit_code == 2
    assert result.output.startswith("Error: Unknown model 'resnet19'. Did you mean: resnet18")
    assert "Traceback" not in result.output


def test_unknown_layer_names_close_matches(image_folder, tmp_path):
    result = invoke("extract", "-m", "resnet18", "-w", "none", "-l", "layer3.0.downsampl.1", image_folder,
                    tmp_path / "o.h5")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "Error: Unknown layer 'layer3.0.downsampl.1' in resnet18. Close matches: layer3.0.downsample.1, "
        "layer4.0.downsample.1, layer3.0.downsample.0, layer2.0.downsample.1, layer3.0.downsample. "
        "Run `featdump list-layers resnet18` to see every layer.")
    assert not list(tmp_path.glob("o.h5*"))


def test_reused_module_without_call(image_folder, tmp_path):
    result = invoke("extract", "-m", "resnet18", "-w", "none", "-l", "layer1.0.relu", image_folder, tmp_path / "o.h5")
    assert result.exit_code == 2
    assert result.output.strip() == ("Error: Layer 'layer1.0.relu' runs 2 times per forward pass; select one call: "
                                     "layer1.0.relu:1 layer1.0.relu:2.")


def test_missing_image_folder(tmp_path):
    result = invoke("extract", "-m", "resnet18", "-l", "fc", tmp_path / "nope", tmp_path / "o.h5")
    assert result.exit_code == 2
    assert f"Error: IMAGES '{tmp_path / 'nope'}' does not exist (the readers: {reader_names()}; `featdump extract " \
        "--help` says what each reads)." in result.output


def test_empty_image_folder(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("not an image")
    result = invoke("extract", "-m", "resnet18", "-w", "none", "-l", "fc", tmp_path / "empty", tmp_path / "o.h5")
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: No images in '{tmp_path / 'empty'}' (looked for bmp, jpeg, jpg, png")


def test_existing_output_needs_overwrite(image_folder, tmp_path):
    output = tmp_path / "o.h5"
    output.write_bytes(b"precious")
    result = invoke("extract", "-m", "resnet18", "-w", "none", "-l", "fc", image_folder, output)
    assert result.exit_code == 2
    assert result.output.strip() == f"Error: Output '{output}' already exists; pass --overwrite to replace it."
    assert output.read_bytes() == b"precious"
    result = invoke("extract", "-m", "resnet18", "-w", "none", "-l", "fc", "--overwrite", "-j", "0",
                    image_folder, output)
    assert result.exit_code == 0, result.output
    with h5py.File(output, "r") as h5file:
        assert h5file["features/fc"].shape == (7, 1000)


def test_offline_pretrained_weights_fail_with_one_clear_sentence(image_folder, tmp_path):
    # An unreachable proxy makes the download fail at once, online or not; an empty TORCH_HOME has no cache.
    env = featdump_env(TORCH_HOME=str(tmp_path / "torch"), https_proxy="http://127.0.0.1:9",
                       HTTPS_PROXY="http://127.0.0.1:9")
    result = run_featdump("extract", "-m", "resnet18", "-l", "fc", image_folder, tmp_path / "o.h5", env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(error_lines) == 1
    assert error_lines[0].startswith("Error: Could not download the pretrained weights ResNet18_Weights.IMAGENET1K_V1")
    assert error_lines[0].endswith("Pass --weights none for a randomly initialised network, "
                                   "or --weights PATH for a local checkpoint.")


def test_unknown_weights_name(image_folder, tmp_path):
    result = invoke("extract", "-m", "resnet50", "-w", "IMAGENET1K_V9", "-l", "fc", image_folder, tmp_path / "o.h5")
    assert result.exit_code == 2
    assert "Unknown weights 'IMAGENET1K_V9' for resnet50" in result.output and "IMAGENET1K_V2" in result.output


def test_the_command_exits_without_the_last_collection(monkeypatch):
    (script,) = [entry for entry in entry_points(group="console_scripts") if entry.name == "featdump"]
    assert script.value == "featdump.faces.cli:console"  # the installed `featdump`, as `python -m featdump`
    monkeypatch.setattr(sys, "argv", ["featdump", "info", "/no/such/file.h5"])
    frozen_before = gc.get_freeze_count()
    try:
        with pytest.raises(SystemExit) as exited:
            console()
        assert exited.value.code == 2  # main's exit code, through
        assert gc.get_freeze_count() > frozen_before  # Python's collection at exit passes the objects by
    finally:
        gc.unfreeze()


@pytest.mark.slow  # the entry point as a real process
def test_extract_as_a_process_writes_a_complete_file(image_folder, tmp_path):
    output = tmp_path / "o.h5"
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer1.0.relu:2,avgpool",
                          "-l", "fc", "-b", "3", "-j", "2", image_folder, output, process=True)
    assert result.returncode == 0, result.stderr
    assert "Wrote 7 images (0 skipped)" in result.stderr
    assert " featdump INFO: " in result.stderr  # plain log lines when stderr is not a terminal
    with h5py.File(output, "r") as h5file:
        assert set(h5file["features"]) == {"layer1.0.relu:2", "avgpool", "fc", "path", "label"}  # + coordinates
        assert h5file["features/layer1.0.relu:2"].shape == (7, 64, 56, 56)
        assert h5file.attrs["complete"] and h5file.attrs["model"] == "resnet18"
        assert "resnet18" in h5file.attrs["command"]
    info = run_featdump("info", output)
    assert info.returncode == 0 and "complete:   yes" in info.stdout and "rows:       7" in info.stdout


def test_bad_device(image_folder, tmp_path):
    result = invoke("extract", "-m", "resnet18", "-w", "none", "-l", "fc", "--device", "tpu", image_folder,
                    tmp_path / "o.h5")
    assert result.exit_code == 2 and "device" in result.output.lower()


def test_options_from_environment_variables(image_folder, tmp_path):
    output = tmp_path / "o.h5"
    result = CliRunner().invoke(main, ["extract", "-m", "resnet18", "-l", "avgpool", "-j", "0",
                                       str(image_folder), str(output)],
                                env={"FEATDUMP_EXTRACT_WEIGHTS": "none", "FEATDUMP_EXTRACT_SEED": "7"})
    assert result.exit_code == 0, result.output
    with h5py.File(output, "r") as h5file:
        assert h5file.attrs["weights"] == "none" and h5file.attrs["seed"] == 7


def test_unreadable_checkpoint_and_missing_info_file(image_folder, tmp_path):
    checkpoint = tmp_path / "bad.pth"
    checkpoint.write_text("garbage")
    result = invoke("extract", "-m", "resnet18", "-w", checkpoint, "-l", "fc", image_folder, tmp_path / "o.h5")
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: Could not read checkpoint '{checkpoint}': ")
    assert len(result.output.strip().splitlines()) == 1
    result = invoke("info", tmp_path / "none.h5")
    assert result.exit_code == 2
    assert result.output.strip() == (f"Error: No file '{tmp_path / 'none.h5'}' (nor '{tmp_path / 'none.h5.partial'}', "
                                     "nor shards of it).")


@pytest.mark.parametrize("arguments, message", [
    (["extract", "-m", "resnet18", "-l", "avgpool", "{images}", "{tmp}"],
     "Invalid value for 'OUTPUT': File '{tmp}' is a directory. See `featdump extract --help`."),
    (["extract", "-m", "resnet18", "-l", "avgpool", "-b", "0", "{images}", "{tmp}/o.h5"],
     "'batch_size' must be at least 1, not 0. On the command line: --batch-size."),
    (["extract", "-m", "resnet18", "-l", "avgpool", "{tmp}/nowhere", "{tmp}/o.h5"],
     "IMAGES '{tmp}/nowhere' does not exist (the readers: " + reader_names() + "; `featdump extract --help` says "
     "what each reads)."),
    (["extract", "-c", "{tmp}/none.toml", "{images}", "{tmp}/o.h5"],
     "Invalid value for '-c' / '--config': File '{tmp}/none.toml' does not exist. See `featdump extract --help`."),
    (["extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "{images}", "{tmp}/missing/o.h5"],
     "Output folder '{tmp}/missing' does not exist; create it first."),
    (["extract", "--bogus"], "No such option '--bogus'. See `featdump extract --help`."),
    (["nosuch"], "No such command 'nosuch'. See `featdump --help`."),
])
def test_usage_errors_are_one_line_with_exit_code_2(image_folder, tmp_path, arguments, message):
    result = run_featdump(*[argument.format(images=image_folder, tmp=tmp_path) for argument in arguments])
    assert result.returncode == 2
    assert result.stderr == f"Error: {message.format(tmp=tmp_path)}\n"


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_run_that_reads_no_image_exits_1_in_one_line_and_leaves_nothing_to_look_finished(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("a.jpg", "b.png", "c.jpg"):
        (folder / name).write_bytes(b"not an image")
    output = tmp_path / "out.h5"
    for _ in range(2):  # the same command tries again: nothing was left behind to say "nothing to do"
        result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", folder, output)
        assert result.returncode == 1, result.stderr
        errors = [line for line in result.stderr.splitlines() if "Error" in line or "Wrote" in line]
        assert len(errors) == 1 and errors[0].startswith(f"Error: No image could be read: 3 tried from {folder}, "
                                                         "all skipped (a.jpg: "), errors
        assert f"Nothing was written to {output}: fix or replace them and run the same command again." in errors[0]
        assert not output.exists() and not (tmp_path / "out.h5.partial").exists()
    listing = tmp_path / "list.txt"
    listing.write_text("gone/1.jpg\ngone/2.jpg\n")
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", listing, tmp_path / "l.h5")
    assert result.returncode == 1 and "No image could be read: 2 tried" in result.stderr
    assert "gone/1.jpg: file not found" in result.stderr and not (tmp_path / "l.h5").exists()
    write_images(folder, {"": 1})  # one image fixed: the same command now writes it
    fixed = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", folder, output)
    assert fixed.returncode == 0 and "Wrote 1 images (3 skipped)" in fixed.stderr, fixed.stderr


def test_extract_help_names_every_model_source_and_what_compile_builds():
    result = run_featdump("extract", "--help")
    text = " ".join(result.stdout.split())
    assert result.returncode == 0
    assert "hf:ORG/NAME" in text and "open_clip:ARCH" in text and "timm:NAME" in text
    assert "ahead of time into a package (torch.export + AOTInductor)" in text


@pytest.mark.parametrize("option, said", [(["--shards", "2"], "--shards N splits a --ray job"),
                                          (["--no-merge"], "--no-merge leaves a --ray job's shards unmerged")])
def test_the_options_of_a_ray_job_are_refused_without_ray_in_one_line(tmp_path, option, said):
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", *option, tmp_path, "out.h5")
    assert result.returncode == 2 and said in result.stderr and result.stderr.count("\n") == 1, result.stderr
