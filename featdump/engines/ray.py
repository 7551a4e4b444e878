"""Ray (`featdump extract --ray [ADDRESS] --shards N`, extra `featdump[ray]`): one Ray task per shard, each running the
same `job.staging.extract` a process runs under `--shard K/N`, asking for a GPU when the device is CUDA and for CPUs
otherwise. A task runs with the driver's store variables and fsspec's configuration (`store_environment`), whatever
its node's environment holds. A task whose worker dies is retried by Ray, and one whose store stays away after
answering (StoreUnavailable, exit 75) too, but not one whose store never answered it (its configuration); either
resumes its shard's partial file, or starts it again on another node's scratch. More shards than workers is the
normal case: a slow or lost node delays only its own shards. The driver counts the rows done over all shards (a
small actor the tasks report to) into the caller's progress, logs each shard as it finishes, and merges the shards
at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass

from featdump.engines.placement import PlacementWatch, Unplaceable, in_words, node_resources, task_resources
from featdump.errors import FeatdumpError, StoreUnavailable, UsageProblem
from featdump.inputs.stores import Patience
from featdump.job.settings import Settings
from featdump.job.shards import SOURCE_VARIABLE
from featdump.output import fingerprint as fingerprints
from featdump.output.places import merge_at, place_of
from featdump.progress import NoProgress, Progress

log = logging.getLogger("featdump")
RETRIES = 3  # tries of a shard after the first, whether its worker died or its store stayed away
SHARDS_PER_SLOT = 4  # the default shard count: this many per task the cluster runs at once
_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class RaySummary:
    """What a Ray job did: its shards, their rows, the time, where the merged output is."""

    output: object
    shards: int
    rows: int
    new_rows: int
    seconds: float
    retried: int

    merged: bool = True  # False: the shards were left where they lie (--no-merge)
    done_before: bool = False  # the output was finished by this same command before: nothing ran, nothing merged

    def line(self) -> str:
        rate = self.new_rows / self.seconds if self.seconds > 0 else 0.0
        retried = f", {self.retried} retried" if self.retried else ""
        if self.done_before:
            return (f"Ray: {self.output} is finished already ({self.rows} rows), made by this same command: nothing "
                    "to do.")
        where = f"merged into {self.output}" if self.merged else (
            f"the shards left where they lie, beside {self.output}: `featdump merge {self.output}` joins them (on a "
            "file system `featdump merge --view` without copying a row)")
        return (f"Ray: {self.shards} shards ({self.rows} rows, {self.new_rows} new) in {self.seconds:.1f} s "
                f"({rate:.1f} rows/s{retried}); {where}.")


def extract_on_ray(settings: Settings, shards: int | None = None, address: str | None = None,
                   progress: Progress | None = None, merge_shards: bool = True) -> RaySummary:
    """Run SETTINGS as SHARDS Ray tasks on the cluster at ADDRESS (None: RAY_ADDRESS, else a local cluster made
    for the job), then merge the shards into SETTINGS' output (MERGE_SHARDS: else they stay where they lie)."""
    if settings.shard not in (None, "none"):
        raise UsageProblem("--ray splits the job into --shards N itself: drop --shard.")
    ray = _ray()
    if not sys.stderr.isatty():  # a log file under cron or a scheduler: Ray's raylet lines without colour codes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    started = time.perf_counter()
    ours = not ray.is_initialized()  # a local cluster this job starts, and stops at its end
    ray.init(address=address or os.environ.get("RAY_ADDRESS") or None, ignore_reinit_error=True,
             log_to_driver=False)
    try:
        return _run(ray, settings, shards, progress or NoProgress(), started, merge_shards)
    finally:
        if ours:
            ray.shutdown()


def _run(ray, settings: Settings, shards: int | None, progress: Progress, started: float,
         merge_shards: bool = True) -> RaySummary:
    resources = _task_resources(ray, settings)
    count = shards or SHARDS_PER_SLOT * _slots(ray, resources)
    place_of(settings.output).check_writable(Patience(settings.store_patience))  # before any task runs
    if not (settings.overwrite or settings.update):
        finished = _merged_already(settings, count)
        if finished is not None:
            return RaySummary(settings.output, count, finished, 0, time.perf_counter() - started, 0,
                              done_before=True)
    board = ray.remote(_Board).options(num_cpus=0).remote()
    task = ray.remote(_run_shard).options(max_retries=RETRIES, retry_exceptions=[StoreUnavailable],
                                          runtime_env={"env_vars": store_environment()}, **resources)
    log.info("Ray: %d shards of %s, each a task asking for %s.", count, settings.output, in_words(resources))
    pending = {task.remote(dataclasses.replace(settings, shard=f"{index}/{count}"), board, index): index
               for index in range(count)}
    from featdump.job import plan  # torch, imported here while the workers start (not before they are asked)

    progress.start(len(plan.job_rows(settings)), 0, "row")
    rows = _wait_for(ray, pending, board, progress, count, PlacementWatch(resources))
    progress.close()
    retried = ray.get(board.retried.remote())
    if not merge_shards:
        return RaySummary(settings.output, count, rows[0], rows[1], time.perf_counter() - started, retried, False)
    merged = _merge(settings)
    return RaySummary(merged, count, rows[0], rows[1], time.perf_counter() - started, retried)


