"""How far each non-reference configuration's rows are from the reference's (CPU, fp32, eager, hooks, exact
decoding), and how far --compile's rows are from eager's in the same precision: the figures behind the proof's
tolerances (`featdump/job/tolerances.py`) and the first-batch check of --compile (`featdump/forward/compiling.py`).

    python -m benchmarks.precision [--images 16] [--out DIR] [--no-compile] [--device cpu|cuda]

Each error is per row: max |got - reference| / max |reference| over the row, then the largest and the median over
the rows, per layer. Models: a random resnet18 (seed 0; layer2, layer4, avgpool), the small CNN with in-place ops
and a reused module and the small ViT of tests/test_compile.py. Images: smooth random 2048x1536 JPEGs (large enough
for --fast-decode to decode them at half scale).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import h5py
import numpy as np
from PIL import Image

from featdump.job.runner import extract
from featdump.job.settings import Settings

REPO = Path(__file__).resolve().parents[1]


MODELS = {"resnet18": "layer2,layer4,avgpool", "tiny_models:cnn": "bn,conv2,pool", "tiny_models:vit":
          "encoder.layers.encoder_layer_1,encoder.ln"}


def write_images(folder: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        base = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((2048, 1536), Image.BICUBIC)
        noise = rng.integers(-12, 12, (1536, 2048, 3))
        pixels = np.clip(np.asarray(base).astype(int) + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"img_{index:03d}.jpg", quality=90)


def rows(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as h5file:
        return {name: h5file["features"][name][:].reshape(h5file["features"][name].shape[0], -1).astype(np.float64)
                for name in h5file.attrs["layers"]}


def errors(got: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Per layer: (largest, median) over rows of max |got - ref| / max |ref| in the row."""
    found = {}
    for name, expected in reference.items():
        scale = np.maximum(np.abs(expected).max(axis=1), 1e-12)
        per_row = np.abs(got[name] - expected).max(axis=1) / scale
        found[name] = (float(per_row.max()), float(np.median(per_row)))
    return found


def run(model: str, images: Path, output: Path, device: str, **options) -> dict[str, np.ndarray]:
    extract(Settings(model=model, layers=tuple(MODELS[model].split(",")), images=images, output=output,
                     weights="none", batch_size=8, device=device, overwrite=True, proof=0, **options))
    return rows(output)


def compiled(output: Path) -> str:
    with h5py.File(output, "r") as h5file:
        return str(h5file.attrs.get("compiled", ""))[:40]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="featdump-precision-"))
    write_images(work / "images", args.images)
    from tests.makers.tiny_models import MODELS as TINY  # the small models of the compile tests

    (work / "tiny_models.py").write_text(TINY)
    os.chdir(work)  # featdump imports a factory from the current folder
    configurations = {"bf16": dict(precision="bf16"), "fp16": dict(precision="fp16"),
                      "fast-decode": dict(fast_decode=True)}
    if not args.no_compile:
        configurations.update({f"compile {precision}": dict(compile=True, precision=precision,
                                                            compile_cache=str(work / "cache"))
                               for precision in ("fp32", "bf16", "fp16")})
    print("| model | layer | configuration | vs reference: largest | median | vs eager, same precision | compiled |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for model in MODELS:
        reference = run(model, work / "images", work / "reference.h5", "cpu")
        eager = {"fp32": run(model, work / "images", work / "eager.h5", args.device)}
        for precision in ("bf16", "fp16"):
            eager[precision] = run(model, work / "images", work / "eager.h5", args.device, precision=precision)
        for name, options in configurations.items():
            got = run(model, work / "images", work / "run.h5", args.device, **options)
            against_eager = errors(got, eager[options["precision"]]) if options.get("compile") else {}
            for layer, (largest, median) in errors(got, reference).items():
                versus = f"{against_eager[layer][0]:.1e}" if layer in against_eager else ""
                print(f"| {model} | {layer} | {name} | {largest:.1e} | {median:.1e} | {versus} | "
                      f"{compiled(work / 'run.h5') if options.get('compile') else ''} |", flush=True)


if __name__ == "__main__":
    main()
