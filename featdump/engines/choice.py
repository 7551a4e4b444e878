"""Where a job runs, as its command asks: in this process (`job.staging`: a local output, or one at a URL through
scratch), or fanned out over a Ray cluster (`engines.ray`). The options of one make no sense with the other."""

from __future__ import annotations

from featdump.errors import UsageProblem
from featdump.job.preflight import check_before_loading


def run_extract(settings, progress, ray_address: str | None = None, shards: int | None = None, merge: bool = True):
    """Run SETTINGS here, or on the Ray cluster at RAY_ADDRESS ("auto": RAY_ADDRESS's, or a local one) in SHARDS
    tasks, merged at the end unless not MERGE; the run's summary."""
    if ray_address is None and shards is not None:
        raise UsageProblem("--shards N splits a --ray job; a process of a SLURM array or a pod takes --shard K/N.")
    if ray_address is None and not merge:
        raise UsageProblem("--no-merge leaves a --ray job's shards unmerged; without --ray there is one output (or, "
                           "under --shard K/N, one shard) and nothing to merge.")
    check_before_loading(settings)
    if ray_address is not None:
        from featdump.engines.ray import extract_on_ray

        return extract_on_ray(settings, shards, None if ray_address == "auto" else ray_address, progress, merge)
    from featdump.job.staging import extract  # torch: not before a Ray job's tasks start

    return extract(settings, progress)