STORE_VARIABLES = ("AWS_", "GOOGLE_", "GCS_", "FSSPEC_", "HF_", "AZURE_", "FEATDUMP_")  # what a task needs to reach
# each node's or task's own: its granted CPUs, its local scratch disk (which need not exist on another node), its memory
_NOT_PASSED = ("FEATDUMP_CPUS", "FEATDUMP_SCRATCH", "FEATDUMP_PCA_MEMORY_GB")


def store_environment() -> dict[str, str]:
    """What the driver's environment says of the stores (credentials, endpoints, featdump's settings) and fsspec's
    configuration (as FSSPEC_<PROTOCOL> JSON, which fsspec reads on the worker): a task runs with it whatever its
    node's environment holds, as the driver's own listing did."""
    passed = {key: value for key, value in os.environ.items()
              if key.startswith(STORE_VARIABLES) and key not in _NOT_PASSED}
    try:
        import fsspec.config

        for protocol, options in fsspec.config.conf.items():
            try:
                passed.setdefault(f"FSSPEC_{protocol.upper()}", json.dumps(options))
            except TypeError:  # an option that is not JSON (an object in a config file) stays the node's
                log.debug("fsspec's %s options are not JSON: not passed to the tasks.", protocol)
    except ImportError:
        pass
    return passed


def _ray():
    try:
        import ray
    except ImportError as error:
        raise UsageProblem("--ray needs the package ray, which is not installed: pip install 'featdump[ray]'.") \
            from error
    return ray


def _task_resources(ray, settings: Settings) -> dict:
    """What one shard's task asks for, from the cluster's live nodes (`placement.task_resources`)."""
    return task_resources(node_resources(ray), settings.device, settings.num_workers)


def _slots(ray, resources: dict) -> int:
    """How many shard tasks the cluster runs at once: on each node, as many as its CPUs and GPUs hold."""
    return max(1, sum(min(int(node.get("GPU" if key == "num_gpus" else "CPU", 0) // value)
                          for key, value in resources.items()) for node in node_resources(ray)))


def _wait_for(ray, pending: dict, board, progress: Progress, count: int,
              watch: PlacementWatch) -> tuple[int, int]:
    """Wait for every shard task, passing the rows done on to PROGRESS and logging each shard done; the first
    shard that fails for good stops the others and raises its error, and so does WATCH when no task can be placed.
    Returns (rows in all shards, new rows)."""
    shown, shown_found, rows, new = 0, 0, 0, 0
    while pending:
        try:
            if not watch.settled:
                watch.check(ray, started=len(pending) < count or ray.get(board.started.remote()) > 0)
        except Unplaceable:
            _cancel(ray, pending)
            raise
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_POLL_SECONDS)
        for ref in done:
            index = pending.pop(ref)
            try:
                summary = ray.get(ref)
            except ray.exceptions.RayTaskError as error:
                _cancel(ray, pending)
                cause = error.cause if isinstance(error.cause, FeatdumpError) else None
                raise cause or FeatdumpError(f"Shard {index} of {count} failed on Ray: {error}") from error
            except ray.exceptions.RayError as error:  # its worker died RETRIES + 1 times, or Ray gave up
                _cancel(ray, pending)
                raise FeatdumpError(f"Shard {index} of {count} failed on Ray after {RETRIES} retries "
                                    f"({type(error).__name__}); run the same command again to resume.") from error
            rows, new = rows + summary["rows"], new + summary["new"]
            board.finish.remote(index, summary["images"])  # a shard found finished counts too
            log.info("Shard %d of %d finished (%d rows); %d of %d shards done.", index, count, summary["rows"],
                     count - len(pending), count)
        (now, found), notes = ray.get([board.rows.remote(), board.said.remote()])
        for index, message in notes:
            log.warning("Shard %d: %s", index, message)
        progress.found(found - shown_found)
        progress.advance(now - shown)
        shown, shown_found = now, found
    return rows, new


def _cancel(ray, pending: dict) -> None:
    for ref in pending:
        ray.cancel(ref, force=True)


@contextlib.contextmanager
def _shards_said_as(source: str):
    """Within: a shard's log line says SOURCE made it (the variable put back after)."""
    before = os.environ.get(SOURCE_VARIABLE)
    os.environ[SOURCE_VARIABLE] = source
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SOURCE_VARIABLE, None)
        else:
            os.environ[SOURCE_VARIABLE] = before


