"""Resources: the CPUs and memory this job was given, and how many loader workers fit in them."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from PIL import Image

log = logging.getLogger("featdump")


CPUS_VARIABLE = "FEATDUMP_CPUS"  # the CPUs a scheduler granted (a Ray task's; a pod's requests.cpu, its manifest)
CGROUP_ROOT = Path("/sys/fs/cgroup")


def job_cpus() -> tuple[int, str]:
    """How many CPUs this job was given, and by whom: SLURM_CPUS_PER_TASK, FEATDUMP_CPUS (set by a Ray task from its
    resources, by a pod's manifest from its request), else the fewer of this process's affinity mask and its
    cgroup's CPU quota (a container's limit: a pod on a 96-core node given 8)."""
    for variable in ("SLURM_CPUS_PER_TASK", CPUS_VARIABLE):
        given = os.environ.get(variable, "").strip()
        if given.isdigit() and int(given) > 0:
            return int(given), variable
    try:
        cpus, source = len(os.sched_getaffinity(0)), "the CPU affinity mask"
    except AttributeError:  # not Linux
        cpus, source = os.cpu_count() or 1, "os.cpu_count()"
    quota = cgroup_cpus()
    return (quota, "the cgroup's CPU quota (cpu.max)") if quota is not None and quota < cpus else (cpus, source)


def cgroup_cpus() -> int | None:
    """The CPUs this process's cgroup (v2) may use, from its cpu.max quota (rounded up), or None without one."""
    try:
        quota, period = (CGROUP_ROOT / _cgroup_path() / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def decode_bytes_per_worker() -> int:
    """The most memory one worker's decode can take: the largest image Pillow accepts (MAX_IMAGE_PIXELS), as
    RGB, held about three times over (decoded, rotated or converted, resized)."""
    return 3 * 3 * int(Image.MAX_IMAGE_PIXELS or 0)


def available_memory() -> int | None:
    """Bytes this job can still use: the smaller of MemAvailable and its cgroup's limit left (SLURM, containers)."""
    values = []
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    values.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        folder = CGROUP_ROOT / _cgroup_path()
        with open(folder / "memory.max") as limit, open(folder / "memory.current") as used:
            maximum = limit.read().strip()
            if maximum != "max":
                values.append(int(maximum) - int(used.read()))
    except (OSError, ValueError):
        pass
    return min(values) if values else None


def _cgroup_path() -> str:
    """This process's cgroup (v2) relative to the hierarchy's root: a SLURM job's or a container's."""
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            if line.startswith("0::"):
                return line[3:].strip().lstrip("/")
    return ""


def choose_workers(requested: int | None, batches: int | None = None) -> int:
    """REQUESTED loader workers, or (None) the job's CPUs less one for the main process, at least one; either
    way checked against memory: an automatic count is lowered to fit, an explicit one is warned about. A job of
    one batch (BATCHES left) gets none unless asked: a worker decodes a whole batch, so it could overlap no forward
    pass, and its start (a fork of this process) would cost more than it saves."""
    if requested is None and batches is not None and batches <= 1:
        log.debug("Decoding the job's one batch in the main process: a loader worker would only add its start.")
        return 0
    if requested is None:
        cpus, source = job_cpus()
        workers = max(1, cpus - 1)
        log.debug("Using %d loader workers: %d CPUs (%s), one left to the main process.", workers, cpus, source)
    else:
        workers = requested
    free, per_worker = available_memory(), decode_bytes_per_worker()
    if workers and free is not None and per_worker and workers * per_worker > free:
        fitting = max(1, free // per_worker)
        if requested is None:
            log.info("Using %d loader workers instead of %d: one decode of the largest image Pillow accepts can "
                     "take %.1f GB, and %.1f GB is available.", fitting, workers, per_worker / 1e9, free / 1e9)
            return fitting
        log.warning("%d loader workers could each take %.1f GB decoding the largest image Pillow accepts, and only "
                    "%.1f GB is available: lower -j to %d to be safe from the OOM killer.",
                    workers, per_worker / 1e9, free / 1e9, fitting)
    return workers
