"""Stores: images that live at a URL (s3://, gs://, http(s)://, hf://: any fsspec protocol) instead of on a file
system. Which texts are URLs, the fsspec file system that reads each one (configured the ecosystem's way, never
featdump's: AWS_* and AWS_ENDPOINT_URL, FSSPEC_<PROTOCOL>_*, ~/.config/fsspec, instance roles), the extra to install
when its package is missing, what a failed request means (an object missing, access refused, or a transient
fault), and many objects fetched at once with every transient fault retried within the job's patience."""

from __future__ import annotations

import concurrent.futures
import os
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from featdump.errors import StoreRefused, StoreUnavailable, UsageProblem

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_EXTRAS = {  # protocol: (the package that reads it, featdump's extra that installs it)
    "s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
    "http": ("aiohttp", "http"), "https": ("aiohttp", "http"), "hf": ("huggingface_hub", "hf"),
}
DEFAULT_PATIENCE = 120.0  # seconds a read keeps retrying transient faults before the job stops
_THREADS = 32  # requests in flight per worker for file systems without an async interface
T = TypeVar("T")


def is_url(text) -> bool:
    """Whether TEXT (a str or Path) is a URL an object store or web server answers (file:// is a path)."""
    found = _URL.match(str(text)) if isinstance(text, str) else None
    return found is not None and found[1].lower() != "file"


def protocol_of(url: str) -> str:
    return _URL.match(url)[1].lower()


def join(root: str, relative: str) -> str:
    """RELATIVE under the URL ROOT (a relative that is itself a URL stays as it is)."""
    return relative if is_url(relative) else root.rstrip("/") + "/" + relative


def parent_of(url: str) -> str:
    """The URL of the folder (prefix) holding URL."""
    return url.rstrip("/").rsplit("/", 1)[0]


_filesystems: dict[tuple, object] = {}
_CONFIGURED_BY = ("AWS_", "FSSPEC_", "GOOGLE_", "GCSFS_", "HF_")


def _configuration() -> tuple:
    """The environment a file system is configured by: another (new credentials, endpoint) makes a new one."""
    return tuple(sorted((key, value) for key, value in os.environ.items() if key.startswith(_CONFIGURED_BY)))


def filesystem(url: str):
    """The fsspec file system reading URL's protocol, made once per process (loader workers make their own: an
    async file system's event loop does not survive a fork). UsageProblem naming the extra when it is missing."""
    protocol = protocol_of(url)
    key = (protocol, os.getpid(), _configuration())
    if key not in _filesystems:
        _filesystems[key] = _make_filesystem(protocol, url)
    return _filesystems[key]


def _make_filesystem(protocol: str, url: str):
    import fsspec

    package, extra = _EXTRAS.get(protocol, (None, None))
    try:
        return fsspec.filesystem(protocol, skip_instance_cache=True)
    except ImportError as error:
        named = package or getattr(error, "name", None) or "its fsspec implementation"
        how = f"pip install 'featdump[{extra}]'" if extra else f"pip install {named}"
        raise UsageProblem(f"Reading {url} needs the package {named}, which is not installed: {how}.") from error
    except ValueError as error:
        raise UsageProblem(f"{url}: no fsspec file system reads {protocol}:// ({error}).") from error


def store_path(url: str) -> str:
    """URL as its file system names it (s3://bucket/key -> bucket/key; an http URL stays whole)."""
    return filesystem(url)._strip_protocol(url)


# -- what a failure means ----------------------------------------------------------------------------


def is_missing(error: BaseException) -> bool:
    """The object is not there (a recorded skip), as opposed to its bucket."""
    return isinstance(error, FileNotFoundError) and not _names_bucket(error) or _status(error) in (404, 410)


_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "ProfileNotFound",
                   "DefaultCredentialsError", "RefreshError", "NoRegionError")  # botocore's, google-auth's


def is_refused(error: BaseException) -> bool:
    """Access refused, no credentials, or the bucket missing: no retry helps, and no other object will fare
    better."""
    return isinstance(error, PermissionError) or (isinstance(error, FileNotFoundError) and _names_bucket(error)) \
        or _status(error) in (401, 403) or type(error).__name__ in _NO_CREDENTIALS


def is_transient(error: BaseException) -> bool:
    """A fault that may pass (timeouts, resets, 5xx, throttling): anything but a missing object, a refusal or a
    client error. Unknown faults are retried too: the patience bounds them."""
    if is_missing(error) or is_refused(error) or isinstance(error, (IsADirectoryError, NotADirectoryError)):
        return False
    status = _status(error)
    return status is None or status >= 500 or status in (408, 429)