def _merged_already(settings: Settings, count: int) -> int | None:
    """The rows of the job's merged output when it is finished and made by this same command (judged as one
    process judges its output; another command's is refused, OutputExists), at once: no shard is read or merged
    again. None when there is none yet, or it names pca:K layers (their shards judge them)."""
    from featdump.job import runner, updating  # torch, as in _run

    output = settings.output
    found = place_of(output).finished(Patience(settings.store_patience))
    if found is None:
        return None
    with _shards_said_as("--ray --shards"):  # the driver's plan of a shard: not the user's --shard
        expected = runner.fingerprint_of(dataclasses.replace(settings, shard=f"0/{count}"))
    if expected is None:
        return None
    updating.judge_finished(str(output), fingerprints.merged_held(found.fingerprint), found.complete,
                            fingerprints.of_merged(expected))
    log.info("Ray: %s is merged already, made by this same command: nothing to do (--update adds, --overwrite "
             "makes it again).", output)
    return found.committed.rows


def _merge(settings: Settings):
    return merge_at(settings.output, settings.shard_pattern, overwrite=settings.overwrite, scratch=settings.scratch,
                    patience=Patience(settings.store_patience))[0]


def _run_shard(settings: Settings, board, index: int) -> dict:
    """One shard's task on a Ray worker: the process's run of SETTINGS (its --shard set), reporting to BOARD."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")  # botocore's
    # lines named botocore, featdump's featdump
    from featdump.job import staging, warm  # torch, which the driver need not import before the tasks start

    size_by_grant()
    os.environ[SOURCE_VARIABLE] = "--ray's task"  # the shard's log line names Ray, not --shard

    told = _ToldToBoard(board, index)
    logging.getLogger("featdump").addHandler(told)  # a store's wait, said where the job is watched
    try:
        with warm.kept_warm():  # the worker's next shard of this job reuses its rows, model and probe
            summary = staging.extract(settings, _BoardProgress(board, index))
    finally:
        logging.getLogger("featdump").removeHandler(told)
    return {"rows": summary.rows, "new": summary.new_rows if summary.processed else 0,
            "images": summary.rows + summary.skipped}


def size_by_grant() -> None:
    """In a task: its loader workers sized by the CPUs Ray granted it (FEATDUMP_CPUS), not by its node's."""
    from featdump.inputs.workers import CPUS_VARIABLE

    granted = _ray().get_runtime_context().get_assigned_resources().get("CPU")
    if granted:
        os.environ[CPUS_VARIABLE] = str(max(1, int(granted)))


class _ToldToBoard(logging.Handler):
    """A task's warnings (a store's waits, a lowered worker count) passed to the board, for the driver's log."""

    def __init__(self, board, index: int):
        super().__init__(logging.WARNING)
        self.board, self.index = board, index

    def emit(self, record: logging.LogRecord) -> None:
        self.board.note.remote(self.index, record.getMessage())


class _Board:
    """A Ray actor: the rows each shard has done in this job, apart from those it found done (its file finished
    before, or the rows a retried shard resumes at), which the driver's rate leaves out."""

    def __init__(self):
        self.done: dict[int, int] = {}
        self.found: dict[int, int] = {}
        self.tries: dict[int, int] = {}
        self.notes: list[tuple[int, str]] = []  # warnings the tasks said, not yet read by the driver

    def note(self, index: int, message: str) -> None:
        self.notes.append((index, message))

    def said(self) -> list[tuple[int, str]]:
        """The tasks' warnings since the last call."""
        notes, self.notes = self.notes, []
        return notes

    def start(self, index: int, done: int) -> None:
        self.found[index], self.done[index] = done, 0
        self.tries[index] = self.tries.get(index, 0) + 1

    def advance(self, index: int, rows: int) -> None:
        self.done[index] = self.done.get(index, 0) + rows

    def finish(self, index: int, images: int) -> None:
        """Shard INDEX is finished with IMAGES rows (a shard found finished never started: all of them found)."""
        self.found[index] = images - self.done.get(index, 0)

    def rows(self) -> tuple[int, int]:
        """(rows done by this job's tasks, rows found done)."""
        return sum(self.done.values()), sum(self.found.values())

    def started(self) -> int:
        """How many shards have started (on any try)."""
        return len(self.tries)

    def retried(self) -> int:
        return sum(1 for tries in self.tries.values() if tries > 1)


class _BoardProgress:
    """A shard task's progress, told to the board (no reply awaited)."""

    def __init__(self, board, index: int):
        self.board, self.index = board, index

    def start(self, total: int, done: int, noun: str = "image") -> None:
        self.board.start.remote(self.index, done)

    def advance(self, images: int) -> None:
        self.board.advance.remote(self.index, images)

    def found(self, rows: int) -> None:
        pass  # a task's rows found done are told by its start

    def close(self) -> None:
        pass
