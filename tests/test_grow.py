"""Growing an output by layers (--update naming new layers): the new layers equal a fresh run's, the stored ones
are kept bit for bit, anything else is refused with the file untouched, a kill at any moment resumes, readers
read the old layers meanwhile, shards grow and merge again, and the same command again is done (exit 0)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import textwrap
import time

import h5py
import numpy as np
import pytest

import featdump
from featdump.output.layout import raw_paths

from .helpers import (
    SMALL_RESNET,
    committed_rows,
    featdump_env,
    read_output,
    run_featdump,
    start_featdump,
    user_project,
    write_images,
)
from .makers import small_resnet

BASE = ["extract", *SMALL_RESNET]


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """64 images; the stored output (-l layer1) and a fresh run of -l layer1,layer3 to compare with."""
    root = tmp_path_factory.mktemp("grow")
    write_images(root / "images", {"a": 32, "b": 32}, size=(40, 32))
    for output, layers in (("stored.h5", "layer1"), ("fresh.h5", "layer1,layer3")):
        result = run_featdump(*BASE, "-l", layers, root / "images", root / output)
        assert result.returncode == 0, result.stderr
    return root


def stored_copy(study, tmp_path):
    shutil.copy(study / "stored.h5", tmp_path / "out.h5")
    return tmp_path / "out.h5"


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_new_layers_equal_a_fresh_run_and_the_stored_ones_are_kept_bit_for_bit(study, tmp_path):
    output = stored_copy(study, tmp_path)
    result = run_featdump(*BASE, "-l", "layer1,layer3", "--update", study / "images", output)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"Added layer3 to the 64 rows of {output}")
    grown, fresh, stored = read_output(output), read_output(study / "fresh.h5"), read_output(study / "stored.h5")
    np.testing.assert_array_equal(grown["layer3"], fresh["layer3"])
    np.testing.assert_array_equal(grown["layer1"], stored["layer1"])
    assert grown["paths"] == stored["paths"] and grown["complete"]
    with h5py.File(output) as h5file:
        assert "--update" in h5file["features/layer3"].attrs["added_by"]
        assert list(h5file.attrs["layers"].astype(str)) == ["layer1", "layer3"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.h5"]  # no staging file left
    info = run_featdump("info", output)
    assert "layer3: (24, 4, 4) float32 (added " in info.stdout
    again = run_featdump(*BASE, "-l", "layer1,layer3", "--update", study / "images", output)
    assert again.returncode == 0 and "Nothing new" in again.stderr


@pytest.mark.parametrize("arguments, message", [
    (["--seed", "3", "-l", "layer1,layer3"], "seed: 0 when started, 3 now"),
    (["-l", "layer1,layer3", "--reduce", "layer1=avgpool"],
     "holds layer layer1 reduced with none; this command asks for avgpool"),
])
def test_another_model_or_reduction_is_refused_and_the_file_untouched(study, tmp_path, arguments, message):
    output = stored_copy(study, tmp_path)
    before = digest(output)
    result = run_featdump(*BASE, *arguments, "--update", study / "images", output)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert digest(output) == before and sorted(path.name for path in tmp_path.iterdir()) == ["out.h5"]


def test_the_same_command_again_is_done_and_a_different_one_is_refused(study, tmp_path):
    output = stored_copy(study, tmp_path)
    before = digest(output)
    same = run_featdump(*BASE, "-l", "layer1", study / "images", output)
    assert same.returncode == 0 and "Nothing new" in same.stderr and digest(output) == before
    other = run_featdump(*BASE, "-l", "layer2", study / "images", output)
    assert other.returncode == 2 and digest(output) == before
    assert 'made by another command (layers: ["layer1"] when started, ["layer2"] now' in other.stderr


@pytest.mark.slow  # a real process killed at its end, and a rerun
def test_killed_after_the_rename_then_run_again_is_done(study, tmp_path):
    output = tmp_path / "out.h5"
    process = start_featdump(*BASE, "-l", "layer1", study / "images", output)
    while not output.exists() and process.poll() is None:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)  # between the rename and exit (or just after)
    process.wait()
    assert output.exists()
    before = digest(output)
    again = run_featdump(*BASE, "-l", "layer1", study / "images", output)
    assert again.returncode == 0, again.stderr
    assert digest(output) == before


@pytest.mark.slow  # several SIGKILLs of real processes
def test_a_kill_at_several_moments_of_a_growth_resumes_and_readers_read_the_old_layers(study, tmp_path):
    """New layers and new images at once, default workers: killed while the new layers are staged, then while the
    new images are; a reader holds the file open throughout and reads the stored layer1."""
    images = tmp_path / "images"
    shutil.copytree(study / "images", images)
    write_images(images / "c", {"": 8}, seed=9, size=(40, 32))
    output = stored_copy(study, tmp_path)
    expected_layer1 = read_output(study / "stored.h5")["layer1"]
    command = [*BASE, "-l", "layer1,layer3", "-b", "8", "--update", images, output]
    reader = h5py.File(output, "r")
    for staged in (tmp_path / "out.h5.grow.partial", tmp_path / "out.h5.update.partial"):
        growing = staged.name.endswith(".grow.partial")  # held after its first batch: 8 of the 64 rows staged
        process = start_featdump(*command, env=featdump_env(**({small_resnet.HOLD_AFTER: "1"} if growing else {})))
        while committed_rows(staged) <= 0 and not staged.with_suffix("").exists() and process.poll() is None:
            time.sleep(0.01)  # (the new images are one batch: staged, it waits for the reader to join them)
        if growing:  # info on a growing file (held still): what is added, how far
            process.send_signal(signal.SIGSTOP)
            info = run_featdump("info", output, process=True)
            assert "task:       adding layers layer3 to the 64 rows stored" in info.stdout, info.stdout
        process.send_signal(signal.SIGKILL)
        process.wait()
        described = run_featdump("info", output)  # a killed growth shows, as a killed extraction does
        assert described.returncode == 0, described.stderr
        killed = described.stdout
        assert "update:     not finished (killed, or running): new layers (layer3): " in killed, killed
        if growing:
            assert "new layers (layer3): 8 of 64 stored rows done in out.h5.grow" in killed, killed
        else:
            assert "new layers (layer3): staged, not yet joined in out.h5.grow; new images: " in killed, killed
            assert re.search(r"new images: (\d+ of 8 new images done|staged, not yet joined) in "
                             r"out\.h5\.update(\.partial)?\b", killed), killed  # staged already: out.h5.update
        np.testing.assert_array_equal(reader["features/layer1"][:], expected_layer1)
        assert set(reader["features"]) == {"layer1", "path", "label"}  # the layer and its coordinates
    reader.close()
    result = run_featdump(*command)
    assert result.returncode == 0, result.stderr
    fresh = tmp_path / "fresh.h5"
    assert run_featdump(*BASE, "-l", "layer1,layer3", "-b", "8", images, fresh).returncode == 0
    grown, expected = read_output(output), read_output(fresh)
    order = [expected["paths"].index(path) for path in grown["paths"]]
    for layer in ("layer1", "layer3"):
        np.testing.assert_array_equal(grown[layer], expected[layer][order])
    assert len(grown["paths"]) == 72 and grown["complete"]


@pytest.mark.slow  # four sharded runs, two merges
def test_a_two_shard_job_grows_and_merges_to_a_fresh_single_run(study, tmp_path):
    output = tmp_path / "out.h5"
    for layers, update in (("layer1", []), ("layer1,layer3", ["--update"])):
        for shard in ("0/2", "1/2"):
            result = run_featdump(*BASE, "-l", layers, *update, "--shard", shard, study / "images", output)
            assert result.returncode == 0, result.stderr
        merged = run_featdump("merge", output)
        assert merged.returncode == 0, merged.stderr
    grown, fresh = read_output(output), read_output(study / "fresh.h5")
    assert grown["paths"] == fresh["paths"]
    for layer in ("layer1", "layer3"):
        np.testing.assert_array_equal(grown[layer], fresh[layer])
    write_images(tmp_path / "more", {"": 2}, seed=4)
    shutil.copytree(study / "images", tmp_path / "more", dirs_exist_ok=True)
    refused = run_featdump(*BASE, "-l", "layer1,layer3", "--update", "--shard", "0/2", tmp_path / "more", output)
    assert refused.returncode == 2 and "new images would move every shard's boundaries" in refused.stderr


TINY_VIT = textwrap.dedent('''
    import torch
    from torchvision.models import VisionTransformer
    from torchvision import transforms as T


    def build():
        return VisionTransformer(image_size=32, patch_size=8, num_layers=4, num_heads=2, hidden_dim=32, mlp_dim=64)


    def small():
        return T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor()])
''')


def test_a_vit_grown_block_by_block_equals_all_blocks_at_once(tmp_path):
    with user_project(tmp_path, "tinyvit", TINY_VIT, {"": 6}) as project:
        vit = ["extract", "-m", "tinyvit:build", "--transform", "tinyvit:small", "-w", "none"]
        result = run_featdump(*vit, "-l", "encoder.layers.encoder_layer_1", "--update", "images", "grown.h5",
                              cwd=project)
        assert result.returncode == 0, result.stderr
        featdump.extract(project / "images", project / "grown.h5", model="tinyvit:build", weights="none",
                         transform="tinyvit:small", layers="encoder.layers.*", update=True)  # the API, likewise
        assert run_featdump(*vit, "-l", "encoder.layers.*", "images", "fresh.h5", cwd=project).returncode == 0
        grown, fresh = read_output(project / "grown.h5"), read_output(project / "fresh.h5")
    blocks = [f"encoder.layers.encoder_layer_{index}" for index in range(4)]
    for block in blocks:
        np.testing.assert_array_equal(grown[block], fresh[block])
    with h5py.File(project / "grown.h5") as h5file:
        assert list(h5file.attrs["layers"].astype(str)) == blocks  # the model's order, as a fresh run records


@pytest.mark.slow  # three extractions
def test_an_output_holding_names_that_are_not_utf8_grows(tmp_path):
    """Rows are matched by their exact bytes: a Latin-1 name (and the other odd names) does not block growth."""
    from .test_names import ODD_NAMES, write_picture

    root = os.fsencode(tmp_path / "images")
    os.makedirs(os.path.join(root, b"cl\xe0ss"))
    for index, name in enumerate(ODD_NAMES):
        write_picture(os.path.join(root, b"cl\xe0ss", name), index)
    images, output, fresh = os.fsdecode(root), tmp_path / "out.h5", tmp_path / "fresh.h5"
    assert run_featdump(*BASE, "-l", "avgpool", images, output).returncode == 0
    grown = run_featdump(*BASE, "-l", "avgpool,layer4", "--update", images, output)
    assert grown.returncode == 0, grown.stderr
    assert run_featdump(*BASE, "-l", "avgpool,layer4", images, fresh).returncode == 0
    with h5py.File(output) as got, h5py.File(fresh) as expected:
        assert raw_paths(got) == raw_paths(expected) and len(raw_paths(got)) == len(ODD_NAMES)
        for layer in ("avgpool", "layer4"):
            np.testing.assert_array_equal(got[f"features/{layer}"][:], expected[f"features/{layer}"][:])


@pytest.mark.slow  # two fits and growths, a fresh run with both fits
def test_a_pca_layer_is_added_then_a_second_one_and_both_equal_a_fresh_run(study, tmp_path):
    output = tmp_path / "out.h5"
    assert run_featdump(*BASE, "-l", "avgpool", study / "images", output).returncode == 0
    for layers, reduce in (("avgpool,layer4", "layer4=pca:4"), ("avgpool,layer4,layer3", "layer4=pca:4,layer3=pca:3")):
        grown = run_featdump(*BASE, "-l", layers, "--reduce", reduce, "--pca-fit", "16", "--update",
                             study / "images", output)
        assert grown.returncode == 0, grown.stderr
    fresh = tmp_path / "fresh.h5"
    made = run_featdump(*BASE, "-l", "avgpool,layer4,layer3", "--reduce", "layer4=pca:4,layer3=pca:3",
                        "--pca-fit", "16", study / "images", fresh)
    assert made.returncode == 0, made.stderr
    got, expected = read_output(output), read_output(fresh)
    for layer in ("avgpool", "layer3", "layer4"):
        np.testing.assert_allclose(got[layer], expected[layer], rtol=0, atol=1e-5)
    with h5py.File(output) as h5file:
        assert sorted(h5file["pca"]) == ["layer3", "layer4"]
        assert h5file["features/layer4"].shape == (64, 4) and h5file["features/layer3"].shape == (64, 3)
    again = run_featdump(*BASE, "-l", "avgpool,layer4,layer3", "--reduce", "layer4=pca:4,layer3=pca:3",
                         "--pca-fit", "16", study / "images", output)
    assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr


@pytest.mark.slow  # a growth and three runs
def test_a_grown_file_records_the_layers_as_a_fresh_run_does_and_the_command_again_is_done(study, tmp_path):
    output = stored_copy(study, tmp_path)  # layer1
    assert run_featdump(*BASE, "-l", "layer3,layer1", "--update", study / "images", output).returncode == 0
    before = digest(output)
    with h5py.File(output) as grown, h5py.File(study / "fresh.h5") as fresh:
        assert list(grown.attrs["layers"].astype(str)) == list(fresh.attrs["layers"].astype(str))
        assert json.loads(grown.attrs["fingerprint"])["layers"] == json.loads(fresh.attrs["fingerprint"])["layers"]
    for order in ("layer3,layer1", "layer1,layer3"):
        again = run_featdump(*BASE, "-l", order, study / "images", output)
        assert again.returncode == 0, again.stderr
    assert digest(output) == before


@pytest.mark.slow  # five sharded runs
def test_a_lost_shard_remade_by_the_growth_command_merges_and_info_says_so(study, tmp_path):
    output = tmp_path / "out.h5"
    for layers, update in (("layer1", []), ("layer3,layer1", ["--update"])):
        for shard in ("0/2", "1/2"):
            assert run_featdump(*BASE, "-l", layers, *update, "--shard", shard, study / "images",
                                output).returncode == 0
    lost = tmp_path / "out.shard-1-of-2.h5"
    assert lost.exists()
    lost.unlink()
    remade = run_featdump(*BASE, "-l", "layer3,layer1", "--update", "--shard", "1/2", study / "images", output)
    assert remade.returncode == 0, remade.stderr
    info = run_featdump("info", output)
    assert "run `featdump merge" in info.stdout, info.stdout
    merged = run_featdump("merge", output)
    assert merged.returncode == 0, merged.stderr
    got, fresh = read_output(output), read_output(study / "fresh.h5")
    for layer in ("layer1", "layer3"):
        np.testing.assert_array_equal(got[layer], fresh[layer])


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_info_names_why_shards_that_cannot_be_merged_cannot(study, tmp_path):
    output = tmp_path / "out.h5"
    for shard, layers in (("0/2", "layer1"), ("1/2", "layer3")):
        assert run_featdump(*BASE, "-l", layers, "--shard", shard, study / "images", output).returncode == 0
    info = run_featdump("info", output)
    assert "featdump merge" not in info.stdout.splitlines()[0], info.stdout
    assert "cannot be merged" in info.stdout and "made differently" in info.stdout, info.stdout
    assert run_featdump("merge", output).returncode == 2
