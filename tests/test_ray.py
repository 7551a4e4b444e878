"""Ray: a job's shards as tasks on a real local Ray cluster (2 CPUs), merged into what one run writes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import featdump
import featdump.progress
from featdump.errors import OutputExists
from featdump.output.layout import Committed, Output
from tests.makers.videos import write_video

from .helpers import (
    assert_same_rows,
    featdump_env,
    read_output,
    run_featdump,
    settings_for,
    start_featdump,
    write_images,
)

ray = pytest.importorskip("ray")

EXTRACT = ["extract", "-m", "resnet18", "-w", "none", "-l", "layer3,avgpool"]
LAYERS = ("layer3", "avgpool")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """24 images in two class folders (one undecodable), and their rows from one run (default workers and batch)."""
    root = tmp_path_factory.mktemp("ray")
    write_images(root / "images", {"cats": 12, "dogs": 11}, size=(40, 32))
    (root / "images" / "dogs" / "broken.jpg").write_bytes(b"not a jpeg")
    assert run_featdump(*EXTRACT, root / "images", root / "single.h5").returncode == 0
    return root / "images", read_output(root / "single.h5")


def assert_same_rows_and_skips(got: dict, expected: dict) -> None:
    assert_same_rows(got, expected, ignore=("complete", "reasons", "classes", "committed"))  # the skipped, too


@pytest.mark.slow  # a real Ray cluster: its start and its workers' imports take 20 s and more
def test_more_shards_than_workers_on_a_local_cluster_merge_into_the_single_run(images, tmp_path, caplog):
    folder, expected = images
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # a cluster of 2 CPUs, started here
    try:
        summary = featdump.extract_on_ray(folder, tmp_path / "out.h5", model="resnet18", weights="none",
                                          layers="layer3,avgpool", shards=3)
        stamps = {path.name: path.stat().st_mtime_ns for path in tmp_path.glob("out*.h5")}
        again = featdump.extract_on_ray(folder, tmp_path / "out.h5", model="resnet18", weights="none",
                                        layers="layer3,avgpool", shards=3)
        assert (again.rows, again.new_rows) == (23, 0)  # done at once: no shard read, nothing merged again
        assert again.line().endswith("made by this same command: nothing to do.") and "merged" not in again.line()
        assert {path.name: path.stat().st_mtime_ns for path in tmp_path.glob("out*.h5")} == stamps
        with pytest.raises(OutputExists, match="made by another command"):
            featdump.extract_on_ray(folder, tmp_path / "out.h5", model="resnet18", weights="none",
                                    layers="layer4,avgpool", shards=3)
        (tmp_path / "left").mkdir()
        left = featdump.extract_on_ray(folder, tmp_path / "left" / "out.h5", model="resnet18", weights="none",
                                       layers="layer3,avgpool", shards=3, merge=False)
        assert not left.merged and "the shards left where they lie" in left.line()
        assert os.environ.get("RAY_COLOR_PREFIX") == "0"  # stderr is no terminal here: raylet lines uncoloured
        mixed = tmp_path / "mixed"  # images and a video: a task's listing warns that the video is left out
        write_images(mixed, {"": 4}, size=(40, 32))
        write_video(mixed / "film.mkv", 5)
        with caplog.at_level("WARNING", logger="featdump"):  # a task's warning reaches the driver's log
            featdump.extract_on_ray(mixed, tmp_path / "warned.h5", model="resnet18", weights="none",
                                    layers="avgpool", shards=2)
        assert any(record.getMessage().startswith("Shard ") and "the videos are left out" in record.getMessage()
                   for record in caplog.records), [record.getMessage() for record in caplog.records]
        assert sorted(path.name for path in (tmp_path / "left").glob("*.h5")) == [
            f"out.shard-{index}-of-3.h5" for index in range(3)]
    finally:
        ray.shutdown()
    assert run_featdump("merge", "--view", tmp_path / "left" / "out.h5").returncode == 0  # later, without a copy
    assert_same_rows_and_skips(read_output(tmp_path / "left" / "out.h5"), expected)
    assert summary.shards == 3 and summary.rows == 23 and summary.new_rows == 23
    assert "Ray: 3 shards (23 rows, 23 new)" in summary.line()
    assert_same_rows_and_skips(read_output(tmp_path / "out.h5"), expected)
    with Output.open(tmp_path / "out.h5") as merged:
        assert len(merged.attrs["merged_from"]) == 3 and Committed.of(merged.file).skipped == 1


def ray_workers_running(name: str) -> list[int]:
    """The pids of Ray worker processes running a task of function NAME (Ray titles them `ray::NAME`), not their
    image loader's workers, which inherit the title."""
    titled = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(f"ray::{name}".encode()):
                    titled[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    return [pid for pid, parent in titled.items() if parent not in titled]


def committed_in(folder: Path) -> int:
    """Rows committed in the shard partial files under FOLDER."""
    total = 0
    for partial in folder.glob("*.partial"):
        try:
            with Output.open(partial, locking=False) as held:
                total += held.committed.rows
        except Exception:  # being created: nothing committed yet
            continue
    return total


def kill_workers_in_the_middle_of_a_shard(folder: Path, process, deadline: float) -> bool:
    """SIGKILL the shard tasks' workers once rows are committed and a shard is unfinished (its partial file lies in
    FOLDER). They are held still (SIGSTOP) while that is read, so none finishes its shard in between (a worker
    killed after its task returned would be no loss, and nothing would be retried)."""
    while process.poll() is None and time.monotonic() < deadline:
        if committed_in(folder) == 0:
            time.sleep(0.05)
            continue
        workers = ray_workers_running("_run_shard")
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        if workers and any(folder.glob("*.partial")):
            for pid in workers:
                os.kill(pid, signal.SIGKILL)  # nodes lost in the middle of their shards
            return True
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    return False


@pytest.mark.slow  # a real featdump process starting its own Ray cluster; a worker killed with SIGKILL
def test_a_worker_killed_in_the_middle_of_a_shard_is_retried_and_the_result_equals_a_single_run(images, tmp_path):
    folder, expected = images
    output = tmp_path / "out.h5"
    process = start_featdump(*EXTRACT, "-b", "2", "--ray", "--shards", "3", folder, output,
                             env=featdump_env(RAY_ADDRESS=""))
    assert kill_workers_in_the_middle_of_a_shard(tmp_path, process, deadline=time.monotonic() + 180)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert "Ray: 3 shards (23 rows" in stderr and "retried" in stderr, stderr
    assert_same_rows_and_skips(read_output(output), expected)


@pytest.mark.slow  # a real Ray cluster and a real store
def test_tasks_reach_the_store_with_the_driver_s_variables_whatever_their_nodes_hold(images, seaweed, tmp_path,
                                                                                   monkeypatch):
    """The cluster starts without the store's keys or endpoint (as nodes a platform set up); the driver has them:
    its tasks upload their shards with them, a rerun is done at once, and each task's loader has the CPU it asked
    for, not the node's."""
    folder, expected = images
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # its workers: no store variables
    try:
        for key, value in seaweed.env.items():
            monkeypatch.setenv(key, value)
        client = seaweed.client()
        if not client.exists("rayout"):
            client.mkdir("rayout")
        url = "s3://rayout/run/out.h5"
        summary = featdump.extract_on_ray(folder, url, model="resnet18", weights="none", layers="layer3,avgpool",
                                          shards=2, scratch=str(tmp_path / "scratch"))
        assert (summary.rows, summary.new_rows) == (23, 23)
        again = featdump.extract_on_ray(folder, url, model="resnet18", weights="none", layers="layer3,avgpool",
                                        shards=2, scratch=str(tmp_path / "scratch"))
        assert (again.rows, again.new_rows) == (23, 0)
    finally:
        ray.shutdown()
    client.get("rayout/run/out.h5", str(tmp_path / "merged.h5"))
    assert_same_rows_and_skips(read_output(tmp_path / "merged.h5"), expected)


@pytest.mark.slow  # a real Ray cluster
def test_a_gpu_task_asks_for_its_share_of_cpus_and_sizes_its_loader_by_them(monkeypatch):
    """A cluster of 4 CPUs and 2 GPUs (faked: Ray counts them as told): a shard's task on CUDA asks for a GPU and
    2 CPUs, and inside it the loader gets 1 worker (its 2 CPUs less the main process), not the node's CPUs - 1;
    -j 3 asks for 4 CPUs."""
    from featdump.engines import ray as engine
    from featdump.inputs.workers import choose_workers

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the suite hides CUDA (""), which Ray refuses 2 GPUs under
    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        resources = engine._task_resources(ray, settings_for(".", "out.h5", device="cuda", num_workers=None))
        assert resources == {"num_gpus": 1, "num_cpus": 2}
        assert engine._task_resources(ray, settings_for(".", "out.h5", device="cuda", num_workers=3)) == \
            {"num_gpus": 1, "num_cpus": 4}

        def loader_workers() -> tuple[int, list]:
            engine.size_by_grant()
            return choose_workers(None), ray.get_gpu_ids()

        workers, gpu_ids = ray.get(ray.remote(loader_workers).options(**resources).remote())
        assert workers == 1 and len(gpu_ids) == 1
    finally:
        ray.shutdown()


def test_a_node_s_own_variables_are_not_overridden_by_the_driver_s(monkeypatch):
    """The store's credentials and endpoints travel to the tasks; a node's scratch disk, memory and granted CPUs
    are its own."""
    from featdump.engines.ray import store_environment

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333")
    for name in ("FEATDUMP_SCRATCH", "FEATDUMP_CPUS", "FEATDUMP_PCA_MEMORY_GB"):
        monkeypatch.setenv(name, "driver's")
    passed = store_environment()
    assert passed["AWS_ENDPOINT_URL"] == "http://127.0.0.1:8333"
    assert not {"FEATDUMP_SCRATCH", "FEATDUMP_CPUS", "FEATDUMP_PCA_MEMORY_GB"} & set(passed)


def test_a_gpu_task_s_share_comes_from_the_gpu_nodes_and_an_unplaceable_one_is_refused_at_once():
    """A CPU-only head counts for nothing in a GPU task's share of CPUs; a task no node can run is refused before
    any is submitted, naming what it asks and what the nodes have."""
    from featdump.engines.placement import task_resources
    from featdump.errors import UsageProblem

    head, small = {"CPU": 2.0}, {"CPU": 1.0, "GPU": 1.0}  # the cluster: it hung asking for 3 CPUs
    assert task_resources([head, small], "cuda", None) == {"num_gpus": 1, "num_cpus": 1}
    kuberay = [{"CPU": 8.0}, *[{"CPU": 8.0, "GPU": 1.0}] * 3]  # KubeRay's default head, workers of 8 CPUs, 1 GPU
    assert task_resources(kuberay, "auto", None) == {"num_gpus": 1, "num_cpus": 8}
    assert task_resources([head, {"CPU": 16.0, "GPU": 4.0}], "cuda", None) == {"num_gpus": 1, "num_cpus": 4}
    assert task_resources([head, small], "cpu", 1) == {"num_cpus": 2}
    with pytest.raises(UsageProblem, match=r"No node of the Ray cluster can run a shard's task, which asks for 1 "
                                           r"gpus, 9 cpus: the nodes have 8 CPUs and 0 GPUs; 8 CPUs and 1 GPUs"):
        task_resources(kuberay[:2], "cuda", 8)
    with pytest.raises(UsageProblem, match=r"--device cuda: the Ray cluster has no GPU \(the nodes have 2 CPUs"):
        task_resources([head], "cuda", None)


@pytest.mark.slow  # a real Ray cluster of two nodes
def test_a_gpu_task_on_a_cluster_whose_head_has_no_gpu_is_placed_and_said_unplaceable_when_its_node_goes(
        monkeypatch, caplog):
    """`ray start --head` on a CPU machine (2 CPUs) and a node of 1 CPU and 1 GPU (faked: Ray counts it as told): a
    shard's task asks for what the GPU node has, and runs there (it waited forever before). Then the GPU node goes:
    a task submitted now never starts, and the driver's wait stops after its grace naming what the task asks and
    what the nodes have (Ray would wait forever); tasks that wait on a busy node are said to wait, once a grace."""
    from ray.cluster_utils import Cluster

    from featdump.engines import ray as engine
    from featdump.engines.placement import PlacementWatch, Unplaceable

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the suite hides CUDA (""), which Ray refuses a GPU under
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0,
                                                            "include_dashboard": False})
    try:
        gpu_node = cluster.add_node(num_cpus=1, num_gpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        resources = engine._task_resources(ray, settings_for(".", "out.h5", device="cuda", num_workers=None))
        assert resources == {"num_gpus": 1, "num_cpus": 1}
        placed = ray.remote(lambda: len(ray.get_gpu_ids())).options(**resources).remote()
        assert ray.get(placed, timeout=120) == 1
        assert engine._slots(ray, resources) == 1

        blocker = ray.remote(lambda: time.sleep(60)).options(num_cpus=2).remote()  # another job holds the head
        busy = PlacementWatch({"num_cpus": 2}, grace=1.0)
        time.sleep(1.5)
        with caplog.at_level("WARNING", logger="featdump"):
            busy.check(ray, started=False)  # the head could run it: a warning, no stop
        assert "No shard has started in 2 s: a task asks for 2 cpus and the cluster has" in caplog.text
        ray.cancel(blocker, force=True)

        cluster.remove_node(gpu_node)
        board = ray.remote(engine._Board).options(num_cpus=0).remote()
        waiting = ray.remote(lambda: {"rows": 0}).options(**resources).remote()
        started = time.monotonic()
        with pytest.raises(Unplaceable, match=r"no live node of the Ray cluster can run one any more: a shard's "
                                              r"task asks for 1 gpus, 1 cpus; the nodes have 2 CPUs and 0 GPUs"):
            engine._wait_for(ray, {waiting: 0}, board, featdump.progress.NoProgress(), 1,
                             PlacementWatch(resources, grace=3.0))
        assert time.monotonic() - started < 30
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_the_driver_s_check_of_a_merged_output_says_ray_planned_the_shards(tmp_path, caplog):
    """A finished --ray job run again: the driver's look at its merged output logs its plan of a shard as Ray's,
    not as a --shard the user gave."""
    import logging

    from featdump.engines import ray as engine

    write_images(tmp_path / "images", {"": 4}, size=(32, 24))
    run = ["extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "-b", "4", "-j", "0", "--device", "cpu"]
    for index in range(2):
        made = run_featdump(*run, "--shard", f"{index}/2", tmp_path / "images", tmp_path / "out.h5")
        assert made.returncode == 0, made.stderr
    assert run_featdump("merge", tmp_path / "out.h5").returncode == 0
    with caplog.at_level(logging.INFO, logger="featdump"):
        rows = engine._merged_already(settings_for(tmp_path / "images", tmp_path / "out.h5"), 2)
    assert rows == 4 and "(from --ray --shards)" in caplog.text and "(from --shard)" not in caplog.text, caplog.text
    assert engine.SOURCE_VARIABLE not in os.environ  # put back as it was
