"""Stores: images that live at a URL (s3://, gs://, http(s)://, hf://: any fsspec protocol) instead of on a file
system. Which texts are URLs, the fsspec file system that reads each one (configured the ecosystem's way, never
featdump's: AWS_* and AWS_ENDPOINT_URL, FSSPEC_<PROTOCOL>_*, ~/.config/fsspec, instance roles), the extra to install
when its package is missing, what a failed request means (an object missing, access refused, or a transient
fault), and many objects fetched at once with every transient fault retried within the job's patience."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import heapq
import logging
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from featdump.errors import FeatdumpError, StoreNeverAnswered, StoreRefused, StoreUnavailable, UsageProblem
from featdump.locations import Location

_EXTRAS = {  # protocol: (the package that reads it, featdump's extra that installs it)
    "s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
    "http": ("aiohttp", "http"), "https": ("aiohttp", "http"), "hf": ("huggingface_hub", "hf"),
}
DEFAULT_PATIENCE = 120.0  # seconds a read keeps retrying transient faults before the job stops
_THREADS = 32  # requests in flight per worker for file systems without an async interface
_CONNECTIONS = 64  # connections an S3 client keeps open: a batch's requests in flight at once
T = TypeVar("T")
log = logging.getLogger("featdump")


_filesystems: dict[tuple, object] = {}
_CONFIGURED_BY = ("AWS_", "FSSPEC_", "GOOGLE_", "GCSFS_", "HF_")


def _configuration() -> tuple:
    """The environment a file system is configured by: another (new credentials, endpoint) makes a new one."""
    return tuple(sorted((key, value) for key, value in os.environ.items() if key.startswith(_CONFIGURED_BY)))


def filesystem(url: str, patience: Patience | None = None):
    """The fsspec file system reading URL's protocol (a path's: the local one), made once per process (loader
    workers make their own: an async file system's event loop does not survive a fork), its requests bounded by
    PATIENCE (`_bounded`). UsageProblem naming the extra when it is missing."""
    protocol = Location.of(url).file_protocol
    timeout = (patience or Patience()).request_timeout
    key = (protocol, os.getpid(), _configuration(), timeout)
    if key not in _filesystems:
        _filesystems[key] = _make_filesystem(protocol, url, timeout)
    return _filesystems[key]


def _make_filesystem(protocol: str, url: str, timeout: float):
    import fsspec

    package, extra = _EXTRAS.get(protocol, (None, None))
    try:
        return _bounded(fsspec.filesystem(protocol, skip_instance_cache=True, **_options(protocol, timeout)))
    except ImportError as error:
        named = package or getattr(error, "name", None) or "its fsspec implementation"
        how = f"pip install 'featdump[{extra}]'" if extra else f"pip install {named}"
        raise UsageProblem(f"Reading {url} needs the package {named}, which is not installed: {how}.") from error
    except ValueError as error:
        raise UsageProblem(f"{url}: no fsspec file system reads {protocol}:// ({error}).") from error


def _options(protocol: str, timeout: float) -> dict:
    """What the file system of PROTOCOL is made with, beyond the user's fsspec configuration: S3's connection pool
    (botocore's 10 would cap a batch) and, for S3 and http(s), connect and read timeouts of TIMEOUT with the
    client's own retries off, so that Patience alone retries and bounds a request that hangs."""
    import fsspec

    configured = fsspec.config.conf.get(protocol, {})
    if protocol in ("s3", "s3a") and "config_kwargs" not in configured:
        return {"config_kwargs": {"max_pool_connections": _CONNECTIONS, "connect_timeout": timeout,
                                  "read_timeout": timeout, "retries": {"total_max_attempts": 1}}}
    if protocol in ("http", "https") and "client_kwargs" not in configured:
        import aiohttp

        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(sock_connect=timeout, sock_read=timeout)}}
    return {}


def _bounded(fs):
    """FS with its own retry loop (s3fs retries 5 times, sleeping, inside one of Patience's tries) turned off."""
    if hasattr(fs, "retries"):
        fs.retries = 1
    return fs


