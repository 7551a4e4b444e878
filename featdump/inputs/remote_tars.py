"""Remote tars: webdataset tar shards in an object store or on a web server: a tar URL, a brace pattern of them
(`s3://bucket/train-{000000..000099}.tar`), several patterns joined with `::`, or a list file of tar URLs.

When the job lists them, each tar's headers are read in one sequential pass of large blocks (several tars at a
time), and kept in the user's cache by the tar's URL and what the store says identifies its bytes (ETag or
checksum, size, modification time: S3's, or a web server's Last-Modified); a resume or an --update then reads only
the headers of tars it has not seen, after checking the first and last 64 KiB of each (two small ranged reads)
against those the index was made from, so that a tar rebuilt to the same size is read anew.

A loader worker then fetches the members of its batch that lie in one tar with one ranged request spanning them,
and the tars of a batch concurrently: a tar costs one request per batch, never one per member (a web server that
ignores Range sends whole tars, which are cut as they come, with a warning). Rows, labels, damage and shards by
whole tars are those of local tars (`inputs.tars`)."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from featdump.caches import user_cache
from featdump.errors import NoImages, UsageProblem
from featdump.inputs.imagelist import Encoded, ImageList, content_digest
from featdump.inputs.objects import object_identity, only_image, video_where_it_lies
from featdump.inputs.stores import Patience, describe, fetch_all, fetch_as_ready, filesystem, store_path
from featdump.inputs.tar_scan import DamagedTar, TarScan, scan_tar_file
from featdump.inputs.tars import TarMembers, TarShard, tar_image_list
from featdump.inputs.video import is_video_name

PATTERN_SEPARATOR = "::"
_INDEX_BLOCK = 32 << 20  # bytes per request while a tar's headers are read
_INDEXING_AT_ONCE = 8
_CHECKED = 64 << 10  # bytes at each end of a tar compared before its kept index is trusted
log = logging.getLogger("featdump")


def read_remote_tars(urls: Sequence[str], patience: Patience) -> ImageList:
    """The samples of the tars at URLS, in order (paths TAR/MEMBER relative to their common prefix)."""
    root = os.path.commonprefix([url.rsplit("/", 1)[0] + "/" for url in urls]).rsplit("/", 1)[0]
    started = time.perf_counter()
    log.info("Listing %d tars (the headers of those not seen before are read once, %d at a time) ...", len(urls),
             _INDEXING_AT_ONCE)
    with concurrent.futures.ThreadPoolExecutor(_INDEXING_AT_ONCE) as pool:
        found = list(pool.map(lambda url: _index(url, patience), urls))
    missing = [url for url, (shard, _) in zip(urls, found) if shard is None]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise NoImages(f"{len(missing)} of the {len(urls)} tar URLs are missing: {shown}. Nothing was read.")
    shards = [dataclasses.replace(shard, name=url[len(root) + 1:]) for url, (shard, _) in zip(urls, found)]
    log.info("Listed %d tars in %.1f s.", len(urls), time.perf_counter() - started)
    storage = functools.partial(RemoteTarMembers, patience=patience)
    return tar_image_list(root, shards, [scan for _, scan in found], urls[0], storage)


def _index(url: str, patience: Patience) -> tuple[TarShard | None, TarScan | None]:
    """URL's identity and its headers (None, None when it is missing); a transient fault restarts the pass."""
    fs = filesystem(url, patience)
    try:
        details = patience.call(lambda: fs.info(store_path(url)), f"Reading {url}")
    except FileNotFoundError:
        return None, None
    size, mtime, _ = object_identity(details)

    def scan() -> tuple[TarScan, str]:
        with fs.open(store_path(url), "rb", block_size=_INDEX_BLOCK, cache_type="readahead") as handle:
            found = scan_tar_file(handle, size)
            return found, _fingerprint([_read_at(handle, start, end) for start, end in _ends(size)])

    shard = TarShard(PurePosixPath(url).name, size, mtime)
    cached = _index_file(url, details)
    known, ends = _read_index(cached)
    if known is not None and ends == _ends_now(url, size, patience):
        return shard, known
    try:
        scanned, ends = patience.call(_ranges_needed(url, scan), f"Reading the headers of {url}")
    except OSError as error:
        return shard, TarScan(damage=(0, f"cannot be read ({describe(error)})"))
    _write_index(cached, scanned, ends)
    return shard, scanned


def _ranges_needed(url: str, scan):
    """SCAN, a server's refusal of ranged reads (fsspec's ValueError past the first block) made one line."""
    def scanned():
        try:
            return scan()
        except ValueError as error:
            if "range requests" not in str(error):
                raise
            raise UsageProblem(f"{url}: the web server ignores Range requests, so a tar over "
                               f"{_INDEX_BLOCK >> 20} MiB cannot be read in parts. Serve the tars from a server "
                               "that supports Range (nginx, Apache, an object store), or copy them here.") from error
    return scanned


# -- a kept index checked against the tar's bytes, and a server that ignores Range --------------------------


def _ends(size: int) -> list[tuple[int, int]]:
    """The byte ranges compared before a kept index is trusted: a tar's first and last 64 KiB."""
    return [(0, min(size, _CHECKED)), (max(0, size - _CHECKED), size)]


