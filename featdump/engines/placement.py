"""Where a Ray job's shard tasks can run: what one task asks for (a GPU and its node's share of CPUs, or CPUs), a
refusal at once when no live node can run it, and a watch while the tasks wait to start: when none has started
within a minute and no live node can run one any more (its GPU node gone, a smaller cluster than at submission),
the job stops naming what a task asks and what the nodes offer, where Ray would leave it waiting forever; when the
nodes could run it but are busy (a shared cluster), a warning says so once a minute and the job waits."""

from __future__ import annotations

import logging
import time

from featdump.errors import FeatdumpError, UsageProblem

log = logging.getLogger("featdump")
PLACEMENT_GRACE = 60.0  # seconds the first task may wait to start before the cluster is looked at again


class Unplaceable(FeatdumpError):
    """No live node of the Ray cluster can run a shard's task any more (exit 1): the cluster changed after the
    job was submitted; the shards done so far stay."""


def node_resources(ray) -> list[dict]:
    """Each live node's resources (CPU, GPU, ...), as Ray counts them."""
    return [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive", True)]


def task_resources(nodes: list[dict], device: str, num_workers: int | None) -> dict:
    """What one shard's task asks for on a cluster of NODES (each node's resources): on a CUDA device (or auto on
    a cluster that has GPUs) a GPU and its node's share of CPUs (the fewest CPUs a GPU among the nodes that have
    GPUs: a CPU-only head counts for nothing), or the loader workers asked for and the main process; else CPUs:
    the workers asked for and the main process, or one. UsageProblem at once, naming what a task asks and what the
    nodes offer, when no node can run one (Ray would leave it waiting forever)."""
    gpu_nodes = [node for node in nodes if node.get("GPU", 0) >= 1]
    if device.startswith("cuda") or (device == "auto" and gpu_nodes):
        if not gpu_nodes:
            raise UsageProblem(f"--device {device}: the Ray cluster has no GPU ({offered(nodes)}).")
        share = num_workers + 1 if num_workers is not None else \
            max(1, min(int(node.get("CPU", 0) // node["GPU"]) for node in gpu_nodes))
        asked = {"num_gpus": 1, "num_cpus": share}
    else:
        asked = {"num_cpus": (num_workers or 0) + 1}
    if not any(fits(asked, node) for node in nodes):
        raise UsageProblem(f"No node of the Ray cluster can run a shard's task, which asks for {in_words(asked)}: "
                           f"{offered(nodes)}. Ask for fewer loader workers (-j), or add a node that has them.")
    return asked


def fits(asked: dict, node: dict) -> bool:
    return node.get("CPU", 0) >= asked.get("num_cpus", 0) and node.get("GPU", 0) >= asked.get("num_gpus", 0)


def in_words(asked: dict) -> str:
    """A task's resources as `1 gpus, 3 cpus`."""
    return ", ".join(f"{value} {key.removeprefix('num_')}" for key, value in asked.items())


def offered(nodes: list[dict]) -> str:
    """The nodes' CPUs and GPUs, in words."""
    return "the nodes have " + "; ".join(f"{node.get('CPU', 0):g} CPUs and {node.get('GPU', 0):g} GPUs"
                                         for node in nodes) if nodes else "the cluster has no live node"


class PlacementWatch:
    """Looks at the cluster while a job's tasks wait to start (`check`, on each of the driver's polls)."""

    def __init__(self, asked: dict, grace: float = PLACEMENT_GRACE):
        self.asked, self.grace = asked, grace
        self.since = self.said_at = time.monotonic()
        self.settled = False  # a task has started: the cluster can place them

    def check(self, ray, started: bool) -> None:
        """Nothing while a task has STARTED or within the grace; then Unplaceable when no live node can run a
        task, else a warning (once a grace) that the nodes are busy."""
        waited = time.monotonic() - self.since
        self.settled = started
        if started or waited < self.grace:
            return
        nodes = node_resources(ray)
        if not any(fits(self.asked, node) for node in nodes):
            raise Unplaceable(f"No shard has started in {waited:.0f} s and no live node of the Ray cluster can run "
                              f"one any more: a shard's task asks for {in_words(self.asked)}; {offered(nodes)}. "
                              "Add a node that has them (or ask for fewer loader workers, -j), then run the same "
                              "command again.")
        if time.monotonic() - self.said_at >= self.grace:
            self.said_at = time.monotonic()
            free = {key: value for key, value in ray.available_resources().items() if key in ("CPU", "GPU")}
            log.warning("No shard has started in %.0f s: a task asks for %s and the cluster has %s free now (other "
                        "jobs hold the rest); waiting.", waited, in_words(self.asked),
                        ", ".join(f"{value:g} {key}s" for key, value in sorted(free.items())) or "nothing")
