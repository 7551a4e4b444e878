"""Settings: one dataclass holding everything a run needs, from the CLI or the Python API."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

DTYPES = ("float32", "float16")
REDUCTIONS = ("none", "flatten", "avgpool", "maxpool", "cls")
PRECISIONS = ("fp32", "bf16", "fp16")
DECODERS = ("auto", "cpu", "gpu")
COMPRESSIONS = ("none", "lzf", "gzip", "zstd", "blosc")  # zstd, blosc: the hdf5plugin package
ON_ERROR = ("skip", "fail")
CHOICES = {"dtype": DTYPES, "reduce": REDUCTIONS, "precision": PRECISIONS, "decode": DECODERS,
           "compression": COMPRESSIONS, "on_error": ON_ERROR}


@dataclass(frozen=True)
class Settings:
    """What to extract, from what, into where, and how."""

    model: str  # torchvision name ("resnet18"), "timm:NAME", "package.module:callable" or a saved model file
    layers: tuple[str, ...]  # layer selectors, "PATH" or "PATH:K"
    images: Path  # root of the image folder
    output: Path  # the finished HDF5 file (written as OUTPUT.partial first)
    weights: str = "DEFAULT"  # DEFAULT, a weights enum name, "none", or a checkpoint path
    seed: int = 0  # torch.manual_seed before building a model with weights "none"
    transform: str | None = None  # "package.module:callable" giving the preprocessing; None: the model's own
    trust_pickle: bool = False  # allow unpickling a whole saved model (runs the code the file holds)
    batch_size: int = 64
    num_workers: int | None = None  # DataLoader worker processes decoding images; None: the job's CPUs less one
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    overwrite: bool = False  # start over even if OUTPUT or OUTPUT.partial exists
    on_error: str = "skip"  # what a bad image does: skip (recorded) or fail
    dtype: str = "float32"  # storage dtype of the features
    reduce: str = "none"  # reduction applied on the device before the copy
    compression: str = "none"  # HDF5 filter of the feature datasets
    precision: str = "fp32"  # autocast precision of the forward pass
    decode: str = "auto"  # where JPEGs are decoded: cpu, gpu, or auto (gpu when on CUDA)
    fast_decode: bool = False  # decode large JPEGs at a reduced scale (DCT scaling) before the exact resize
    space_check: bool = True  # refuse to start when the disk cannot hold the output
    shard: str | None = None  # "K/N", "none", or None: detect a SLURM array or torchrun
    shard_pattern: str | None = None  # shard file names, with {k} and {n}; None: OUT.shard-K-of-N.h5
    merge_timeout: float = 3600.0  # torchrun: seconds rank 0 waits for the other ranks before merging
    update: bool = False  # append images new since OUTPUT was finished (cron), keeping its rows
    command: str = ""  # the command line, recorded in the output

    def effective(self) -> dict:
        """Every setting as plain JSON values: the configuration a file records."""
        return {key: (str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value)
                for key, value in dataclasses.asdict(self).items()}

    def fingerprint(self) -> dict:
        """The options that determine the rows and values written (resume compares these)."""
        return {
            "model": self.model,
            "weights": self.weights,
            "seed": self.seed,
            "transform": self.transform,
            "layers": list(self.layers),
            "dtype": self.dtype,
            "reduce": self.reduce,
            "precision": self.precision,
            "fast_decode": self.fast_decode,
        }