def store_path(url: str) -> str:
    """URL as its file system names it (s3://bucket/key -> bucket/key; an http URL stays whole; a path, absolute)."""
    return filesystem(url)._strip_protocol(Location.of(url).plain)


# -- what a failure means ----------------------------------------------------------------------------


def _underlying(error: BaseException) -> BaseException:
    """What ERROR means: fsspec's http file system reports any failed lookup (a timeout too) as FileNotFoundError
    raised from the real error; a connection fault, a timeout or a 5xx under it is judged instead."""
    cause = error.__cause__
    if isinstance(error, FileNotFoundError) and cause is not None and _is_connection_fault(cause):
        return cause
    return error


def _is_connection_fault(error: BaseException) -> bool:
    status = _status(error)
    return isinstance(error, (TimeoutError, ConnectionError)) or (status is not None and status >= 500) \
        or any(kind.__name__ == "ClientConnectionError" for kind in type(error).__mro__)  # aiohttp's


def is_missing(error: BaseException) -> bool:
    """The object is not there (a recorded skip), as opposed to its bucket."""
    error = _underlying(error)
    return isinstance(error, FileNotFoundError) and not _names_bucket(error) or _status(error) in (404, 410)


_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "ProfileNotFound",
                   "DefaultCredentialsError", "RefreshError", "NoRegionError")  # botocore's, google-auth's


def is_refused(error: BaseException) -> bool:
    """Access refused, no credentials, or the bucket missing: no retry helps, and no other object will fare
    better."""
    error = _underlying(error)
    return isinstance(error, PermissionError) or (isinstance(error, FileNotFoundError) and _names_bucket(error)) \
        or _status(error) in (401, 403) or type(error).__name__ in _NO_CREDENTIALS


def is_transient(error: BaseException) -> bool:
    """A fault that may pass (timeouts, resets, 5xx, throttling): anything but a missing object, a refusal or a
    client error. Unknown faults are retried too: the patience bounds them."""
    error = _underlying(error)
    if is_missing(error) or is_refused(error) or isinstance(error, (IsADirectoryError, NotADirectoryError,
                                                                    FeatdumpError)):
        return False
    status = _status(error)
    return status is None or status >= 500 or status in (408, 429)


def _names_bucket(error: BaseException) -> bool:
    """A missing bucket, as S3 (NoSuchBucket) and GCS say it, not an object whose key holds the word."""
    text = str(error).lower()
    return "bucket does not exist" in text or "nosuchbucket" in text


def _status(error: BaseException) -> int | None:
    """The HTTP status an error carries: aiohttp's `status`, urllib's `code`, botocore's response metadata."""
    status = getattr(error, "status", None) or getattr(error, "code", None)
    response = getattr(error, "response", None)
    if status is None and isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if status is None and error.__cause__ is not None:  # s3fs's OSError raised from botocore's ClientError
        return _status(error.__cause__)
    return status if isinstance(status, int) and 100 <= status < 600 else None


def refusal(error: BaseException) -> str:
    """What a refusal says: the bucket does not exist, or access refused (its kind and first line)."""
    if _names_bucket(_underlying(error)) or _names_bucket(error):
        return f"the bucket does not exist ({describe(error)})"
    return f"access refused ({describe(error)})"


def describe(error: BaseException) -> str:
    """One line: the error's kind and its first line."""
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# -- retries -------------------------------------------------------------------------------------------------

_URL_IN = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+")
_SAY_EVERY = 5.0  # seconds: a job logs one of its waits at most this often


def endpoint(url: str) -> str:
    """Where URL's requests go, and what said so: S3's endpoint from AWS_ENDPOINT_URL(_S3), fsspec's configuration
    or AWS's default; a web server's host."""
    protocol = Location.of(url).protocol
    if protocol in ("s3", "s3a"):
        for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if os.environ.get(variable):
                return f"endpoint {os.environ[variable]} from {variable}"
        import fsspec

        configured = fsspec.config.conf.get(protocol, {})
        address = configured.get("endpoint_url") or configured.get("client_kwargs", {}).get("endpoint_url")
        if address:
            return f"endpoint {address} from fsspec's configuration"
        return "AWS's own endpoint (no AWS_ENDPOINT_URL is set)"
    if protocol in ("http", "https"):
        return f"server {url.split('/')[2]}"
    return f"{protocol}:// store"


