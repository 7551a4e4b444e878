"""--fast-decode on camera photos, and how many loader workers a job gets."""

from __future__ import annotations

import logging
import os

import h5py
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torchvision.models import get_model

from featdump.errors import ResumeMismatch
from featdump.inputs.preprocess import Preprocess
from featdump.inputs.workers import (
    available_memory,
    cgroup_cpus,
    choose_workers,
    decode_bytes_per_worker,
    job_cpus,
)
from featdump.job.runner import extract
from featdump.sources.models import default_preprocessing
from tests.makers.photos import camera_photo, write_camera_photos

from .helpers import (
    SMALL_RESNET,
    SMALL_RESNET_MODEL,
    CrashAfterFirstBatch,
    featdump_env,
    run_featdump,
    settings_for,
    user_project,
    write_images,
)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three 12 MP photos (one EXIF-rotated), a small JPEG and a large PNG (never decoded at a reduced scale)."""
    root = tmp_path_factory.mktemp("photos")
    write_camera_photos(root, 3, rotated_every=2)
    camera_photo(7, (400, 300)).save(root / "small.jpg", quality=90)
    camera_photo(8, (2400, 1800)).save(root / "large.png")
    return root


def features(h5path, layer="avgpool") -> dict:
    with h5py.File(h5path, "r") as h5file:
        return dict(zip(h5file["paths"].asstr()[:], h5file[f"features/{layer}"][:].reshape(-1, 512)))


def manual_avgpool(paths) -> np.ndarray:
    """resnet18 (seed 0) up to avgpool over the DEFAULT weights' transforms of each whole decoded image."""
    transforms = default_preprocessing("resnet18")
    torch.manual_seed(0)
    model = get_model("resnet18", weights=None).eval()
    model.fc = torch.nn.Identity()
    batch = torch.stack([transforms(ImageOps.exif_transpose(Image.open(path)).convert("RGB")) for path in paths])
    with torch.inference_mode():
        return model(batch).numpy()


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_fast_decode_is_close_and_exact_path_unchanged(photos, tmp_path):
    exact_out, fast_out = tmp_path / "exact.h5", tmp_path / "fast.h5"
    for output, extra in ((exact_out, []), (fast_out, ["--fast-decode"])):
        result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", *extra, photos, output)
        assert result.returncode == 0, result.stderr
    exact, fast = features(exact_out), features(fast_out)
    names = sorted(exact)
    assert names == sorted(fast) and len(names) == 5
    manual = manual_avgpool([photos / name for name in names])
    np.testing.assert_allclose(np.stack([exact[name] for name in names]), manual, rtol=1e-5, atol=1e-6)
    for name in names:
        difference = np.linalg.norm(fast[name] - exact[name]) / np.linalg.norm(exact[name])
        if name.startswith("photo_"):
            assert 0 < difference < 0.01, (name, difference)  # decoded at 1/4 scale: close, not equal
        else:
            np.testing.assert_array_equal(fast[name], exact[name])  # too small for a reduced scale, or not a JPEG
    with h5py.File(fast_out, "r") as h5file:
        assert bool(h5file.attrs["fast_decode"]) is True


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_fast_decode_is_part_of_the_fingerprint(photos, tmp_path):
    output = tmp_path / "out.h5"
    settings = settings_for(photos, output, fast_decode=True)

    with pytest.raises(RuntimeError):
        extract(settings, CrashAfterFirstBatch())
    with pytest.raises(ResumeMismatch, match="fast_decode: true when started, false now"):
        extract(settings_for(photos, output, fast_decode=False))


def test_draft_size_is_twice_the_resize():
    assert Preprocess(default_preprocessing("resnet18"), fast_decode=True).draft == (512, 512)
    assert Preprocess(default_preprocessing("vit_b_16"), fast_decode=True).draft == (512, 512)
    assert Preprocess(default_preprocessing("resnet18")).draft is None


