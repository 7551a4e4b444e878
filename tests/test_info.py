"""featdump info on what a job leaves behind: a finished file, a partial one, shards not merged yet, and files
that are not featdump outputs."""

from __future__ import annotations

import json

import h5py
import pytest
from click.testing import CliRunner

import featdump
from featdump.errors import NotAnOutput
from featdump.faces.cli import main
from featdump.faces.info import read_info
from featdump.job.runner import extract

from .helpers import CrashAfterFirstBatch, images_fixture, settings_for, write_images


def info(*args) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["info", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


images = images_fixture({"cats": 3, "dogs": 2}, broken={"dogs/broken.jpg": b"\xff\xd8 not a jpeg"}, scope="function")


def test_a_finished_file(images, tmp_path):
    output = tmp_path / "out.h5"
    extract(settings_for(images, output, layers=("layer4", "avgpool"), reduce="avgpool"))
    code, text, _ = info(output)
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == f"file:       {output}"
    assert "model:      resnet18 (weights none, seed 0)" in lines and "complete:   yes" in lines
    assert "rows:       5" in lines and "skipped:    1" in lines
    assert "  avgpool: (512,) float32, avgpool" in lines and "  layer4: (512,) float32, avgpool" in lines
    assert "classes:    2 (cats, dogs)" in lines
    assert any(line.startswith("  dogs/broken.jpg: ") for line in lines)
    as_json = json.loads(info("--json", output)[1])
    assert as_json == read_info(output)
    assert (as_json["state"], as_json["rows"], as_json["images_done"], as_json["image_count"]) == ("complete", 5, 6, 6)


def test_a_partial_file_says_how_far_and_how_to_resume(images, tmp_path):
    output = tmp_path / "out.h5"
    with pytest.raises(RuntimeError, match="simulated crash"):
        extract(settings_for(images, output, batch_size=2), CrashAfterFirstBatch())
    code, text, _ = info(output)  # OUT itself does not exist: its .partial is described
    assert code == 0
    assert f"file:       {output}.partial" in text and "complete:   no" in text
    assert "progress:   2 of 6 images done; run the same extract command again to resume" in text
    assert read_info(output)["state"] == "partial"


def test_shards_not_merged_yet(images, tmp_path):
    output = tmp_path / "out.h5"
    extract(settings_for(images, output, shard="0/2"))
    code, text, _ = info(output)
    assert code == 0
    assert text.splitlines()[0] == f"{output}: not merged yet; 1 of 2 shards finished"
    assert f"  shard 0: complete, 3 of 3 images ({tmp_path / 'out.shard-0-of-2.h5'})" in text
    assert f"  shard 1: missing, 0 of ? images ({tmp_path / 'out.shard-1-of-2.h5'})" in text


def test_files_that_are_not_outputs_get_one_line(tmp_path):
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as h5file:
        h5file["x"] = [1, 2, 3]
    text_file = tmp_path / "notes.h5"
    text_file.write_text("not HDF5")
    cases = [(tmp_path / "missing.h5", "No file "), (foreign, "is an HDF5 file, but not one featdump wrote."),
             (text_file, "is not a readable HDF5 file")]
    for path, message in cases:
        code, _, errors = info(path)
        assert code == 2 and message in errors and len(errors.splitlines()) == 1, errors
        with pytest.raises(NotAnOutput):
            read_info(path)
        with pytest.raises(NotAnOutput):
            featdump.load(path, "avgpool")


def test_layers_in_the_model_s_order_and_every_result_described(images, tmp_path):
    """-l avgpool,layer1: the file, info (text and JSON), a probe and an RDM list layer1 first, as the model runs
    them (the HDF5 group lists them alphabetically); rdm and cka results are described, not refused."""
    output = tmp_path / "out.h5"
    extract(settings_for(images, output, layers=("avgpool", "layer1"), reduce="layer1=avgpool"))
    code, text, _ = info(output)
    assert code == 0 and text.index("  layer1: ") < text.index("  avgpool: ")
    assert list(read_info(output)["layers"]) == ["layer1", "avgpool"]
    probes = featdump.probe(output, "avgpool,layer1", folds=2, device="cpu", to=tmp_path / "p.h5")
    assert list(probes) == ["layer1", "avgpool"]
    assert list(read_info(tmp_path / "p.h5")["layers"]) == ["layer1", "avgpool"]
    featdump.rdm(output, "avgpool,layer1", to=tmp_path / "r.h5", device="cpu")
    featdump.cka(output, layers="avgpool,layer1", to=tmp_path / "c.h5", device="cpu")
    code, text, _ = info(tmp_path / "r.h5")
    assert code == 0 and "result:     featdump rdm: correlation RDMs of 2 layers" in text
    assert text.index("  layer1") < text.index("  avgpool")
    code, text, _ = info(tmp_path / "c.h5")
    assert code == 0 and "result:     featdump cka: linear CKA, 2 x 2 layers" in text and "layer1 1.000" in text
    assert read_info(tmp_path / "c.h5")["result"] == "cka"


def test_info_names_how_many_classes_it_leaves_out(tmp_path):
    write_images(tmp_path / "images", {f"class_{index:02d}": 1 for index in range(11)})
    output = tmp_path / "out.h5"
    extract(settings_for(tmp_path / "images", output))
    code, text, _ = info(output)
    assert code == 0 and "class_07, and 3 more (info --json lists them all)" in text, text
    assert len(read_info(output)["classes"]) == 11