def _names_bucket(error: BaseException) -> bool:
    """A missing bucket, as S3 (NoSuchBucket) and GCS say it, not an object whose key holds the word."""
    text = str(error).lower()
    return "bucket does not exist" in text or "nosuchbucket" in text


def _status(error: BaseException) -> int | None:
    status = getattr(error, "status", None) or getattr(error, "code", None)
    return status if isinstance(status, int) and 100 <= status < 600 else None


def describe(error: BaseException) -> str:
    """One line: the error's kind and its first line."""
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# -- retries -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Patience:
    """How long a read keeps retrying transient faults (exponential backoff with jitter, 0.2 s doubling up to
    10 s) before the job stops with StoreUnavailable, naming the object."""

    seconds: float = DEFAULT_PATIENCE

    def call(self, attempt: Callable[[], T], what: str) -> T:
        """ATTEMPT's result; a transient fault retried, a refusal as StoreRefused, any other error raised."""
        started, tries = time.monotonic(), 0
        while True:
            try:
                return attempt()
            except Exception as error:  # judged below: only transient faults are retried
                tries += 1
                if is_refused(error):
                    raise StoreRefused(f"{what}: access refused ({describe(error)}).") from error
                if not is_transient(error):
                    raise
                self.wait(started, tries, what, error)

    def wait(self, started: float, tries: int, what: str, error: BaseException) -> None:
        """Sleep before try TRIES + 1, or StoreUnavailable when that would pass the patience."""
        pause = min(0.2 * 2 ** (tries - 1), 10.0) * random.uniform(0.5, 1.0)
        waited = time.monotonic() - started
        if waited + pause > self.seconds:
            raise StoreUnavailable(
                f"{what}: the store did not answer ({describe(error)}; {tries} tries in {waited:.0f} s, "
                f"--store-patience {self.seconds:g}). The output keeps every row written so far: run the same "
                "command again to resume once the store is back.")
        time.sleep(pause)


def fetch_all(urls: Sequence[str], patience: Patience,
              ranges: Sequence[tuple[int, int]] | None = None) -> list[bytes | BaseException]:
    """The bytes of every URL (one protocol), or of its byte range [START, END) in RANGES, fetched concurrently; a
    missing object's place holds its error. Transient faults are retried (the stragglers together) within
    PATIENCE; a refusal raises StoreRefused."""
    results: list[bytes | BaseException | None] = [None] * len(urls)
    pending = list(range(len(urls)))
    started, tries = time.monotonic(), 0
    while pending:
        fetched = _fetch_once([urls[i] for i in pending], [ranges[i] for i in pending] if ranges else None)
        retry = []
        for index, found in zip(pending, fetched):
            if isinstance(found, BaseException) and is_transient(found):
                retry.append((index, found))
            elif isinstance(found, BaseException) and is_refused(found):
                raise StoreRefused(f"Reading {urls[index]}: access refused ({describe(found)}).") from found
            else:
                results[index] = found
        pending = [index for index, _ in retry]
        if retry:
            tries += 1
            patience.wait(started, tries, f"Reading {urls[retry[0][0]]}", retry[0][1])
    return results


def _fetch_once(urls: list[str], ranges: list[tuple[int, int]] | None) -> list[bytes | BaseException]:
    fs = filesystem(urls[0])
    paths = [fs._strip_protocol(url) for url in urls]
    if getattr(fs, "async_impl", False):
        try:
            if ranges is not None:
                return fs.cat_ranges(paths, [start for start, _ in ranges], [end for _, end in ranges],
                                     on_error="return")
            found = fs.cat(paths, on_error="return")
        except Exception as error:  # the whole call failed (the endpoint is away): every URL shares its fault
            return [error] * len(urls)
        missing = FileNotFoundError("not returned by the store")
        return [found.get(path, missing) if isinstance(found, dict) else found for path in paths]

    def one(index: int) -> bytes | BaseException:
        try:
            if ranges is not None:
                return fs.cat_file(paths[index], start=ranges[index][0], end=ranges[index][1])
            return fs.cat_file(paths[index])
        except Exception as error:  # judged by the caller
            return error

    with concurrent.futures.ThreadPoolExecutor(min(_THREADS, len(urls))) as pool:
        return list(pool.map(one, range(len(urls))))
