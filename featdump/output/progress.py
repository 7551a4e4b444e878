"""Progress record: a small JSON file beside the output, replaced atomically at every commit and removed at the
finish, so that `featdump info` can see how far a running job is without touching the HDF5 file it writes."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from featdump.output.space import human_bytes


def record_path(output: Path) -> Path:
    """OUT.progress.json for OUT (also when given OUT.partial)."""
    output = Path(output)
    name = output.name.removesuffix(".partial")
    return output.with_name(name + ".progress.json")


EVERY = 0.2  # seconds between two records


class ProgressRecord:
    """What a running job tells `info`: who runs it, since when, how far, how fast."""

    def __init__(self, output: Path, partial: Path, total: int, start: int, layers: dict[str, list[int]],
                 task: str | None = None, noun: str = "image"):
        self.path = record_path(output)
        self._partial = partial
        self._start = start
        self._started = time.time()
        self._written = 0.0
        self._static = {"state": "running", "pid": os.getpid(), "host": socket.gethostname(),
                        "started": self._started, "output": str(output), "file": str(partial), "image_count": total,
                        "resumed_from": start, "layers": layers, "noun": noun, **({"task": task} if task else {})}
        self.update(start, 0, 0)  # at once: `info` has numbers before the first commit

    @staticmethod
    def starting(output: Path) -> None:
        """The record of a job that holds OUTPUT's lock but is still loading its model and probing its layers."""
        _replace(record_path(output), {"state": "starting", "pid": os.getpid(), "host": socket.gethostname(),
                                       "started": time.time(), "updated": time.time(), "output": str(output),
                                       "file": str(output)})

    def update(self, images_done: int, rows: int, skipped: int) -> None:
        """Replace the record (write a temporary file, then rename it over the old one: readers see either);
        at most every EVERY seconds (about 0.3 ms each, on the writer's thread)."""
        now = time.time()
        if now - self._written < EVERY:
            return
        self._written = now
        rate = (images_done - self._start) / (now - self._started) if now > self._started else 0.0
        try:
            size = os.path.getsize(self._partial)
        except OSError:
            size = None
        _replace(self.path, {**self._static, "updated": now, "images_done": images_done, "rows": rows,
                             "skipped": skipped, "rate": rate, "size_bytes": size})

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _replace(path: Path, record: dict) -> None:
    """Write a temporary file, then rename it over the old record: readers see one or the other."""
    temporary = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(record))
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)  # advisory only: a full disk is reported by the writer itself


def remove_record(output: Path) -> None:
    record_path(output).unlink(missing_ok=True)


def read_record(output: Path) -> dict | None:
    """The last record of OUTPUT's job, or None when there is none (never ran, or finished)."""
    try:
        return json.loads(record_path(output).read_text())
    except (OSError, ValueError):
        return None


def describe_running(record: dict, running: bool) -> dict:
    """The record as `info` reports it: state, progress, rate, time left."""
    done, total = record.get("images_done", 0), record.get("image_count") or 0
    rate = record.get("rate") or 0.0
    left = (total - done) / rate if running and rate > 0 else None
    state = record.get("state", "running") if running else "stopped"
    return {"state": state, "pid": record.get("pid"), "host": record.get("host"),
            "since": record.get("started"), "updated": record.get("updated"), "images_done": done,
            "image_count": total, "rows": record.get("rows"), "skipped": record.get("skipped"), "rate": rate,
            "seconds_left": left, "layers": record.get("layers"), "size_bytes": record.get("size_bytes"),
            "file": record.get("file"), "task": record.get("task"), "noun": record.get("noun", "image")}


def running_lines(state: dict) -> list[str]:
    """Lines `info` prints for a job that is running (or starting)."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state["since"])) if state["since"] else "?"
    if state["state"] == "starting":
        return [f"file:       {state['file']}",
                f"starting:   pid {state['pid']} on {state['host'] or '?'} since {since} (loading the model, probing "
                "the layers, opening the output)"]
    done, total = state["images_done"], state["image_count"]
    percent = f" ({100.0 * done / total:.1f}%)" if total else ""
    left = f", about {_duration(state['seconds_left'])} left" if state["seconds_left"] is not None else ""
    lines = [f"file:       {state['file']}",
             f"running:    pid {state['pid']} on {state['host']} since {since}",
             *([f"task:       {state['task']}"] if state.get("task") else []),
             f"progress:   {done} of {total} {state.get('noun', 'image')}s{percent}, {state['skipped']} skipped, "
             f"{state['rate']:.1f} {'img' if state.get('noun', 'image') == 'image' else state['noun']}/s{left}"]
    lines.append("layers:")
    lines += [f"  {name}: {tuple(shape)}" for name, shape in (state["layers"] or {}).items()]
    if state["size_bytes"] is not None:
        lines.append(f"size:       {human_bytes(state['size_bytes'])} so far")
    return lines


def stopped_line(state: dict) -> str:
    """The line `info` prints for a job that died without finishing (its record is left, its lock is free)."""
    updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state["updated"])) if state["updated"] else "?"
    return (f"stopped:    the job (pid {state['pid']} on {state['host']}) is no longer writing it (killed or "
            f"crashed; last record {updated}); run the same command again to resume")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
