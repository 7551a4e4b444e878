"""Where a run writes: OUTPUT itself, or, for an OUTPUT at a URL, its scratch twin (`output.remote`) made by the
same run with every guarantee of a local one and uploaded when it is finished. The upload is the run's completion:
a run whose file (its shard's, under sharding) is in the store already exits 0 at once; a run killed before its
upload starts again, resuming the partial file it finds on its scratch. This is the one entry to a run that the
faces and the engines call."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from featdump.errors import UsageProblem
from featdump.inputs.stores import Patience
from featdump.job import runner, updating
from featdump.job.report import Summary
from featdump.job.settings import Settings
from featdump.job.shards import choose_shard
from featdump.output import remote
from featdump.output.layout import partial_path
from featdump.output.places import place_of
from featdump.output.remote import Held
from featdump.progress import NoProgress, Progress

log = logging.getLogger("featdump")


def extract(settings: Settings, progress: Progress | None = None) -> Summary:
    """Run SETTINGS (`runner.extract`), through local scratch when its OUTPUT's place has a scratch twin (it lies
    in a store)."""
    local_output = place_of(settings.output).scratch_twin(settings.scratch)
    if local_output is None:
        return runner.extract(settings, progress)
    return _extract_to_store(settings, local_output, progress or NoProgress())


def _extract_to_store(settings: Settings, local_output: Path, progress: Progress) -> Summary:
    started = time.perf_counter()
    patience = Patience(settings.store_patience)
    local_output.parent.mkdir(parents=True, exist_ok=True)
    shard = choose_shard(settings.shard)
    if shard is not None and shard.local_rank is not None:
        raise UsageProblem(f"OUTPUT {settings.output} is a URL: under torchrun the ranks cannot merge it; run each "
                           "shard with --shard K/N (or --ray), then `featdump merge URL`.")
    local = shard.path(local_output, settings.shard_pattern) if shard else local_output
    target = place_of(remote.store_twin(local, settings.output))
    on_scratch = dataclasses.replace(settings, output=local_output)
    downloaded = None
    held = None if settings.overwrite else target.finished(patience)
    if held is not None:
        expected = None if settings.update else runner.fingerprint_of(on_scratch)
        if expected is not None:  # judged as a local output is, from the object's attributes alone
            updating.judge_finished(target.url, held.fingerprint, held.complete, expected)
            return _in_store(target.url, held, time.perf_counter() - started)
        if not local.exists():  # --update (its rows stay; it adds to them), or pca:K layers: judged on scratch
            remote.download(target.url, local, patience)
        downloaded = local.stat().st_mtime_ns
    if downloaded is None:
        target.check_writable(patience)  # a missing bucket is found now, not after the whole run
    _say_where(local, target.url)
    summary = runner.extract(on_scratch, progress)
    if downloaded is None or local.stat().st_mtime_ns != downloaded:  # unchanged: the store holds it already
        remote.upload(local, target.url, patience)
    local.unlink()  # the store holds it now; the scratch is free for the next shard
    return dataclasses.replace(summary, output=target.url, seconds=time.perf_counter() - started)


def _say_where(local: Path, target: str) -> None:
    resumed = " (resuming the partial file found there)" if partial_path(local).exists() else ""
    log.info("Writing %s on scratch as %s%s; it is uploaded when finished.", target, local, resumed)


def _in_store(url: str, held: Held, seconds: float) -> Summary:
    """The summary of the finished output at URL, from its counters HELD."""
    return Summary(url, held.committed.rows, held.committed.skipped, 0, 0, seconds, held.size)
