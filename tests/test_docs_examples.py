"""Every example of the README and docs/ runs: each shell line and Python block, in a sandbox holding the images,
tars and files the examples name, with --weights none added where an example would download weights. The few
that cannot run here are listed with why, and their command line is still checked (test_readme)."""

from __future__ import annotations

import io
import re
import shlex
import tarfile

import h5py
import pytest

from tests.makers.videos import write_video

from .helpers import REPO, run_featdump, write_images
from .test_readme import blocks, shell_commands

NOT_RUN = {  # the example's start: why it cannot run in a test
    "featdump extract --shard 3/8 ... IMAGES out.h5": "a template (... and IMAGES stand for the rest of a command)",
    "featdump extract -m resnet50 -l 'layer*.*' --reduce pca:256": "a fit of 256 components needs 257+ fit images "
                                                                   "of 16 resnet50 layers staged (GBs)",
}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A folder with what the examples name: images/, photos/, examples/images, shards/*.tar, tars.txt, film.mp4,
    movies/."""
    root = tmp_path_factory.mktemp("docs")
    for folder in ("images", "photos", "reference_images", "stimuli"):
        write_images(root / folder, {"cats": 2, "dogs": 1}, size=(40, 32))
    (root / "examples").mkdir()
    (root / "examples" / "images").symlink_to(REPO / "examples" / "images")
    (root / "shards").mkdir()
    for index in (0, 1, 42):
        with tarfile.open(root / "shards" / f"{index:05d}.tar", "w") as archive:
            for path in sorted((root / "images" / "cats").iterdir()):
                data = path.read_bytes()
                info = tarfile.TarInfo(f"{index}/{path.name}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    (root / "tars.txt").write_text("shards/00000.tar\nshards/00001.tar\n")
    _arrays_and_tables(root)
    write_video(root / "film.mp4", 50, size=(96, 128))  # 2 s: a clip of r3d_18's 16 frames at 15 fps
    write_video(root / "movies" / "one.mkv", 50, size=(96, 128), seed=1)
    for shard in ("0/2", "1/2"):  # what `featdump merge out.h5` joins, as the sharded job before it writes
        made = run_featdump("extract", "--shard", shard, "-m", "resnet18", "-w", "none", "-l", "avgpool", "images",
                            "out.h5", cwd=root)
        assert made.returncode == 0, made.stderr
    return root


def _arrays_and_tables(root) -> None:
    """inputs.md's files: an NSD-like brick (nsd_stimuli.hdf5:imgBrick) and a Hugging Face dataset of two shards."""
    import json

    import numpy as np

    pixels = np.random.default_rng(0).integers(0, 256, (3, 48, 64, 3), dtype=np.uint8)
    with h5py.File(root / "nsd_stimuli.hdf5", "w") as h5file:
        h5file["imgBrick"] = pixels
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    (root / "data").mkdir()
    images = sorted((root / "images" / "cats").iterdir())
    meta = {"info": {"features": {"label": {"names": ["cat", "dog"], "_type": "ClassLabel"}}}}
    for shard in range(2):
        table = pa.table({"image": [{"bytes": path.read_bytes(), "path": path.name} for path in images],
                          "label": [shard] * len(images)})
        pq.write_table(table.replace_schema_metadata({b"huggingface": json.dumps(meta).encode()}),
                       root / "data" / f"train-{shard:05d}-of-00002.parquet")


def runnable(line: str) -> list[str]:
    """The example's arguments as run here: brace patterns narrowed to the tars that exist, --weights none
    added to an extract that names no weights (no download), resnet50 run as resnet18 (the same layer names: an
    example's point is its options, and a resnet50 costs a second more each, over 20 examples)."""
    words = shlex.split(line.replace("{00000..00999}", "{00000..00001}"))[1:]
    words = ["resnet18" if word == "resnet50" else word for word in words]
    if "extract" in words and not {"-w", "--weights"} & set(words):
        words.insert(words.index("extract") + 1, "--weights=none")
    return words


def examples():
    for page, line in shell_commands():
        reason = next((why for start, why in NOT_RUN.items() if line.startswith(start)), None)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        if page != "README.md":  # the docs pages' examples take a minute: make test-all runs them
            marks.append(pytest.mark.slow)
        yield pytest.param(page, line, marks=marks, id=line[:60])


@pytest.fixture(scope="module")
def analysed(sandbox):
    """The outputs analysis.md's, readouts.md's and training.md's examples read (made only when their examples run:
    slow ones), and the labels and targets of readouts.md."""
    compared = write_images(sandbox / "compared", {"cats": 3, "dogs": 3}, size=(40, 32), seed=3)  # unbiased CKA: 4+
    (sandbox / "labels.csv").write_text("".join(f"{path},{'small' if index % 2 else 'large'}\n"
                                                for index, path in enumerate(compared)))
    (sandbox / "it_neurons.csv").write_text("path,n1,n2\n" + "".join(f"{path},{index * 0.5},{(index % 3) - 1.5}\n"
                                                                     for index, path in enumerate(compared)))
    (sandbox / "betas.csv").write_text("path,trial,v1,v2\n" + "".join(  # two trials of each image
        f"{path},{trial},{index * 0.5 + trial * 0.1},{(index % 3) - trial * 0.2}\n"
        for trial in range(2) for index, path in enumerate(compared)))
    (sandbox / "rois.csv").write_text("target,region\nv1,V1\nv2,V4\n")
    for name, model, layers in (("feats.h5", "resnet18", "layer3,layer4,avgpool"),
                                ("resnet18.h5", "resnet18", "layer*"), ("resnet50.h5", "resnet50", "layer*"),
                                ("vit.h5", "vit_b_16", "encoder.layers.encoder_layer_8")):  # training.md's
        if not (sandbox / name).exists():
            made = run_featdump("extract", "-m", model, "-w", "none", "-l", layers, "compared", name, cwd=sandbox)
            assert made.returncode == 0, made.stderr
    return sandbox


@pytest.fixture(scope="module")
def stored(sandbox, seaweed):
    """stores.md's bucket on the SeaweedFS server: its images as s3://my-lab/stimuli/, its tars as
    s3://my-lab/shards/, and urls.txt naming some of them beside a local path."""
    seaweed.upload(sandbox / "images", "s3://my-lab/stimuli")
    seaweed.upload(sandbox / "shards", "s3://my-lab/shards")
    (sandbox / "urls.txt").write_text("s3://my-lab/stimuli/cats/img_000.jpg\nimages/dogs/img_000.jpg\n")
    return seaweed


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
@pytest.mark.parametrize("page, line", list(examples()))
def test_every_shell_example_runs(sandbox, page, line, request, monkeypatch):
    if page in ("analysis.md", "readouts.md"):
        request.getfixturevalue("analysed")
    if page == "stores.md":  # a real S3 server, the environment pointed at it as a user's shell would be
        for key, value in request.getfixturevalue("stored").env.items():
            monkeypatch.setenv(key, value)
    words = runnable(line)
    if words[-1].endswith(".h5") and "extract" in words and "--update" not in words:
        (sandbox / words[-1]).unlink(missing_ok=True)  # each example writes its own output anew
    result = run_featdump(*words, cwd=sandbox)
    assert result.returncode == 0, f"{page}: {line}\n{result.stdout}{result.stderr}"
    if "--update" in words and "layer2,layer3,layer4" in line:  # the growth example: it added two layers
        assert "Added layer2, layer3 to the 3 rows" in result.stderr, result.stderr


@pytest.mark.slow
def test_the_python_examples_run(sandbox, analysed, monkeypatch):
    """The README's xarray block, api.md's extract and load, output.md's reading with plain h5py and xarray, on files
    made like the examples'."""
    monkeypatch.chdir(sandbox)
    (sandbox / "out.h5").unlink(missing_ok=True)
    made = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer3.0.downsample.1", "images",
                        "out.h5", cwd=sandbox)
    assert made.returncode == 0, made.stderr
    (sandbox / "tour.h5").unlink(missing_ok=True)  # the README's, as its tour makes it
    made = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer1,avgpool", "examples/images",
                        "tour.h5", cwd=sandbox)
    assert made.returncode == 0, made.stderr
    made = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--fps", "2", "--overwrite",
                        "movies/", "frames.h5", cwd=sandbox)  # usage.md's one file per film reads it
    assert made.returncode == 0, made.stderr
    namespaces: dict[str, dict] = {}  # a page's blocks follow on from each other, as a reader runs them
    for page, code in blocks("python"):
        if page == "api.md":  # its extract writes feats.h5 anew (analysis.md, before it, read the sandbox's)
            (sandbox / "feats.h5").unlink(missing_ok=True)
        code = code.replace('model="resnet50"', 'model="resnet18", weights="none"')
        if "featdump.capture(model" in code:  # inside your own loop: `model` and `loader` are the reader's
            code = code[:code.index("with featdump.capture(model")]
        exec(compile(code, page, "exec"), namespaces.setdefault(page, {}))  # noqa: S102 - the documentation's own code
    with h5py.File(sandbox / "feats.h5") as h5file:
        assert set(h5file.attrs["layers"]) == {"layer4", "avgpool"}
    import xarray as xr

    with xr.open_dataarray(sandbox / "one.mkv.nc") as film:  # usage.md's file of one film
        assert film.dims[0] == "clip_start" and film.sizes["clip_start"] == 4 and film.sizes["channel"] == 512


def test_every_example_is_run_or_says_why_not():
    lines = [line for _, line in shell_commands()]
    for start in NOT_RUN:
        assert any(line.startswith(start) for line in lines), f"NOT_RUN names an example that is gone: {start}"
    assert not [line for line in lines if re.search(r"\b(IMAGES|OUT)\b", line)
                and not any(line.startswith(start) for start in NOT_RUN)]
