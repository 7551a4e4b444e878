"""Shard files: the names of a sharded job's files beside its output (OUT.shard-K-of-N.h5, or --shard-pattern),
and the shard count read back from the names found there."""

from __future__ import annotations

import os
import re
from pathlib import Path

from featdump.errors import BadOption, ShardProblem
from featdump.locations import Location


def shard_pattern(output: Path, pattern: str | None = None) -> str:
    """The shard file names of OUTPUT, relative to its folder, with {k} and {n}: PATTERN, or by default
    OUT.shard-K-of-N.h5 beside OUT (out.h5 -> out.shard-2-of-8.h5)."""
    if pattern:
        if "{k}" not in pattern or "{n}" not in pattern:
            raise BadOption(f"Bad shard pattern {pattern!r}: it needs both {{k}} and {{n}}, "
                               "e.g. part-{k}-of-{n}.h5.")
        return pattern
    output = Path(output)
    return f"{output.stem}.shard-{{k}}-of-{{n}}{output.suffix or '.h5'}"


def shard_path(output: Path | str, index: int, count: int, pattern: str | None = None) -> Path | str:
    """Where shard INDEX of COUNT of OUTPUT is written: a path beside a local OUTPUT, a URL beside one at a URL (as
    its Location joins it: `s3://b/run/out.shard-0-of-4.h5`, never a path "s3:/b/...")."""
    return Location.of(output).parent.join(shard_pattern(output, pattern).format(k=index, n=count)).native


def shard_count(output: Path, pattern: str | None = None) -> int:
    """N, from the names of OUTPUT's shard files (finished or partial); ShardProblem when there are none, or
    shards of different counts."""
    template = Path(shard_pattern(output, pattern))
    return the_count(shard_counts(output, pattern), str(output), template.name,
                     str(output.parent / template.parent))


def the_count(counts: set[int], output: str, looked_for: str, where: str) -> int:
    """The one N among COUNTS (the shard files' names found in WHERE); ShardProblem when there is none or more."""
    if not counts:
        raise ShardProblem(f"No shards of {output!r} found (looked for {looked_for} in {where!r}); run the sharded "
                           "extract first.")
    if len(counts) > 1:
        raise ShardProblem(f"Shards of {output!r} from runs with different shard counts ({sorted(counts)}) lie "
                           f"side by side in {where!r}; remove the ones of the other run.")
    return min(counts)


def shard_counts(output: Path, pattern: str | None = None) -> set[int]:
    """The N of every shard file of OUTPUT lying beside it (finished or partial)."""
    folder = output.parent / Path(shard_pattern(output, pattern)).parent
    return counts_among(os.listdir(folder) if folder.is_dir() else [], output, pattern)


def counts_among(names: list[str], output: Path, pattern: str | None = None) -> set[int]:
    """The N of every name in NAMES (of a folder, or of a store's prefix) that is a shard file of OUTPUT's."""
    pieces = re.split(r"(\{k\}|\{n\})", Path(shard_pattern(output, pattern)).name)
    name_regex = "".join({"{k}": r"(?P<k>\d+)", "{n}": r"(?P<n>\d+)"}.get(piece, re.escape(piece)) for piece in pieces)
    return {int(match["n"]) for name in names if (match := re.fullmatch(name_regex, name.removesuffix(".partial")))}