def test_workers_follow_slurm_then_the_affinity_mask(monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")
    assert job_cpus() == (6, "SLURM_CPUS_PER_TASK") and choose_workers(None) == 5
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert choose_workers(None) == 1  # never zero workers by default
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert choose_workers(None) == max(1, min(len(os.sched_getaffinity(0)), cgroup_cpus() or 10**6) - 1)
    assert choose_workers(0) == 0 and choose_workers(3) == 3  # an explicit count is kept
    assert choose_workers(None, batches=1) == 0 and choose_workers(2, batches=1) == 2  # one batch: none unless asked
    assert choose_workers(None, batches=2) >= 1


# a transform that notes which process decoded each image
DECODED_WHERE = """
import os
from torchvision.transforms import v2

def noting(folder):
    def transform(image):
        with open(os.path.join(folder, f"{os.getpid()}.pid"), "a") as handle:
            handle.write("x")
        return v2.Compose([v2.PILToTensor(), v2.ToDtype(__import__("torch").float32, scale=True), v2.Resize(32),
                           v2.CenterCrop(32)])(image)
    return transform
"""


@pytest.mark.parametrize("batch_size, in_workers", [("64", False), ("3", True)], ids=["one batch", "three"])
def test_a_job_of_one_batch_is_decoded_in_the_main_process_a_longer_one_by_workers(tmp_path, batch_size, in_workers):
    notes = tmp_path / "decoded"
    notes.mkdir()
    with user_project(tmp_path, "noted", DECODED_WHERE.replace("noting(folder)", f"noting(folder={str(notes)!r})"),
                      {"a": 4, "b": 3}) as folder:
        result = run_featdump("extract", *SMALL_RESNET_MODEL, "-l", "avgpool", "-b", batch_size,
                              "--transform", "noted:noting", folder / "images", tmp_path / "o.h5")
    assert result.returncode == 0, result.stderr
    decoded = {int(note.stem): len(note.read_text()) for note in notes.iterdir()}  # images by process
    by_workers = sum(count for process, count in decoded.items() if process != os.getpid())
    assert by_workers == (7 if in_workers else 0)  # this process may look at an image first, to size the input
    assert decoded.get(os.getpid(), 0) >= (0 if in_workers else 7)


def test_workers_follow_what_the_scheduler_granted_not_the_node(monkeypatch, tmp_path):
    """A Ray task's CPUs (FEATDUMP_CPUS, which the task sets from its resources) and a container's CPU quota
    (cpu.max: 8 CPUs of a larger node) size the loader, not the node's cores."""
    from featdump.inputs import workers

    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setenv("FEATDUMP_CPUS", "3")
    assert job_cpus() == (3, "FEATDUMP_CPUS") and choose_workers(None) == 2
    monkeypatch.delenv("FEATDUMP_CPUS")
    monkeypatch.setattr(workers, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(workers, "_cgroup_path", lambda: "pod")
    (tmp_path / "pod").mkdir()
    (tmp_path / "pod" / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: 2
    assert cgroup_cpus() == 2
    (tmp_path / "pod" / "cpu.max").write_text("100000 100000\n")  # 1 CPU of this machine's 2 or more
    assert job_cpus() == (1, "the cgroup's CPU quota (cpu.max)") and choose_workers(None) == 1
    (tmp_path / "pod" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus() is None and job_cpus()[1] == "the CPU affinity mask"


def test_workers_are_bounded_by_memory(monkeypatch, caplog):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "64")
    free = available_memory()  # read again inside choose_workers: the margin keeps the answer 1 while memory moves
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", int(free * 0.6) // 9 + 1)  # one decode could take 60% of it
    assert int(free * 0.6) < decode_bytes_per_worker() <= int(free * 0.6) + 9
    with caplog.at_level(logging.INFO, logger="featdump"):
        automatic = choose_workers(None)
        explicit = choose_workers(8)
    assert automatic == 1 and explicit == 8
    assert "Using 1 loader workers instead of 63" in caplog.text
    assert "8 loader workers could each take" in caplog.text and "lower -j to 1" in caplog.text


def test_chosen_worker_count_is_printed_with_verbose(tmp_path):
    write_images(tmp_path / "images", {"": 5})
    result = run_featdump("-v", "extract", *SMALL_RESNET, "-l", "avgpool", "-b", "2", tmp_path / "images",
                          tmp_path / "o.h5", env=featdump_env(SLURM_CPUS_PER_TASK="3"))
    assert result.returncode == 0, result.stderr
    assert "Using 2 loader workers: 3 CPUs (SLURM_CPUS_PER_TASK), one left to the main process." in result.stderr
