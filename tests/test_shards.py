"""Cluster runs: shards from --shard, SLURM arrays and torchrun, merged into one file that reads like one run's."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest

import featdump
from featdump.errors import MergedViewBroken, UsageProblem
from featdump.inputs import find_images
from featdump.job.shards import Shard, choose_shard, detect_shard, parse_shard, plan_shard
from featdump.output import merge as merge_module
from featdump.output import views
from featdump.output.shard_files import shard_path

from .helpers import featdump_env, read_output, run_featdump, start_featdump, write_images

LAYERS = "layer1.0.relu:2,avgpool"


def extract_args(images, output, *extra):
    return ["extract", "-m", "resnet18", "-w", "none", "-l", LAYERS, "-b", "4", *extra, images, output]


def assert_same(actual: dict, expected: dict):
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(actual[key], value, err_msg=key)  # bit for bit
        else:
            assert actual[key] == value, key


@pytest.mark.parametrize("total", [0, 1, 2, 7, 13, 97])
@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 11])
def test_shards_are_contiguous_disjoint_and_covering(total, count):
    parts = [Shard(index, count, "test").bounds(total) for index in range(count)]
    covered = [i for start, stop in parts for i in range(start, stop)]
    assert covered == list(range(total))  # in order, each once
    sizes = [stop - start for start, stop in parts]
    assert max(sizes) - min(sizes) <= 1


def test_a_shard_of_an_output_at_a_url_is_a_url_beside_it_and_a_local_one_a_path_beside_it():
    from pathlib import Path

    from featdump.output.shard_files import shard_path

    assert shard_path("s3://r10/run/out.h5", 0, 4) == "s3://r10/run/out.shard-0-of-4.h5"  # not "s3:/r10/..."
    assert shard_path("s3://r10/run/out.h5", 3, 4, "parts/p-{k}-of-{n}.h5") == "s3://r10/run/parts/p-3-of-4.h5"
    assert shard_path(Path("/data/out.h5"), 1, 2) == Path("/data/out.shard-1-of-2.h5")


def test_shard_from_a_kubernetes_indexed_job():
    pod = {"JOB_COMPLETION_INDEX": "5", "FEATDUMP_SHARDS": "64"}
    shard = detect_shard(pod)
    assert (shard.index, shard.count) == (5, 64) and "Kubernetes Indexed Job" in shard.source
    with pytest.raises(UsageProblem, match="set FEATDUMP_SHARDS to the Job's completions"):
        detect_shard({"JOB_COMPLETION_INDEX": "5"})
    with pytest.raises(UsageProblem, match="is not one of 4 shards"):
        detect_shard({"JOB_COMPLETION_INDEX": "4", "FEATDUMP_SHARDS": "4"})
    assert choose_shard("none", pod) is None and choose_shard("1/2", pod).index == 1  # --shard wins
    yaml = pytest.importorskip("yaml")  # PyYAML (in the dev extra, beside Ray)
    job = yaml.safe_load((Path(__file__).parents[1] / "configs" / "kubernetes_indexed_job.yaml").read_text())["spec"]
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    environment = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert job["completionMode"] == "Indexed" and environment["FEATDUMP_SHARDS"] == str(job["completions"])
    assert job["backoffLimitPerIndex"] >= 1 and pod["restartPolicy"] == "Never"
    rules = {rule["action"]: rule for rule in job["podFailurePolicy"]["rules"]}
    assert rules["Ignore"]["onPodConditions"] == [{"type": "DisruptionTarget"}]  # a preemption is not a failure
    assert rules["FailIndex"]["onExitCodes"]["values"] == [2]  # a usage error is not retried
    assert container["command"][:2] == ["featdump", "extract"] and "--scratch" in container["command"]
    cpus = next(variable for variable in container["env"] if variable["name"] == "FEATDUMP_CPUS")
    assert cpus["valueFrom"]["resourceFieldRef"]["resource"] == "requests.cpu"  # -j from the request, not the node
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    shared = {volume["name"] for volume in pod["volumes"] if "persistentVolumeClaim" in volume}
    for cache in ("TORCH_HOME", "HF_HOME"):  # weights read from a shared volume, not downloaded in every pod
        assert any(environment[cache].startswith(path) and mounts[path] in shared for path in mounts), cache


def test_shard_from_the_launcher_environment():
    slurm = {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1",
             "SLURM_ARRAY_TASK_STEP": "2"}
    shard = detect_shard(slurm)
    assert (shard.index, shard.count) == (3, 4) and "SLURM array task 7" in shard.source
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    assert detect_shard(torchrun) == Shard(1, 2, "torchrun rank 1 of 2", 1)
    assert detect_shard({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}) is None
    assert detect_shard({}) is None
    assert parse_shard("2/5") == Shard(2, 5, "--shard") and parse_shard("none") is None
    for bad in ("5/5", "1of2", "-1/3"):
        with pytest.raises(UsageProblem, match="Bad --shard"):
            parse_shard(bad)
    assert shard_path("/x/out.h5", 2, 8).as_posix() == "/x/out.shard-2-of-8.h5"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards") / "images"
    write_images(root, {"a": 9, "b": 8}, size=(48, 40))
    (root / "b" / "broken.jpg").write_bytes(b"not a jpeg")
    return root


@pytest.fixture(scope="module")
def single(folder, tmp_path_factory):
    output = tmp_path_factory.mktemp("single") / "single.h5"
    result = run_featdump(*extract_args(folder, output))
    assert result.returncode == 0, result.stderr
    return read_output(output)


def test_a_merge_copy_that_does_not_fit_is_one_line_and_writes_nothing(folder, small_filesystem):
    output = small_filesystem / "out.h5"
    for index in range(2):  # in this process: the shards are only the setting
        featdump.extract(folder, output, model="resnet18", weights="none", layers="layer1", shard=f"{index}/2",
                         num_workers=0)
    free = shutil.disk_usage(small_filesystem).free
    (small_filesystem / "filler").write_bytes(bytes(free - 2 * 1024 * 1024))  # 2 MB left: the copy cannot fit
    result = run_featdump("merge", "--copy", output)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("Error: The --copy of the shards needs about ")
    assert result.stderr.strip().endswith("free space, or merge without --copy (virtual datasets, no copy).")
    assert len(result.stderr.strip().splitlines()) == 1 and "Internal error" not in result.stderr
    assert not output.exists() and not output.with_name("out.h5.partial").exists()
    assert not output.with_name("out.h5.lock").exists()


@pytest.mark.slow  # an array's tasks as processes (torchrun's test merges in make test)
def test_slurm_array_tasks_then_merge_equal_a_single_run(folder, single, tmp_path):
    output = tmp_path / "out.h5"
    tasks = [start_featdump(*extract_args(folder, output), stdout=None,
                            env=featdump_env(SLURM_ARRAY_TASK_ID=str(10 + task), SLURM_ARRAY_TASK_COUNT="3",
                                             SLURM_ARRAY_TASK_MIN="10", SLURM_JOB_ID="1")) for task in range(3)]
    logs = [task.communicate()[1] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0, 0], logs
    assert "Shard 1 of 3 (from SLURM array task 11" in logs[1]
    assert not output.exists()
    info = run_featdump("info", output)
    assert info.returncode == 0 and "not merged yet; all 3 shards are finished" in info.stdout
    merged = run_featdump("merge", "--view", output)
    assert merged.returncode == 0, merged.stderr
    assert_same(read_output(output), single)
    again = run_featdump(*extract_args(folder, output), env=featdump_env(
        SLURM_ARRAY_TASK_ID="12", SLURM_ARRAY_TASK_COUNT="3", SLURM_ARRAY_TASK_MIN="10"))
    assert again.returncode == 0 and "finished already, made by this same command" in again.stderr  # re-submitted

    # The virtual file opens with plain h5py in a fresh process, elsewhere, and equals the --copy file.
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in tmp_path.glob("out*.h5"):
        shutil.move(path, moved / path.name)
    copy = run_featdump("merge", "--copy", moved / "copy.h5", "--shard-pattern", "out.shard-{k}-of-{n}.h5")
    assert copy.returncode == 0, copy.stderr
    reader = ("import h5py, sys; f = h5py.File(sys.argv[1]); print(float(f['features/avgpool'][:].sum()), "
              "f['features/avgpool'].is_virtual, len(f['paths']))")
    virtual_read = subprocess.run([sys.executable, "-c", reader, str(moved / "out.h5")], cwd="/",
                                  capture_output=True, text=True)
    copy_read = subprocess.run([sys.executable, "-c", reader, str(moved / "copy.h5")], cwd="/",
                               capture_output=True, text=True)
    assert virtual_read.returncode == 0, virtual_read.stderr
    total, is_virtual, rows = virtual_read.stdout.split()
    assert is_virtual == "True" and copy_read.stdout.split() == [total, "False", rows]
    assert float(total) == pytest.approx(float(single["avgpool"].sum())) and int(rows) == 17
    assert_same(read_output(moved / "copy.h5"), single)


    # The merged view alone (its shards left behind): refused by featdump, NaN (never zeros) for plain h5py.
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(moved / "out.h5", alone / "out.h5")
    for command in (["info", alone / "out.h5"], ["show", alone / "out.h5", "-o", tmp_path / "x.png"]):
        result = run_featdump(*command)
        assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "is a merged view whose shard files are missing: out.shard-0-of-3.h5, out.shard-1-of-3.h5, " \
               "out.shard-2-of-3.h5" in result.stderr and "featdump merge --copy" in result.stderr
    with pytest.raises(MergedViewBroken, match="missing: out.shard-0-of-3.h5"):
        featdump.load(alone / "out.h5", "avgpool")
    with h5py.File(alone / "out.h5", "r") as h5file:
        assert np.isnan(h5file["features/avgpool"][:]).all()
    shutil.copy(moved / "out.shard-0-of-3.h5", alone)
    shutil.copy(moved / "out.shard-1-of-3.h5", alone)
    with open(moved / "out.shard-2-of-3.h5", "rb") as source, open(alone / "out.shard-2-of-3.h5", "wb") as target:
        target.write(source.read() + b"\0" * 10)  # not the file that was merged
    result = run_featdump("info", alone / "out.h5")
    assert result.returncode == 1 and "changed since the merge: out.shard-2-of-3.h5" in result.stderr


@pytest.mark.slow
def test_more_shards_than_images(tmp_path, caplog):
    images = tmp_path / "images"
    write_images(images, {"": 2})
    output = tmp_path / "out.h5"
    for index in range(4):
        result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--shard", f"{index}/4",
                              images, output)
        assert result.returncode == 0, result.stderr
    assert run_featdump("merge", output).returncode == 0
    with h5py.File(output, "r") as h5file:
        assert h5file["features/avgpool"].shape == (2, 512, 1, 1) and len(h5file["paths"]) == 2
    with caplog.at_level(logging.INFO, logger="featdump"):
        plan_shard(Shard(2, 4, "--shard"), output, None, find_images(images))
    assert "Shard 2 of 4 (from --shard): no images (2 images for 4 shards)" in caplog.text
    assert "images 2 to 1" not in caplog.text


def test_small_shards_get_chunks_of_their_size_and_info_names_mixed_shard_counts(folder, tmp_path):
    output = tmp_path / "out.h5"
    for shard in ("0/8", "1/4"):
        featdump.extract(folder, output, model="resnet18", weights="none", layers="layer1", shard=shard,
                         num_workers=0)
    with h5py.File(tmp_path / "out.shard-0-of-8.h5", "r") as h5file:
        rows = len(h5file["paths"])
        assert h5file["features/layer1"].chunks[0] <= rows  # no chunk larger than the shard
    estimate = rows * 64 * 56 * 56 * 4
    metadata = 256 * 1024  # attributes, paths, file stats, dimension scales: the same whatever the chunks
    assert (tmp_path / "out.shard-0-of-8.h5").stat().st_size < estimate + metadata  # a 64-row chunk: 51 MB
    info = run_featdump("info", output)
    assert info.returncode == 2 and "different shard counts ([4, 8])" in info.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_merge_names_a_missing_an_unfinished_and_a_different_shard(folder, tmp_path):
    output = tmp_path / "out.h5"
    for index in (0, 2):
        assert run_featdump(*extract_args(folder, output, "--shard", f"{index}/3")).returncode == 0
    info = run_featdump("info", "--json", output)
    summed = json.loads(info.stdout)
    assert summed["state"] == "sharded" and [shard["state"] for shard in summed["shards"]] == \
        ["complete", "missing", "complete"]
    assert summed["images_done"] == 6 + 6  # shards 0 and 2 of 18 images: 6 each
    assert "not merged yet; 2 of 3 shards finished" in run_featdump("info", output).stdout
    missing = run_featdump("merge", output)
    assert missing.returncode == 2
    assert "shard 1 of 3 is missing" in missing.stderr and "run its task" in missing.stderr
    shard_1 = shard_path(output, 1, 3)
    shard_1.with_name(shard_1.name + ".partial").write_bytes(b"")  # what a task killed at once leaves
    unfinished = run_featdump("merge", output)
    assert unfinished.returncode == 2 and "shard 1 of 3 is incomplete" in unfinished.stderr
    shard_1.with_name(shard_1.name + ".partial").unlink()
    assert run_featdump(*extract_args(folder, output, "--shard", "1/3", "--seed", "1")).returncode == 0
    different = run_featdump("merge", output)
    assert different.returncode == 2
    assert "Shard 1" in different.stderr and "seed: 0 when started, 1 now" in different.stderr
    assert not output.exists()


@pytest.mark.slow  # real torchrun processes
def test_torchrun_two_ranks_merge_to_a_single_run(folder, single, tmp_path):
    output = tmp_path / "out.h5"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29517",
               "-m", "featdump", *map(str, extract_args(folder, output))]
    result = subprocess.run(command, env=featdump_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torchrun rank 1 of 2" in result.stderr and "Merged 2 shards into" in result.stderr
    assert_same(read_output(output), single)


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow  # a store or many processes beyond a few seconds: make test-all (CI)
def test_a_view_is_read_one_shard_file_at_a_time(folder, single, tmp_path):
    """HDF5 keeps every source file a virtual dataset read open while it is open (1,007 files for a view of 1,000
    shards): load, rdm and probe read a view's shards one at a time instead."""
    for index in range(4):
        assert run_featdump(*extract_args(folder, tmp_path / "out.h5"), "--shard", f"{index}/4").returncode == 0
    assert run_featdump("merge", "--view", tmp_path / "out.h5").returncode == 0
    with h5py.File(tmp_path / "out.h5", "r") as h5file:
        dataset = h5file["features"]["avgpool"]
        spans = [(low, high) for low, high, *_ in views.sources(dataset)]
        assert len(spans) == 4 and spans[0][0] == 0 and spans[-1][1] == 17  # 17 rows, one image skipped
        assert all(high == following for (_, high), (following, _) in zip(spans, spans[1:]))
        through_hdf5 = dataset[:]
        np.testing.assert_array_equal(views.read_span(dataset, 2, 13, (slice(3, 9),)), through_hdf5[2:13, 3:9])
    peak, before = [0], open_files()
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak[0] = max(peak[0], open_files())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for layer in LAYERS.split(","):
            np.testing.assert_array_equal(featdump.load(tmp_path / "out.h5", layer).features, single[layer])
            labelled = featdump.load(tmp_path / "out.h5", layer, xarray=True)
            np.testing.assert_array_equal(labelled.values, single[layer])
        featdump.rdm(tmp_path / "out.h5", layers=["avgpool"], device="cpu")
    finally:
        sampling.set()
        sampler.join()
    assert peak[0] - before <= 2, f"{peak[0] - before} files open at once"  # the view and a shard (HDF5: 4 shards)


