"""Web servers for the tests: a plain http.server (with or without ranges) and one that never answers, each
started by the test that needs it (the S3 store, SeaweedFS, is `tests.makers.seaweed`: the benchmarks run it too)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import io
import re
import socket
import threading
from pathlib import Path


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