def _fingerprint(pieces: Sequence[bytes]) -> str:
    return hashlib.sha256(b"".join(pieces)).hexdigest()


def _read_at(handle, start: int, end: int) -> bytes:
    handle.seek(start)
    return handle.read(end - start)


def _ends_now(url: str, size: int, patience: Patience) -> str | None:
    """The fingerprint of the tar's ends as the store serves them now (None when they cannot be read)."""
    ranges = _ends(size)
    found = fetch_all([url] * len(ranges), patience, ranges)
    if any(isinstance(data, BaseException) for data in found):
        return None
    return _fingerprint([_within(data, start, end, size, url) for data, (start, end) in zip(found, ranges)])


@functools.cache
def _warn_whole(url_root: str) -> None:
    log.warning("The web server at %s ignores Range requests: each batch reads whole tars.", url_root)


def _within(data: bytes, start: int, end: int, size: int, url: str) -> bytes:
    """The bytes [START, END) of a tar of SIZE bytes from a ranged request's answer DATA, which is the whole tar
    when the server ignored the Range header (Python's http.server and some others do)."""
    if len(data) != end - start and len(data) == size:
        _warn_whole(url.rsplit("/", 1)[0])
        return data[start:end]
    return data


# -- the headers read once: kept in the user's cache, by the tar's URL and identity ----------------------------


def _index_file(url: str, details: dict) -> Path:
    """Where the headers of the tar at URL, as it is now (ETag or checksum, size, modification time), are kept:
    $XDG_CACHE_HOME/featdump/tar-index (default ~/.cache/featdump/tar-index)."""
    size, mtime, etag = object_identity(details)
    key = hashlib.sha256(f"{url}\0{size}\0{mtime}\0{etag}".encode("utf-8", "surrogateescape")).hexdigest()
    return user_cache("tar-index", f"{key}.json")


def _read_index(path: Path) -> tuple[TarScan | None, str | None]:
    """The kept index at PATH and the fingerprint of the tar's ends it was made from; (None, None) if none."""
    try:
        kept = json.loads(path.read_text())
        return (TarScan([tuple(image) for image in kept["images"]], tuple(kept["damage"]) if kept["damage"] else None,
                        collections.Counter(kept["ignored"]), kept["without_image"]), kept["ends"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def _write_index(path: Path, scan: TarScan, ends: str) -> None:
    """Keep SCAN for the next run (a resume, an --update); a cache that cannot be written is skipped."""
    kept = {"images": scan.images, "damage": scan.damage, "ignored": dict(scan.ignored),
            "without_image": scan.without_image, "ends": ends}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(kept))
        os.replace(temporary, path)


@dataclass(frozen=True)
class RemoteTarMembers(TarMembers):
    """The members of tars at URLs: a batch's members of one tar are fetched with one ranged request."""

    patience: Patience = field(default_factory=Patience)

    def open(self, root: str, relative: str, position: int) -> Encoded:
        return only_image(self.open_as_ready(root, [relative], [position]))

    def open_as_ready(self, root: str, relatives: Sequence[str],
                      positions: Sequence[int]) -> Iterator[tuple[int, Encoded | Exception]]:
        """The members of each tar as its span arrives: one ranged request per tar of the batch, all at once."""
        spans: dict[int, list[int]] = {}  # tar -> indices into positions
        for index, position in enumerate(positions):
            tar = int(self.tar[position])
            if self.size[position] < 0:
                yield index, DamagedTar(self.damage[(tar, int(self.offset[position]))])
            elif is_video_name(relatives[index]):
                yield index, video_where_it_lies(f"{root}/{self.tars[tar].name}", relatives[index],
                                                 (int(self.size[position]), self.tars[tar].mtime_ns), self.patience,
                                                 int(self.offset[position]), int(self.size[position]))
            else:
                spans.setdefault(int(self.tar[position]), []).append(index)
        tars = list(spans)
        ranges = [(min(int(self.offset[positions[i]]) for i in spans[tar]),
                   max(int(self.offset[positions[i]] + self.size[positions[i]]) for i in spans[tar])) for tar in tars]
        urls = [f"{root}/{self.tars[tar].name}" for tar in tars]
        for at, data in fetch_as_ready(urls, self.patience, ranges):
            tar, (start, end) = tars[at], ranges[at]
            if not isinstance(data, BaseException):
                data = _within(data, start, end, self.tars[tar].size, urls[at])
            for index in spans[tar]:
                yield index, self._member(relatives[index], positions[index], tar, start, data)

    def _member(self, relative: str, position: int, tar: int, start: int, data: bytes | BaseException):
        """Member POSITION's bytes cut from DATA, its tar's span from START (or why there are none)."""
        offset, size = int(self.offset[position]) - start, int(self.size[position])
        if isinstance(data, BaseException):
            return data
        if len(data) < offset + size:
            return DamagedTar(f"{self.tars[tar].name} ends before this member's bytes (changed after it was listed)")
        member = data[offset:offset + size]
        return Encoded(relative, (size, content_digest(member)), data=member)