@dataclass(frozen=True)
class Patience:
    """How long a read keeps retrying transient faults (exponential backoff with jitter, 0.2 s doubling up to
    10 s) before the job stops with StoreUnavailable, naming the object. A fault is always tried twice: a first
    try slowed by the client's own start (imports, credentials, a loaded machine) is not the store's answer."""

    seconds: float = DEFAULT_PATIENCE
    state: dict = field(default_factory=dict, compare=False, repr=False)  # answered (a store did), said_at (a wait)

    def answered(self) -> None:
        self.state["answered"] = True

    @property
    def request_timeout(self) -> float:
        """Seconds one request may wait to connect, or between bytes, before it counts as a failed try: half the
        patience (1 s to 60 s), so that a store that hangs ends the job within about 1.5x the patience."""
        return min(60.0, max(1.0, self.seconds / 2))

    def call(self, attempt: Callable[[], T], what: str) -> T:
        """ATTEMPT's result; a transient fault retried, a refusal as StoreRefused, any other error raised."""
        started, tries = time.monotonic(), 0
        while True:
            try:
                found = attempt()
                self.answered()
                return found
            except Exception as error:  # judged below: only transient faults are retried
                tries += 1
                if is_refused(error):
                    raise StoreRefused(f"{what}: {refusal(error)}.") from error
                if not is_transient(error):
                    raise
                self.wait(started, tries, what, error)

    def pause(self, started: float, tries: int, what: str, error: BaseException) -> float:
        """Seconds to wait before try TRIES + 1 (said in the log, at most every few seconds), or StoreUnavailable
        when that would pass the patience."""
        pause = min(0.2 * 2 ** (tries - 1), 10.0) * random.uniform(0.5, 1.0)
        waited = time.monotonic() - started
        url = _URL_IN.search(what)
        where = endpoint(url[0]) if url else "the store"
        if waited + pause > self.seconds and tries > 1:
            tried = f"{tries} {'try' if tries == 1 else 'tries'}"
            problem = (f"{what}: the store did not answer ({describe(error)}; {tried} in {waited:.0f} s, "
                       f"--store-patience {self.seconds:g}; {where}). ")
            if self.state.get("answered"):
                raise StoreUnavailable(problem + "The output keeps every row written so far: run the same command "
                                                 "again to resume once the store is back.")
            raise StoreNeverAnswered(problem + "Nothing was ever read from it by this process: check its address" + (
                " (AWS_ENDPOINT_URL) and the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE)"
                if url and Location.of(url[0]).protocol in ("s3", "s3a") else "")
                + " where it runs (on a cluster: the node's environment), then run the same command again.")
        if time.monotonic() - self.state.get("said_at", -math.inf) >= _SAY_EVERY:
            self.state["said_at"] = time.monotonic()
            log.warning("%s: %s; trying again in %.1f s (%.0f of %g s of --store-patience; %s)", what,
                        describe(error), pause, waited, self.seconds, where)
        return pause

    def wait(self, started: float, tries: int, what: str, error: BaseException) -> None:
        time.sleep(self.pause(started, tries, what, error))


def fetch_all(urls: Sequence[str], patience: Patience,
              ranges: Sequence[tuple[int, int]] | None = None) -> list[bytes | BaseException]:
    """The bytes of every URL (`fetch_as_ready`), in order."""
    results: list[bytes | BaseException | None] = [None] * len(urls)
    for index, found in fetch_as_ready(urls, patience, ranges):
        results[index] = found
    return results


