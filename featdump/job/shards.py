"""Shards: which contiguous part of the sorted image list this process owns (--shard, SLURM arrays, torchrun,
Kubernetes Indexed Jobs),
and the barrier torchrun's ranks meet at before rank 0 merges (the files' names: `output.shard_files`)."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from featdump.errors import BadOption, RanksDidNotFinish, UsageProblem
from featdump.output.shard_files import shard_path

log = logging.getLogger("featdump")

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Part INDEX (0-based) of COUNT, and what said so."""

    index: int
    count: int
    source: str  # "--shard", "SLURM array", "torchrun", "Kubernetes"
    local_rank: int | None = None  # torchrun: the GPU this process uses

    def bounds(self, total: int) -> tuple[int, int]:
        """[start, stop) of this part of TOTAL items: contiguous, disjoint, covering, sizes differing by <= 1."""
        return self.index * total // self.count, (self.index + 1) * total // self.count

    def path(self, output: Path | str, pattern: str | None = None) -> Path | str:
        return shard_path(output, self.index, self.count, pattern)


def parse_shard(text: str) -> Shard | None:
    """'K/N' -> Shard; 'none' -> None (no sharding even under SLURM or torchrun)."""
    if text.strip().lower() == "none":
        return None
    match = _SHARD.match(text)
    if not match:
        raise BadOption(f"Bad --shard {text!r}: use K/N with 0 <= K < N (e.g. 3/8), or none.")
    index, count = int(match[1]), int(match[2])
    if not 0 <= index < count:
        raise BadOption(f"Bad --shard {text!r}: K must be in 0..N-1 (0-based), here 0..{max(count - 1, 0)}.")
    return Shard(index, count, os.environ.get(SOURCE_VARIABLE, "--shard"))


# Who set --shard where a user did not: an engine running the shards as its tasks names itself here (Ray).
SOURCE_VARIABLE = "FEATDUMP_SHARD_SOURCE"


# A Kubernetes Indexed Job gives each pod its index; the count is the manifest's `completions`, which the pod does not
# see: the manifest passes it in this variable (configs/kubernetes_indexed_job.yaml).
KUBERNETES_COUNT = "FEATDUMP_SHARDS"


def detect_shard(environ=os.environ) -> Shard | None:
    """The part a SLURM job array task, a torchrun rank or a Kubernetes Indexed Job's pod owns, from the variables
    they set; None outside all three."""
    if "SLURM_ARRAY_TASK_ID" in environ and "SLURM_ARRAY_TASK_COUNT" in environ:
        task, count = int(environ["SLURM_ARRAY_TASK_ID"]), int(environ["SLURM_ARRAY_TASK_COUNT"])
        first = int(environ.get("SLURM_ARRAY_TASK_MIN", 0))
        step = int(environ.get("SLURM_ARRAY_TASK_STEP", 1) or 1)
        index = (task - first) // step
        if not 0 <= index < count:
            raise UsageProblem(
                f"SLURM array task {task} is not one of {count} tasks from {first} by {step}; pass --shard K/N."
            )
        return Shard(index, count, f"SLURM array task {task} (tasks {first}.. by {step}, {count} in all)")
    if "RANK" in environ and "WORLD_SIZE" in environ and "LOCAL_RANK" in environ:
        rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        if world > 1:
            return Shard(rank, world, f"torchrun rank {rank} of {world}", int(environ["LOCAL_RANK"]))
    if "JOB_COMPLETION_INDEX" in environ:
        return _kubernetes_shard(environ)
    return None


def _kubernetes_shard(environ) -> Shard:
    index, count = environ["JOB_COMPLETION_INDEX"], environ.get(KUBERNETES_COUNT, "")
    if not count.strip().isdigit():
        raise UsageProblem(f"Kubernetes Indexed Job pod {index}: set {KUBERNETES_COUNT} to the Job's completions "
                           "(the shard count), as configs/kubernetes_indexed_job.yaml does, or pass --shard K/N.")
    if not index.strip().isdigit() or not 0 <= int(index) < int(count):
        raise UsageProblem(f"Kubernetes Indexed Job pod {index} is not one of {count} shards "
                           f"({KUBERNETES_COUNT}={count}); pass --shard K/N.")
    return Shard(int(index), int(count), f"Kubernetes Indexed Job, completion index {index} of {count}")


def choose_shard(option: str | None, environ=os.environ) -> Shard | None:
    """--shard when given (K/N or none), else what the launcher says."""
    return parse_shard(option) if option else detect_shard(environ)


@dataclass(frozen=True)
class ShardPlan:
    """What a shard's run writes: its own file, its part of the images, and what its file records of the job."""

    output: Path
    images: object  # an ImageList: this shard's part
    fingerprint: dict  # its place in the whole job


def plan_shard(shard: Shard, output: Path, pattern: str | None, images) -> ShardPlan:
    """The part of IMAGES (an ImageList) SHARD owns, and the file it goes to."""
    start, stop = part_bounds(shard, images)
    path = shown = shard.path(output, pattern)  # a URL's shard as a URL
    if start < stop:
        log.info("Shard %d of %d (from %s): %ss %d to %d of %d, into %s.", shard.index, shard.count,
                 shard.source, images.noun, start, stop - 1, len(images), shown)
    else:
        log.info("Shard %d of %d (from %s): no %ss (%d %ss for %d shards), into %s.", shard.index, shard.count,
                 shard.source, images.noun, len(images), images.noun, shard.count, shown)
    extra = {"shard": [shard.index, shard.count], "all_images": images.digest(sizes=False),
             "all_image_count": len(images)}
    return ShardPlan(path, images.part(start, stop), extra)


def part_bounds(shard: Shard, images) -> tuple[int, int]:
    """[start, stop) of the images (an ImageList) SHARD owns: whole groups (tars) when there are at least as many
    groups as shards, so that each process reads only its own tars; else an even split of the images."""
    groups = images.groups()
    if not groups or len(groups) < shard.count:
        return shard.bounds(len(images))
    first, last = shard.bounds(len(groups))
    edges = [*groups, len(images)]
    return edges[first], edges[last]


def wait_for_all_ranks(timeout: float) -> None:
    """A barrier over torchrun's ranks (gloo, from its environment); RanksDidNotFinish naming the late ones."""
    import torch.distributed as dist

    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=timeout), wait_all_ranks=True)
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RanksDidNotFinish(
            f"Not every torchrun rank finished within {timeout:.0f} s ({first_line}). The finished shards are "
            "kept; rerun the job to finish the others, or run `featdump merge OUT` once they are done."
        ) from error
    finally:
        if started_here:
            dist.destroy_process_group()
