"""Merge shards that lie in a store: the N shards found by the store's listing (the count from their names, each
finished: only finished shards are uploaded), copied to local scratch one by one (never a shard in memory), joined
by `merge` into one self-contained file (a view needs its shards on a file system), and uploaded beside them."""

from __future__ import annotations

import logging
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from featdump.errors import ShardProblem
from featdump.inputs.stores import Patience
from featdump.locations import Location
from featdump.output import fingerprint as fingerprints
from featdump.output import remote
from featdump.output.merge import common_fingerprint, merge
from featdump.output.shard_files import counts_among, shard_path, shard_pattern, the_count

log = logging.getLogger("featdump")
_DOWNLOADS = 8  # shards copied at once


def store_shards(url: str, pattern: str | None, patience: Patience) -> tuple[int, list[str], list[int]]:
    """(N, the shards' URLs, the indices missing in the store) of the output at URL, from one listing."""
    name = Path(url.rstrip("/").rsplit("/", 1)[1])
    folder = str(Location.of(url).parent)
    names = remote.names_in_store(folder, patience)
    count = the_count(counts_among(names, name, pattern), url, shard_pattern(name, pattern), folder)
    shard_names = [shard_path(name, index, count, pattern).name for index in range(count)]
    present = set(names)
    return count, [remote.store_twin(Path(shard), url) for shard in shard_names], \
        [index for index, shard in enumerate(shard_names) if shard not in present]


def _merged_already(url: str, shards: list[str], count: int, patience: Patience) -> bool:
    """Whether the object at URL is the finished merge of these COUNT SHARDS (its fingerprint is theirs), read
    from attributes alone; a merge of other shards (made again, grown) is replaced by merging these."""
    if not remote.finished_in_store(url, patience):
        return False
    merged, first = remote.held_in_store(url, patience), remote.held_in_store(shards[0], patience).fingerprint
    held, complete = merged.fingerprint, merged.complete
    return complete and held.get("shards") == count and \
        not fingerprints.describe_differences(fingerprints.merged_held(held), fingerprints.of_merged(first))


def _check_made_alike(shards: list[str], patience: Patience) -> None:
    """ShardProblem when the SHARDS (URLs, each finished) were not made alike, from their attributes alone."""
    common_fingerprint(shards, [remote.held_in_store(shard, patience).fingerprint for shard in shards])


def store_merge_problem(url: str, pattern: str | None = None, patience: Patience | None = None) -> str | None:
    """Why merging the shards of URL would be refused (some not in the store, or not made alike), or None."""
    patience = patience or Patience()
    count, shards, missing = store_shards(url, pattern, patience)
    if missing:
        return f"{len(missing)} of {count} shards are not in the store"
    try:
        _check_made_alike(shards, patience)
    except ShardProblem as error:
        return str(error)
    return None


def merge_from_store(url: str, pattern: str | None = None, scratch: Path | None = None,
                     patience: Patience | None = None) -> str:
    """Merge the shards of the output at URL into URL (a self-contained copy); returns URL."""
    patience = patience or Patience()
    count, shards, missing = store_shards(url, pattern, patience)
    if missing:
        named = ", ".join(str(index) for index in missing[:20]) + (" ..." if len(missing) > 20 else "")
        raise ShardProblem(f"Cannot merge {url!r}: {len(missing)} of {count} shards are not in the store (shard "
                           f"{named}; a shard is uploaded when it is finished): run their tasks again.")
    _check_made_alike(shards, patience)  # before a byte is downloaded
    if _merged_already(url, shards, count, patience):
        log.info("%s is merged already from these %d shards: nothing to do.", url, count)
        return url
    twin = remote.scratch_twin(url, scratch)
    local = twin.parent / "merging" / twin.name  # apart from any shard this node is extracting
    log.info("Copying the %d shards of %s to %s to merge them there.", count, url, local.parent)
    with ThreadPoolExecutor(_DOWNLOADS) as pool:
        list(pool.map(lambda shard: remote.download(shard, local.parent / Path(shard).name, patience), shards))
    merged = merge(local, pattern, copy=True, overwrite=True)
    remote.upload(merged, url, patience)
    shutil.rmtree(local.parent, ignore_errors=True)
    return url
