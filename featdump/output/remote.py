"""Outputs at a URL (s3://, gs://, any fsspec store `inputs.stores` speaks): a run writes the file on local scratch
with every guarantee of a local run, and the upload of the finished file is its completion (a store shows an
object only once its upload is complete). Where the scratch copy lies, whether an output is finished in the store,
the upload and the download (each retried within --store-patience), and the names a store's folder holds."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import h5py

from featdump.errors import StoreRefused
from featdump.inputs.stores import Patience, endpoint, filesystem, store_path
from featdump.locations import Location
from featdump.output import fingerprint as fingerprints
from featdump.output.layout import Committed

log = logging.getLogger("featdump")
SCRATCH_VARIABLE = "FEATDUMP_SCRATCH"  # the default of --scratch (a node's local disk: $TMPDIR, /scratch, ...)


def default_scratch() -> Path:
    return Path(os.environ.get(SCRATCH_VARIABLE) or tempfile.gettempdir()) / "featdump-scratch"


def scratch_twin(url: str, scratch: Path | None = None) -> Path:
    """The local file an output at URL is written as: in a folder of SCRATCH named after URL's folder and the
    endpoint its requests go to, so that a retry of the same job finds its partial file again and two jobs never
    share one (the same bucket path in two stores included)."""
    folder = str(Location.of(url).parent)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", Location.of(folder).bare)[-60:].strip("_")
    digest = hashlib.sha256(f"{endpoint(url)}\n{folder}".encode()).hexdigest()[:12]
    return Path(scratch or default_scratch()).expanduser() / f"{readable}-{digest}" / url.rstrip("/").rsplit("/", 1)[1]


def store_twin(local: Path, url: str) -> str:
    """The URL of LOCAL (a file beside URL's scratch twin: the output or one of its shards) in URL's folder."""
    return str(Location.of(str(Location.of(url).parent)).join(Path(local).name))


def _fresh(url: str, patience: Patience):
    fs = filesystem(url, patience)
    fs.invalidate_cache()  # another process may have written since this one listed
    return fs


def finished_in_store(url: str, patience: Patience) -> bool:
    """Whether the object URL exists: an output there is finished (only a finished file is uploaded)."""
    return patience.call(lambda: _fresh(url, patience).exists(store_path(url)), f"Looking for {url}")


def names_in_store(folder: str, patience: Patience) -> list[str]:
    """The names of the objects directly in the store folder FOLDER (a URL); [] when it holds none."""
    def listing() -> list[str]:
        try:
            found = _fresh(folder, patience).ls(store_path(folder), detail=False)
        except FileNotFoundError:
            return []
        return sorted(path.rstrip("/").rsplit("/", 1)[-1] for path in found)

    return patience.call(listing, f"Listing {folder}")


@dataclass(frozen=True)
class Held:
    """What a finished output in a store holds, read from its attributes alone: its fingerprint, whether it is
    complete, its commit counters, and its size."""

    fingerprint: dict
    complete: bool
    committed: Committed
    size: int


def held_in_store(url: str, patience: Patience) -> Held:
    """The finished output at URL as `Held` says it, read through the store (a few KiB, nothing downloaded): for
    the judgement a local output gets (`job.updating.judge_finished`) and for `info`."""
    def read() -> Held:
        fs = _fresh(url, patience)
        with fs.open(store_path(url), "rb") as handle, h5py.File(handle, "r") as h5file:
            return Held(fingerprints.stored(h5file.attrs), bool(h5file.attrs.get("complete", False)),
                        Committed.of(h5file), fs.size(store_path(url)))

    return patience.call(read, f"Reading {url}")


def check_writable(url: str, patience: Patience) -> None:
    """StoreRefused, before any work, when the store will not take the output at URL (its bucket missing, writing
    refused): an empty object is written beside it and removed again."""
    probe = str(Location.of(str(Location.of(url).parent)).join(f".featdump-write-check-{uuid.uuid4().hex}"))

    def attempt() -> None:
        fs = _fresh(url, patience)
        fs.pipe_file(store_path(probe), b"")
        try:
            fs.rm_file(store_path(probe))
        except (PermissionError, OSError) as error:  # may write, may not delete: the output can still be written
            log.debug("Could not remove %s (%s).", probe, error)

    try:
        patience.call(attempt, f"Writing beside {url}")
    except StoreRefused as error:
        raise StoreRefused(f"{error} OUTPUT {url} cannot be written there: create the bucket or give credentials "
                           "that may write to it (nothing was computed).") from error


def upload(local: Path, url: str, patience: Patience) -> None:
    """LOCAL put at URL as one object and its size checked. Uploading the same file again (a retry after a late
    success) writes the same bytes: the store keeps one object, whole."""
    size = Path(local).stat().st_size

    def put() -> None:
        fs = _fresh(url, patience)
        fs.put_file(str(local), store_path(url))
        stored = fs.info(store_path(url))["size"]
        if stored != size:
            raise ConnectionError(f"the store holds {stored} bytes after the upload of {size}")  # retried

    log.info("Uploading %s (%d bytes) to %s.", local, size, url)
    patience.call(put, f"Uploading {local} to {url}")


def download(url: str, local: Path, patience: Patience) -> Path:
    """The object URL copied to LOCAL (through LOCAL.download, renamed when whole); the local copy is kept when it
    already has the object's size."""
    local = Path(local)
    fs = filesystem(url, patience)

    def get() -> Path:
        size = fs.info(store_path(url))["size"]
        if local.exists() and local.stat().st_size == size:
            return local
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(local.name + ".download")
        fs.get_file(store_path(url), str(part))
        os.replace(part, local)
        return local

    return patience.call(get, f"Downloading {url}")
