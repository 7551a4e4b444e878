"""Objects: images stored as objects at URLs. A store prefix (`s3://bucket/prefix/`) read as a folder: every image
object under it, listed in pages, named by its key relative to the prefix, labelled by its first-level "folder",
identified by its ETag, size and modification time as listed (the listing's counts are recorded in the output).
And the URLs of a list file, mixed with paths. A loader worker fetches the objects of its batch together, with
many requests in flight."""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath

import numpy as np

from featdump.errors import NoImages, StoreRefused
from featdump.inputs.folder import IMAGE_EXTENSIONS, class_labels, images_or_videos
from featdump.inputs.imagelist import Encoded, ImageList, Storage, Window, hash_lines
from featdump.inputs.stores import (
    Patience,
    RangeReader,
    describe,
    fetch_all,
    fetch_as_ready,
    filesystem,
    is_refused,
    store_path,
)
from featdump.inputs.video import VIDEO_SUFFIXES, is_video_name
from featdump.locations import Location

log = logging.getLogger("featdump")


_ROW_SUFFIXES = IMAGE_EXTENSIONS | frozenset(VIDEO_SUFFIXES)

# -- a prefix read as a folder ------------------------------------------------------------------------------


def read_prefix(url: str, patience: Patience) -> ImageList:
    """The image objects under the prefix URL (every level), sorted by key, with ImageFolder-style labels from
    the first level; NoImages when there are none, StoreRefused for bad credentials or a missing bucket."""
    fs, root = filesystem(url, patience), url.rstrip("/")
    prefix = fs._strip_protocol(root).rstrip("/")
    started = time.perf_counter()
    log.info("Listing %s/ ...", root)
    listed = patience.call(lambda: fs.find(prefix, detail=True, withdirs=False), f"Listing {root}/")
    fs.invalidate_cache()  # its copy of the listing would live on in every loader worker
    keys, identities = [], {}
    for name, details in listed.items():
        relative = name[len(prefix) + 1:] if name.startswith(prefix + "/") else None
        if relative and PurePosixPath(relative).suffix.lower() in _ROW_SUFFIXES:
            keys.append(relative)
            identities[relative] = object_identity(details)
    seconds = time.perf_counter() - started
    keys.sort()
    keys = [keys[position] for position in images_or_videos(keys, f"{root}/")]
    log.info("Listed %d objects under %s/ in %.1f s: %d %s.", len(listed), root, seconds, len(keys),
             "videos" if keys and is_video_name(keys[0]) else "images")
    if not keys:
        raise NoImages(f"No images under {root}/ ({len(listed)} objects, none named with an image or video "
                       f"extension: {', '.join(sorted(ext.lstrip('.') for ext in _ROW_SUFFIXES))}).")
    labels, classes = class_labels(keys)
    size, mtime, etag = zip(*(identities[key] for key in keys))
    storage = StoreObjects(patience, np.asarray(size, np.int64), np.asarray(mtime, np.int64), tuple(etag))
    listing = {"url": f"{root}/", "objects": len(listed), "images": len(keys), "seconds": round(seconds, 3),
               "listed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    return ImageList(root, tuple(keys), labels, classes, storage, listing)


def object_identity(details: dict) -> tuple[int, int, str]:
    """(size, modification time in ns, ETag) of a listed object, whatever the store calls them."""
    size = int(details.get("size", details.get("Size", -1)) or 0)
    when = details.get("LastModified") or details.get("mtime") or details.get("updated") or details.get("created") \
        or details.get("Last-Modified")  # a web server's, as fsspec passes its header on
    if isinstance(when, str):
        when = _parse_time(when)
    mtime = int(when.timestamp() * 1e9) if isinstance(when, datetime) else int(when or -1)
    etag = next((str(details[key]).strip('"') for key in _CHECKSUMS if details.get(key)), "")
    return size, mtime, etag


_CHECKSUMS = ("ETag", "etag", "md5Hash", "Content-MD5", "Digest")  # S3's, GCS's, a web server's


def _parse_time(text: str) -> datetime | None:
    """An ISO 8601 time (S3, GCS) or an HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`); None if it is neither."""
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    with contextlib.suppress(TypeError, ValueError):
        return email.utils.parsedate_to_datetime(text)
    return None


@dataclass(frozen=True)
class StoreObjects(Storage):
    """Where the images of a prefix lie: objects under the root URL, with their identities as listed."""

    patience: Patience
    size: np.ndarray  # int64 per image
    mtime: np.ndarray  # int64 per image: ns
    etag: tuple[str, ...]

    def open(self, root: str, relative: str, position: int) -> Encoded:
        return only_image(self.open_as_ready(root, [relative], [position]))

    def open_as_ready(self, root: str, relatives: Sequence[str],
                      positions: Sequence[int]) -> Iterator[tuple[int, Encoded | Exception]]:
        fetched = [index for index, relative in enumerate(relatives) if not is_video_name(relative)]
        for index, relative in enumerate(relatives):
            if is_video_name(relative):
                position = positions[index]
                identity = (int(self.size[position]), int(self.mtime[position]))
                yield index, video_where_it_lies(str(Location.of(root).join(relative)), relative, identity,
                                                 self.patience, size=identity[0])
        urls = [str(Location.of(root).join(relatives[index])) for index in fetched]
        for at, found in fetch_as_ready(urls, self.patience):
            index = fetched[at]
            position = positions[index]
            yield index, found if isinstance(found, BaseException) else Encoded(
                relatives[index], (int(self.size[position]), int(self.mtime[position])), data=found)

    def stat(self, root: str, relative: str, position: int) -> tuple[int, int] | None:
        return int(self.size[position]), int(self.mtime[position])  # as listed for this job

    def select(self, positions: Sequence[int]) -> StoreObjects:
        chosen = np.asarray(positions, dtype=np.int64)
        return StoreObjects(self.patience, self.size[chosen], self.mtime[chosen],
                            tuple(self.etag[p] for p in chosen.tolist()))

    def digest(self, root: str, paths: Sequence[str], labels: Sequence[int], sizes: bool) -> str:
        """A hash of the keys and labels (and each object's ETag, size and modification time)."""
        digest = hashlib.sha256()
        identities = (f"{self.etag[position]}\0{self.size[position]}\0{self.mtime[position]}" if sizes else ""
                      for position in range(len(paths)))
        hash_lines(digest, (f"{relative}\0{identity}\0{label}\n"
                            for relative, identity, label in zip(paths, identities, labels)))
        return digest.hexdigest()


def video_where_it_lies(url: str, relative: str, identity: tuple[int, int], patience: Patience, offset: int = 0,
                        size: int = -1) -> Encoded:
    """The video at URL (SIZE bytes from OFFSET: a tar member; the whole object where SIZE is -1), named RELATIVE, as
    a file read where it lies, by byte ranges, in the parts its clips need: never fetched whole."""
    def opener() -> Window:
        reader = RangeReader(url, patience)
        return Window(reader, offset, size if size >= 0 else reader.size())

    return Encoded(relative, identity, opener=opener)


def only_image(found: Iterator[tuple[int, Encoded | Exception]]) -> Encoded:
    """The one image FOUND yields, or its error raised."""
    _, encoded = next(found)
    if isinstance(encoded, Exception):
        raise encoded
    return encoded


def check_access(urls: Sequence[str], patience: Patience) -> None:
    """StoreRefused, before any work, when the store of any of URLS refuses its credentials or lacks its bucket:
    one object of each bucket is looked up (web servers are not: a list may name thousands, and has no
    credentials for them)."""
    firsts: dict[str, str] = {}
    for url in urls:
        if Location.of(url).refused_with_its_bucket:
            firsts.setdefault(_bucket_of(url), url)
    for bucket, url in firsts.items():
        try:
            patience.call(lambda url=url: filesystem(url, patience).info(store_path(url)), f"Reading {url}")
        except FileNotFoundError as error:
            if is_refused(error):
                raise StoreRefused(f"Reading {url}: {describe(error)}.") from error
        except StoreRefused as error:
            raise StoreRefused(f"{error} Check the credentials the store is given (AWS_ACCESS_KEY_ID, AWS_PROFILE, "
                               f"~/.config/fsspec) for {bucket}.") from error


def _bucket_of(url: str) -> str:
    return Location.of(url).bucket.text


def read_object(root: str, relative: str, patience: Patience | None = None) -> bytes | None:
    """The bytes of row RELATIVE of an output whose images were read under the URL ROOT (or named by their own
    URL), read back from the store; None when they are not there (or not an object: a tar member)."""
    found = fetch_all([str(Location.of(root).join(relative))], patience or Patience(seconds=10))[0]
    return None if isinstance(found, BaseException) else found