def fetch_as_ready(urls: Sequence[str], patience: Patience,
                   ranges: Sequence[tuple[int, int]] | None = None) -> Iterator[tuple[int, bytes | BaseException]]:
    """(index, bytes) of every URL (one protocol), or of its byte range [START, END) in RANGES, as each arrives:
    all requested at once, so that the caller decodes the first while the others are on their way. A missing
    object yields its error (so does a web server's refusal of one URL); a transient fault is retried after a
    backoff while the others go on, within PATIENCE of the first try (then StoreUnavailable, naming the object);
    a store's refusal raises StoreRefused."""
    if not urls:
        return
    with contextlib.ExitStack() as stack:
        request = _requester(filesystem(urls[0], patience), urls, ranges, stack)
        yield from _as_ready(request, urls, patience)


def _as_ready(request, urls: Sequence[str], patience: Patience) -> Iterator[tuple[int, bytes | BaseException]]:
    started, tries = time.monotonic(), [0] * len(urls)
    pending = {request(index): index for index in range(len(urls))}
    due: list[tuple[float, int]] = []  # (when, index) of the retries waiting their turn
    try:
        while pending or due:
            while due and (due[0][0] <= time.monotonic() or not pending):
                when, index = heapq.heappop(due)
                time.sleep(max(0.0, when - time.monotonic()))
                pending[request(index)] = index
            timeout = max(0.0, due[0][0] - time.monotonic()) if due else None
            finished, _ = concurrent.futures.wait(pending, timeout, concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                index = pending.pop(future)
                error = future.exception()
                if error is None:
                    patience.answered()
                    yield index, future.result()
                elif is_refused(error) and Location.of(urls[index]).refused_with_its_bucket:
                    raise StoreRefused(f"Reading {urls[index]}: {refusal(error)}.") from error
                elif is_transient(error):
                    tries[index] += 1
                    pause = patience.pause(started, tries[index], f"Reading {urls[index]}", error)
                    heapq.heappush(due, (time.monotonic() + pause, index))
                else:
                    yield index, error
    finally:
        for future in pending:
            future.cancel()


def _requester(fs, urls: Sequence[str], ranges: Sequence[tuple[int, int]] | None, stack: contextlib.ExitStack):
    """A function starting the request of URL INDEX, returning its concurrent Future: a coroutine on fsspec's
    event loop for an async file system, else a call on a thread of a pool that STACK ends."""
    paths = [fs._strip_protocol(url) for url in urls]

    def arguments(index: int) -> dict:
        return {"start": ranges[index][0], "end": ranges[index][1]} if ranges is not None else {}

    if getattr(fs, "async_impl", False):
        return lambda index: asyncio.run_coroutine_threadsafe(fs._cat_file(paths[index], **arguments(index)),
                                                              fs.loop)
    pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(min(_THREADS, len(urls))))
    return lambda index: pool.submit(fs.cat_file, paths[index], **arguments(index))


class RangeReader:
    """Reads (start, count) of the object at URL, fetched by byte range in blocks of BLOCK bytes of which the last
    few are kept (PyAV asks a video's bytes tens of KiB at a time: a request each would crawl); each fetch is retried
    within PATIENCE, as any read of a store is."""

    def __init__(self, url: str, patience: Patience, block: int = 1 << 22, kept: int = 4):
        self.url, self.patience, self.block, self.kept = url, patience, block, kept
        self._blocks: dict[int, bytes] = {}

    def __call__(self, start: int, count: int) -> bytes:
        pieces, end = [], start + count
        while start < end:
            index = start // self.block
            data = self._fetched(index)
            piece = data[start - index * self.block:end - index * self.block]
            if not piece:
                break
            pieces.append(piece)
            start += len(piece)
        return b"".join(pieces)

    def _fetched(self, index: int) -> bytes:
        if index not in self._blocks:
            found = fetch_all([self.url], self.patience, [(index * self.block, (index + 1) * self.block)])[0]
            if isinstance(found, BaseException):
                raise found
            while len(self._blocks) >= self.kept:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[index] = found
        return self._blocks[index]

    def size(self) -> int:
        """The object's size in bytes, as its store states it."""
        fs = filesystem(self.url, self.patience)
        details = self.patience.call(lambda: fs.info(store_path(self.url)), f"Reading {self.url}")
        return int(details.get("size", details.get("Size")))
