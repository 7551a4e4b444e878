"""Compression of real activations: bytes and write/read speed for none, lzf, gzip, zstd, blosc.

    python -m benchmarks.compression [--images 64]      (needs hdf5plugin: pip install 'featdump[compression]')

The activations are resnet18's layer3 and layer1 outputs (random weights, seed 0; ReLU outputs, so
zero-rich like real ones) over the benchmark JPEGs, stored as featdump stores them (its chunking).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from benchmarks.common import make_images
from featdump.inputs import find_images
from featdump.inputs.loader import ImageDataset, make_loader
from featdump.inputs.preprocess import Preprocess
from featdump.job.settings import COMPRESSIONS
from featdump.output.specs import DatasetSpec, chunk_shape, compression_filters
from featdump.sources.models import default_preprocessing

HERE = Path(__file__).resolve().parent



def activations(count: int) -> dict[str, np.ndarray]:
    images = find_images(make_images(HERE / "data" / "images-256", 256))
    preprocess = Preprocess(default_preprocessing("resnet18"))
    torch.manual_seed(0)
    from torchvision.models import resnet18

    net = resnet18().eval()
    batch = next(iter(make_loader(ImageDataset(images, preprocess), 0, count, 0)))
    with torch.inference_mode():
        x = preprocess.normalize(batch.pixels)
        x = net.maxpool(net.relu(net.bn1(net.conv1(x))))
        layer1 = net.layer1(x)
        layer3 = net.layer3(net.layer2(layer1))
    return {"layer1 float32": layer1.numpy(), "layer3 float32": layer3.numpy(),
            "layer3 float16": layer3.numpy().astype(np.float16)}


def measure(values: np.ndarray, compression: str) -> tuple[float, float, float]:
    path = HERE / "data" / "compression-test.h5"
    spec = DatasetSpec(values.shape[1:], str(values.dtype))
    started = time.perf_counter()
    with h5py.File(path, "w") as h5file:
        dataset = h5file.create_dataset("x", shape=values.shape, dtype=values.dtype, chunks=chunk_shape(spec, 64),
                                        **compression_filters(compression))
        for start in range(0, len(values), 16):
            dataset[start:start + 16] = values[start:start + 16]
    written = time.perf_counter() - started
    size = path.stat().st_size
    started = time.perf_counter()
    with h5py.File(path, "r") as h5file:
        back = h5file["x"][:]
    read = time.perf_counter() - started
    assert np.array_equal(back, values)
    path.unlink()
    return size, values.nbytes / written / 1e6, values.nbytes / read / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=64)
    args = parser.parse_args()
    print("| layer | compression | size | ratio | write MB/s | read MB/s |\n| --- | --- | ---: | ---: | ---: | ---: |")
    for name, values in activations(args.images).items():
        for compression in COMPRESSIONS:
            results = [measure(values, compression) for _ in range(3)]
            size = results[0][0]
            write = sorted(r[1] for r in results)[1]
            read = sorted(r[2] for r in results)[1]
            print(f"| {name} | {compression} | {size / 1e6:.1f} MB | {values.nbytes / size:.2f}x | {write:.0f} | "
                  f"{read:.0f} |")


if __name__ == "__main__":
    main()