def test_a_merged_file_holds_the_attributes_of_10000_shards(tmp_path):
    """10,000 shards' sizes (80 KB) and names passed the 64 KiB an attribute may take in HDF5's old format: the merge
    failed with "object header message is too large". The merged file is made in a format that holds them."""
    from featdump.output.merge import new_merged_file

    with new_merged_file(tmp_path / "merged.h5", None) as merged:
        merged.attrs["merged_sizes"] = np.arange(10_000, dtype=np.int64)
        merged.attrs["merged_from"] = np.array([f"out.shard-{index}-of-10000.h5" for index in range(10_000)],
                                               dtype=h5py.string_dtype())
    with h5py.File(tmp_path / "merged.h5", "r") as merged:
        assert merged.attrs["merged_sizes"][-1] == 9_999
    netcdf4 = pytest.importorskip("netCDF4")
    with netcdf4.Dataset(tmp_path / "merged.h5") as opened:
        assert "merged_sizes" in opened.ncattrs()


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_small_shards_are_merged_as_a_copy_larger_ones_as_a_view_and_either_when_asked(folder, single, tmp_path,
                                                                                        monkeypatch):
    """A view of small shards reads slowly (a file open for a few rows: 0.004-0.5x one file's rate at 10,000 shards
    of 2 rows), so the merge copies them by itself; from VIEW_FROM_BYTES a shard, a view; --copy/--view decide."""
    output = tmp_path / "out.h5"
    for index in range(2):
        assert run_featdump(*extract_args(folder, output), "--shard", f"{index}/2").returncode == 0
    small = run_featdump("merge", output)
    assert small.returncode == 0, small.stderr
    assert "of rows each: copied into one file" in small.stderr and "(self-contained copy)" in small.stderr
    assert not merge_module.merged_view(output)
    assert_same(read_output(output), single)
    monkeypatch.setattr(merge_module, "VIEW_FROM_BYTES", 1024)  # these shards (9 and 8 rows of 2 KB) count as large
    large = run_featdump("merge", output)  # the merge's own copy is replaced without --overwrite, as a view is
    assert large.returncode == 0, large.stderr
    assert "(virtual datasets over the shards)" in large.stderr and merge_module.merged_view(output)
    assert_same(read_output(output), single)
    copied = run_featdump("merge", "--copy", output)
    assert copied.returncode == 0 and not merge_module.merged_view(output)
    monkeypatch.setattr(merge_module, "VIEW_FROM_BYTES", 2**40)
    asked = run_featdump("merge", "--view", "--overwrite", output)
    assert asked.returncode == 0 and merge_module.merged_view(output)
    assert_same(read_output(output), single)


def test_a_shard_an_engine_set_is_named_after_it(monkeypatch):
    from featdump.job.shards import SOURCE_VARIABLE, parse_shard

    assert parse_shard("3/8").source == "--shard"
    monkeypatch.setenv(SOURCE_VARIABLE, "--ray's task")  # what the Ray engine's task sets
    assert parse_shard("3/8").source == "--ray's task"


def test_a_shard_of_an_output_at_a_url_is_said_as_a_url(tmp_path, caplog):
    import logging

    from featdump.inputs import find_images
    from featdump.job.shards import parse_shard, plan_shard

    from .helpers import write_images

    write_images(tmp_path / "images", {"": 4}, size=(16, 12))
    with caplog.at_level(logging.INFO, logger="featdump"):
        plan_shard(parse_shard("0/2"), "s3://r10/run/out.h5", None, find_images(tmp_path / "images"))
    assert "into s3://r10/run/out.shard-0-of-2.h5." in caplog.text, caplog.text  # not "s3:/r10"
