"""Config files, list files, the Python API (extract, capture, load), show and info --json."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from torchvision.models import resnet18

import featdump
from featdump.errors import AmbiguousLayer, ResumeMismatch, UnknownLayer

from .helpers import REPO, CrashAfterFirstBatch, featdump_env, run_featdump, write_images


def settings_of(path) -> dict:
    with h5py.File(path, "r") as h5file:
        return json.loads(h5file.attrs["settings"])


def test_config_file_then_environment_then_command_line(image_folder, tmp_path):
    config = tmp_path / "job.toml"
    config.write_text('model = "resnet18"\nlayers = ["layer4", "avgpool"]\nweights = "none"\n'
                      'batch_size = 3\nseed = 1\nreduce = "avgpool"\n')
    output = tmp_path / "out.h5"
    result = run_featdump("extract", "--config", config, "--batch-size", "5", image_folder, output,
                          env=featdump_env(FEATDUMP_EXTRACT_SEED="2", FEATDUMP_EXTRACT_BATCH_SIZE="4"))
    assert result.returncode == 0, result.stderr
    effective = settings_of(output)
    assert effective["layers"] == ["layer4", "avgpool"] and effective["reduce"] == ["avgpool"]  # from the file
    assert effective["seed"] == 2  # the environment beats the file
    assert effective["batch_size"] == 5  # the command line beats both
    with h5py.File(output, "r") as h5file:
        assert h5file["features/layer4"].shape == (7, 512)


@pytest.mark.parametrize("content, message", [
    ('model = "resnet18"\nbatch_sise = 3\n', "'batch_sise' is not an extract option. Allowed keys: "),
    ('batch_size = "big"\n', "'batch_size' must be an integer, not 'big'."),
    ('reduce = "mean"\n', "'reduce' must be REDUCTION or PATTERN=REDUCTION, REDUCTION one of none, flatten, avgpool, "
                          "maxpool, spacepool, cls, patchmean, channels:A-B, srp:K, countsketch:K, pca:K, not "
                          "'mean'."),
    ('layers = [1, 2]\n', "'layers' must be a list of layer names"),
    ('model = resnet18\n', "not valid TOML"),
])
def test_bad_config_names_the_file_and_the_key(image_folder, tmp_path, content, message):
    config = tmp_path / "bad.toml"
    config.write_text(content)
    result = run_featdump("extract", "--config", config, "-m", "resnet18", "-l", "fc", image_folder, tmp_path / "o.h5")
    assert result.returncode == 2
    assert result.stderr.startswith(f"Error: {config}: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_shipped_configs_are_valid():
    from featdump.job.config import read_config

    shipped = sorted((REPO / "configs").glob("*.toml"))
    assert len(shipped) >= 3
    for path in shipped:
        assert read_config(path)["layers"]


def test_list_files_keep_their_order_labels_and_record_missing_files(tmp_path):
    names = write_images(tmp_path / "pool", {"x": 4})
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "order.txt").write_text(f"# chosen order\n../pool/{names[2]}\n{tmp_path / 'pool' / names[0]}\n\n"
                                     f"../pool/gone.jpg\n../pool/{names[1]}\n")
    output = tmp_path / "txt.h5"
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", lists / "order.txt", output)
    assert result.returncode == 0, result.stderr
    with h5py.File(output, "r") as h5file:
        assert list(h5file["paths"].asstr()[:]) == [f"../pool/{names[2]}", str(tmp_path / "pool" / names[0]),
                                                     f"../pool/{names[1]}"]
        assert list(h5file["skipped/paths"].asstr()[:]) == ["../pool/gone.jpg"]
        assert list(h5file["labels"][:]) == [-1, -1, -1]
    (lists / "quoted.csv").write_text(f'label,path\n3,"../pool/{names[3]}"\n1,../pool/{names[0]}\n')
    comma = tmp_path / "pool" / "a, b.jpg"
    os.link(tmp_path / "pool" / names[1], comma)
    with open(lists / "quoted.csv", "a") as handle:
        handle.write('7,"../pool/a, b.jpg"\n')
    csv_out = tmp_path / "csv.h5"
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", lists / "quoted.csv", csv_out)
    assert result.returncode == 0, result.stderr
    with h5py.File(csv_out, "r") as h5file:
        assert list(h5file["labels"][:]) == [3, 1, 7]
        assert list(h5file["paths"].asstr()[:])[2] == "../pool/a, b.jpg"
    with h5py.File(output, "r") as a, h5py.File(csv_out, "r") as b:  # the same image gives the same row
        np.testing.assert_array_equal(a["features/avgpool"][1], b["features/avgpool"][1])


def test_the_list_content_is_part_of_the_fingerprint(tmp_path):
    names = write_images(tmp_path, {"x": 3})
    listing = tmp_path / "list.csv"
    listing.write_text("path,label\n" + "".join(f"{name},0\n" for name in names))
    output = tmp_path / "out.h5"
    settings = dict(model="resnet18", layers="avgpool", weights="none", num_workers=0, batch_size=1)

    from featdump.job.runner import extract as run
    from featdump.job.settings import Settings

    with pytest.raises(RuntimeError):
        run(Settings(images=listing, output=output, **{**settings, "layers": ("avgpool",)}), CrashAfterFirstBatch())
    listing.write_text("path,label\n" + "".join(f"{name},1\n" for name in names))  # same files, new labels
    with pytest.raises(ResumeMismatch, match="the image set changed"):
        featdump.extract(listing, output, **settings)


def test_api_and_cli_write_the_same_file(image_folder, tmp_path):
    api_out = featdump.extract(image_folder, tmp_path / "api.h5", model="resnet18", layers=["layer2", "avgpool"],
                               weights="none", batch_size=4)
    assert api_out == tmp_path / "api.h5"
    cli = run_featdump("extract", "-m", "resnet18", "-l", "layer2,avgpool", "-w", "none", "-b", "4", image_folder,
                       tmp_path / "cli.h5")
    assert cli.returncode == 0, cli.stderr
    with h5py.File(api_out, "r") as a, h5py.File(tmp_path / "cli.h5", "r") as b:
        assert list(a["paths"].asstr()[:]) == list(b["paths"].asstr()[:])
        for name in ("layer2", "avgpool"):
            np.testing.assert_array_equal(a["features"][name][:], b["features"][name][:])
    with pytest.raises(TypeError, match="unknown option"):
        featdump.extract(image_folder, tmp_path / "x.h5", model="resnet18", layers="fc", batch=3)
    loaded = featdump.load(api_out, "avgpool")
    assert loaded.features.shape == (7, 512, 1, 1) and loaded.paths[0] == "cats/img_000.jpg"
    assert list(loaded.labels) == [0, 0, 0, 0, 1, 1, 1] and loaded.classes == ["cats", "dogs"]
    lazy = featdump.load(api_out, "layer2", lazy=True)
    assert isinstance(lazy.features, h5py.Dataset) and lazy.features[2:4].shape == (2, 128, 28, 28)
    lazy.file.close()


def test_capture_in_your_own_loop_copies_each_call_at_hook_time():
    torch.manual_seed(0)
    model = resnet18().eval()
    x = torch.randn(2, 3, 64, 64)
    with featdump.capture(model, ["layer1.0.bn1", "layer1.0.relu:1", "layer1.0.relu:2", "avgpool"]) as features:
        for batch in (x[:1], x):
            logits = model(batch)  # the user's own forward, whole
            assert logits.shape == (len(batch), 1000) and features["avgpool"].shape == (len(batch), 512, 1, 1)
    block = model.layer1[0]
    with torch.inference_mode():
        stem = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        bn1 = block.bn1(block.conv1(stem))
        out = block.bn2(block.conv2(torch.relu(bn1))) + stem
    np.testing.assert_allclose(features["layer1.0.bn1"], bn1, rtol=1e-5, atol=1e-6)  # before the in-place ReLU
    np.testing.assert_allclose(features["layer1.0.relu:1"], torch.relu(bn1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(features["layer1.0.relu:2"], torch.relu(out), rtol=1e-5, atol=1e-6)
    with pytest.raises(AmbiguousLayer, match="select one call as layer1.0.relu:1"):
        with featdump.capture(model, "layer1.0.relu"):
            model(x)
    assert not model.layer1[0].relu._forward_hooks  # hooks removed after the block


def png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


def test_show_draws_maps_and_vectors_and_info_json_parses(image_folder, tmp_path):
    output = featdump.extract(image_folder, tmp_path / "out.h5", model="resnet18", layers="layer2,avgpool",
                              weights="none")
    maps = run_featdump("show", output, "--layer", "layer2", "--index", "3", "-o", tmp_path / "fmap.png")
    assert maps.returncode == 0, maps.stderr
    assert png_size(tmp_path / "fmap.png") == (1200, 400)
    vector = run_featdump("show", output, "--layer", "avgpool")
    assert vector.returncode == 0, vector.stderr
    assert png_size(tmp_path / "out-avgpool-0.png") == (1200, 400)
    info = run_featdump("info", "--json", output)
    parsed = json.loads(info.stdout)
    assert parsed["rows"] == 7 and parsed["complete"] and parsed["layers"]["layer2"]["shape"] == [128, 28, 28]


@pytest.mark.slow  # a fresh interpreter: 8 s of the quick suite on Zen 3, kept to CI's full run
def test_show_without_matplotlib_says_what_to_install(image_folder, tmp_path):
    output = featdump.extract(image_folder, tmp_path / "out.h5", model="resnet18", layers="avgpool", weights="none")
    no_matplotlib = ("import sys\n"
                     "class Block:\n"
                     "    def find_spec(self, name, path=None, target=None):\n"
                     "        if name.split('.')[0] == 'matplotlib': raise ImportError('No module named matplotlib')\n"
                     "sys.meta_path.insert(0, Block())\n"
                     "from featdump.faces.cli import main\n"
                     "main()\n")
    result = subprocess.run([sys.executable, "-c", no_matplotlib, "show", str(output)], env=featdump_env(),
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == "Error: featdump show draws with matplotlib: pip install 'featdump[plot]'."


def test_zstd_output_reads_with_plain_h5py_and_hdf5plugin(image_folder, tmp_path):
    pytest.importorskip("hdf5plugin", reason="hdf5plugin is not installed (pip install 'featdump[compression]')")
    plain = featdump.extract(image_folder, tmp_path / "plain.h5", model="resnet18", layers="layer3", weights="none")
    packed = featdump.extract(image_folder, tmp_path / "zstd.h5", model="resnet18", layers="layer3", weights="none",
                              compression="zstd")
    reader = "import hdf5plugin, h5py, sys; print(float(h5py.File(sys.argv[1])['features/layer3'][:].sum()))"
    sums = [subprocess.run([sys.executable, "-c", reader, str(path)], capture_output=True, text=True).stdout
            for path in (plain, packed)]
    assert sums[0] and sums[0] == sums[1]
    assert packed.stat().st_size < plain.stat().st_size


def test_capture_of_a_module_returning_a_dict_is_a_clear_error():
    class DictOut(torch.nn.Module):
        def forward(self, x):
            return {"mean": x.mean(dim=1), "max": x.amax(dim=1)}

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dictmod = DictOut()

        def forward(self, x):
            return self.dictmod(x)["mean"]

    net = Net()
    with featdump.capture(net, ["dictmod"]), pytest.raises(UnknownLayer) as raised:
        net(torch.zeros(2, 3, 4))
    assert str(raised.value) == "Layer 'dictmod' outputs a dict with several tensors: select one as dictmod@mean, " \
                                "dictmod@max."
    with featdump.capture(net, ["dictmod@max"]) as features:
        net(torch.zeros(2, 3, 4))
    assert features["dictmod@max"].shape == (2, 4)


def test_show_draws_the_image_as_the_model_saw_it_titled_with_its_path(image_folder, tmp_path):
    from featdump.faces.show import _read

    output = featdump.extract(image_folder, tmp_path / "out.h5", model="resnet18", layers="layer2,avgpool",
                              weights="none", num_workers=0)
    values, layer, image, title = _read(output, None, 3)
    assert layer == "layer2"  # the first requested, not the alphabetically first
    assert image.shape == (224, 224, 3)  # resized and centre-cropped like the model's input
    assert title == "cats/img_003.jpg" and values.shape == (128, 28, 28)


def test_shipped_scripts_choose_workers_and_need_a_gpu_count(tmp_path):
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    (bin_folder / "torchrun").write_text('#!/bin/sh\necho "torchrun $*"\n')  # shows what the script would run
    (bin_folder / "nproc").write_text("#!/bin/sh\necho 2\n")
    for tool in ("torchrun", "nproc"):
        (bin_folder / tool).chmod(0o755)
    env = {"PATH": f"{bin_folder}:/usr/bin:/bin", "IMAGES": "imgs", "OUT": "out.h5"}
    no_gpu = subprocess.run(["bash", REPO / "configs" / "torchrun.sh"], env=env, capture_output=True, text=True)
    assert no_gpu.returncode == 2 and "No GPU found" in no_gpu.stderr
    four = subprocess.run(["bash", REPO / "configs" / "torchrun.sh"], env={**env, "GPUS": "4"}, capture_output=True,
                          text=True)
    assert four.returncode == 0 and "--nproc-per-node 4" in four.stdout and "--num-workers 1 " in four.stdout
    slurm = (REPO / "configs" / "slurm_extract.sh").read_text()
    assert '--num-workers "$(( ${SLURM_CPUS_PER_TASK:-8} > 1 ? ${SLURM_CPUS_PER_TASK:-8} - 1 : 1 ))"' in slurm
    assert "cron mails" not in (REPO / "configs" / "crontab.example").read_text().split("drop the")[0]
