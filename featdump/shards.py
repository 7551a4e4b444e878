"""Shards: which contiguous part of the sorted image list this process owns (--shard, SLURM arrays, torchrun)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from featdump.errors import UsageProblem

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Part INDEX (0-based) of COUNT, and what said so."""

    index: int
    count: int
    source: str  # "--shard", "SLURM array", "torchrun"
    local_rank: int | None = None  # torchrun: the GPU this process uses

    def bounds(self, total: int) -> tuple[int, int]:
        """[start, stop) of this part of TOTAL items: contiguous, disjoint, covering, sizes differing by <= 1."""
        return self.index * total // self.count, (self.index + 1) * total // self.count

    def path(self, output: Path, pattern: str | None = None) -> Path:
        return shard_path(output, self.index, self.count, pattern)


def shard_pattern(output: Path, pattern: str | None = None) -> str:
    """The shard file names of OUTPUT, relative to its folder, with {k} and {n}: PATTERN, or by default
    OUT.shard-K-of-N.h5 beside OUT (out.h5 -> out.shard-2-of-8.h5)."""
    if pattern:
        if "{k}" not in pattern or "{n}" not in pattern:
            raise UsageProblem(f"Bad shard pattern {pattern!r}: it needs both {{k}} and {{n}}, "
                               "e.g. part-{k}-of-{n}.h5.")
        return pattern
    output = Path(output)
    return f"{output.stem}.shard-{{k}}-of-{{n}}{output.suffix or '.h5'}"


def shard_path(output: Path, index: int, count: int, pattern: str | None = None) -> Path:
    """Where shard INDEX of COUNT of OUTPUT is written."""
    return Path(output).parent / shard_pattern(output, pattern).format(k=index, n=count)


def parse_shard(text: str) -> Shard | None:
    """'K/N' -> Shard; 'none' -> None (no sharding even under SLURM or torchrun)."""
    if text.strip().lower() == "none":
        return None
    match = _SHARD.match(text)
    if not match:
        raise UsageProblem(f"Bad --shard {text!r}: use K/N with 0 <= K < N (e.g. 3/8), or none.")
    index, count = int(match[1]), int(match[2])
    if not 0 <= index < count:
        raise UsageProblem(f"Bad --shard {text!r}: K must be in 0..N-1 (0-based), here 0..{max(count - 1, 0)}.")
    return Shard(index, count, "--shard")


def detect_shard(environ=os.environ) -> Shard | None:
    """The part a SLURM job array task or a torchrun rank owns, from the variables they set; None outside both."""
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
    return None


def choose_shard(option: str | None, environ=os.environ) -> Shard | None:
    """--shard when given (K/N or none), else what the launcher says."""
    return parse_shard(option) if option else detect_shard(environ)
