"""Settings: everything a run needs, each extract option declared once (type, default, allowed values, help).

The CLI's options, the config file's keys and the API's keywords are derived from these declarations
(`featdump.job.options`); a Settings checks every value when it is made, whichever entry point made it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from featdump.errors import BadOption
from featdump.inputs.stores import DEFAULT_PATIENCE
from featdump.inputs.video import ANCHORS, PADS
from featdump.job.dependencies import COMPILED, FIT, LAYOUT, LISTING, MODEL, VALUES
from featdump.job.options import Option, as_location, marked_as, option, options_of
from featdump.job.shards import parse_shard
from featdump.output.shard_files import shard_pattern
from featdump.reductions.rules import canonical_rule, check_rule, rules_from_table, uses_pca
from featdump.sources.registry import model_kinds

DTYPES = ("float32", "float16")
PRECISIONS = ("fp32", "bf16", "fp16")
DECODERS = ("auto", "cpu", "gpu")
COMPRESSIONS = ("none", "lzf", "gzip", "zstd", "blosc")  # zstd, blosc: the hdf5plugin package
ON_ERROR = ("skip", "fail")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def _device_syntax(name: str) -> None:
    if not _DEVICE.match(name):
        raise BadOption(f"Unknown device {name!r}: use auto, cpu, cuda or cuda:N.")


def _callable_syntax(what: str):
    def check(spec: str) -> None:
        module_name, _, attribute = spec.partition(":")
        if not module_name or not attribute:
            raise BadOption(f"Bad {what} {spec!r}: use package.module:callable.")

    return check


def _pca_fit_syntax(text: str) -> None:
    if not text.strip() or (text.strip().lstrip("-").isdigit() and int(text) < 2):
        raise BadOption(f"--pca-fit {text!r}: give a number of images (at least 2) or a folder or list file.")


def _not_empty(spec: str) -> None:
    if not spec.strip():
        raise BadOption("'model' must name a model, e.g. resnet50, timm:NAME or package.module:callable.")


def _reader_names() -> str:
    from featdump.inputs.readers import reader_names  # the readers' modules: for extract's help, not featdump's

    return reader_names()


def _name_value(text: str) -> None:
    if "=" not in text or not text.partition("=")[0].strip():
        raise BadOption(f"--reader-option {text!r}: give NAME=VALUE, an option the reader declares.")


def _cache_folder(text: str) -> None:
    if not text.strip() or Path(text).expanduser().is_file():
        raise BadOption(f"--compile-cache {text!r}: give a folder (made if missing) for torch.compile's caches.")


def _scratch_folder(text: str) -> None:
    if not text.strip() or Path(text).expanduser().is_file():
        raise BadOption(f"--scratch {text!r}: give a folder (made if missing) on a local disk.")


@dataclass(frozen=True)
class Settings:
    """What to extract, from what, into where, and how."""

    model: str = option(
        kind=str, required=True, short="-m", syntax=_not_empty,
        help=lambda: f"The model: {model_kinds()}.",
        changes=(VALUES, LISTING, MODEL))
    layers: tuple[str, ...] = option(
        kind=tuple, required=True, short="-l", metavar="LAYERS",
        help="Comma-separated layer paths or patterns (PATH, PATH:K for the K-th call, layer2.*); repeatable.",
        changes=VALUES)
    # a folder, list file, tars, or their URL (an argument)
    images: Path | str = dataclasses.field(default=None, metadata=marked_as(LISTING))
    # the finished HDF5 file (OUTPUT.partial first), or a URL
    output: Path | str = dataclasses.field(default=None, metadata=marked_as(()))
    weights: str = option("DEFAULT", short="-w", help="DEFAULT, a weights name (e.g. IMAGENET1K_V2), none, or a "
                                                      "checkpoint file.", changes=(VALUES, MODEL))
    seed: int = option(0, "Seed of the random network for --weights none.", changes=(VALUES, MODEL))
    transform: str | None = option(
        kind=str, optional=True, metavar="MODULE:CALLABLE", syntax=_callable_syntax("--transform"),
        help="Preprocessing: a transform, or a function/class making one.  [default: the model's own; for "
             "factories and files ResNet18_Weights.DEFAULT.transforms()]", changes=(VALUES, MODEL))
    trust_pickle: bool = option(False, "Allow --model to be a whole model saved with torch.save(model): unpickling "
                                       "runs its code.", changes=MODEL)
    batch_size: int | None = option(
        kind=int, optional=True, short="-b", minimum=1,
        help="Images (or clips) per forward pass.  [default: 64, fewer where a batch would take more than a quarter "
             "of the device's free memory (2 GB at most): large clips on a laptop]", changes=())
    num_workers: int | None = option(
        kind=int, optional=True, short="-j", minimum=0,
        help="DataLoader worker processes decoding images.  [default: the job's CPUs less one: "
             "SLURM_CPUS_PER_TASK, else the CPU affinity mask; none for a job of one batch]", changes=())
    device: str = option("auto", "auto, cpu, cuda or cuda:N.", syntax=_device_syntax, changes=COMPILED)
    array: str | None = option(
        kind=str, optional=True, metavar="NAME", syntax=_not_empty,
        help="IMAGES is a file of image arrays (HDF5, NetCDF-4, .npz) holding several: the one to read (its path "
             "in the file, e.g. imgBrick).  [default: the file's only image array]", changes=LISTING)
    image_column: str | None = option(
        kind=str, optional=True, metavar="NAME", syntax=_not_empty,
        help="IMAGES are Parquet tables: the column of encoded images.  [default: the one struct of bytes and path "
             "(Hugging Face's Image), else the one binary column]", changes=LISTING)
    label_column: str | None = option(
        kind=str, optional=True, metavar="NAME", syntax=_not_empty,
        help="IMAGES are Parquet tables: the column of integer labels.  [default: label, where there is one]",
        changes=LISTING)
    split: str | None = option(
        kind=str, optional=True, metavar="NAME", syntax=_not_empty,
        help="IMAGES are Parquet tables in Hugging Face's layout (train-00000-of-00002.parquet, "
             "default/validation/0000.parquet): the split to read; a folder of several splits is refused without "
             "it.  [default: the one split there is]", changes=LISTING)
    image_root: str | None = option(
        kind=str, optional=True, metavar="DIR", syntax=_not_empty,
        help="IMAGES are Parquet tables whose rows hold an image's relative path and no bytes: the folder those "
             "paths lie under.  [default: the table's folder, else the working folder, where the file is]",
        changes=LISTING)
    reader: str | None = option(
        kind=str, optional=True, metavar="NAME", syntax=_not_empty,
        help=lambda: f"The reader of IMAGES, by name: {_reader_names()}.  [default: the first that claims IMAGES]",
        changes=LISTING)
    reader_option: tuple[str, ...] = option(
        (), kind=tuple, metavar="NAME=VALUE", syntax=_name_value,
        items='options of the reader, e.g. ["map_size=1GB"]',
        help="An option the reader declares (a plugin's own; featdump's readers take theirs as --array, "
             "--image-column, --label-column and --split); repeatable.  [default: none]", changes=LISTING)
    clip: int | None = option(
        kind=int, optional=True, minimum=1, metavar="N",
        help="Videos: frames per clip, a row each.  [default: the model's own (a torchvision video model's weights "
             "state it), 1 for an image model: each sampled frame a row]", changes=LISTING)
    fps: float | None = option(
        kind=float, optional=True, minimum=0, metavar="F",
        help="Videos: frames sampled a second.  [default: the model's rate where it states one, else each video's "
             "own]", changes=LISTING)
    clip_every: float | None = option(
        kind=float, optional=True, minimum=0, metavar="SECONDS",
        help="Videos: a clip starts every SECONDS (1.49: on an fMRI's TR grid).  [default: --clip / --fps, clips "
             "back to back]", changes=LISTING)
    clip_origin: float | None = option(
        kind=float, optional=True, metavar="SECONDS",
        help="Videos: one time of the --clip-every grid, in seconds from a film's first frame (a film that starts "
             "between a scanner's pulses: the first pulse's time).  [default: 0, the first frame]", changes=LISTING)
    clip_anchor: str = option("start", "Videos: the grid of --clip-every gives each clip's start, or its end (each "
                                       "row the window of frames before an onset: causal, as for fMRI).",
                              choices=ANCHORS, changes=LISTING)
    clip_pad: str = option("skip", "Videos, --clip-anchor end: a window that reaches before a video's first frame "
                                   "is left out, or padded by repeating that frame (its clip_start is then < 0).",
                           choices=PADS, changes=LISTING)
    dtype: str = option("float32", "Storage dtype.", choices=DTYPES, changes=VALUES)
    reduce: tuple[str, ...] = option(
        (), kind=tuple, metavar="[PATTERN=]REDUCTION", syntax=check_rule, table=rules_from_table,
        items='reductions, e.g. ["avgpool", "layer2=srp:4096"]',
        help="What is kept of each layer, on the device: none, flatten, avgpool, maxpool, spacepool (a video "
             "layer pooled over space, its time kept), cls (first token), "
             "patchmean (a ViT's patch tokens), channels:A-B, srp:K (sparse random projection to K values; "
             "srp:K:SEED), countsketch:K (one nonzero per input: cheaper), pca:K (with --pca-fit). "
             "PATTERN=REDUCTION for the layers PATTERN selects (the most specific rule wins); repeatable.  "
             "[default: none]", changes=VALUES)
    pca_fit: str | None = option(
        kind=str, optional=True, metavar="N|PATH", syntax=_pca_fit_syntax,
        help="The fit set of --reduce pca:K: the first N images of IMAGES, or a folder or list file of reference "
             "images.", changes=FIT)
    compression: str = option("none", "HDF5 filter of the feature datasets (zstd and blosc need hdf5plugin).",
                              choices=COMPRESSIONS, changes=LAYOUT)
    precision: str = option("fp32", "Autocast precision of the forward pass.", choices=PRECISIONS,
    changes=(VALUES, COMPILED))
    decode: str = option("auto", "Decode JPEGs on the cpu (workers) or the gpu (nvjpeg); auto is cpu until the GPU "
                                 "path is measured.", choices=DECODERS, changes=VALUES)
    fast_decode: bool = option(False, "Decode large JPEGs at a reduced scale (1/2-1/8, never below twice the resize "
                                      "size) before the exact resize: several times faster on camera photos, "
                                      "features within about 1%.", changes=VALUES)
    compile: bool = option(False, "Compile the forward (the pruned graph) ahead of time into a package (torch.export "
                                  "+ AOTInductor) cached in --compile-cache: built once (a minute), loaded by later "
                                  "runs in seconds, checked against eager at the first batch; else torch.compile, "
                                  "else eager, with a log line saying why.", changes=COMPILED)
    compile_cache: str | None = option(
        kind=str, optional=True, metavar="DIR", syntax=_cache_folder,
        help="Folder of --compile's packages (DIR/aoti) and inductor's caches, shared by runs and by the tasks of "
             "an array (sets TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR).  [default: TORCHINDUCTOR_CACHE_DIR, "
             "else /tmp/torchinductor_USER]", changes=())
    store_patience: float = option(
        DEFAULT_PATIENCE, "Seconds a read from an object store or URL retries transient faults (timeouts, resets, "
                          "5xx, throttling), with backoff, before the job stops (exit 75) keeping its rows.",
        minimum=0, metavar="SECONDS", changes=())
    scratch: str | None = option(
        kind=str, optional=True, metavar="DIR", syntax=_scratch_folder,
        help="Local folder where an OUTPUT at a URL (s3://, gs://, ...) is written, with every guarantee of a local "
             "run, before its upload (the run's completion); a retry finds its partial file there.  [default: "
             "FEATDUMP_SCRATCH, else the temp folder, + /featdump-scratch]", changes=())
    proof: int = option(
        8, "Images recomputed on the reference path (CPU, fp32, eager, hooks, exact decoding) and compared with the "
           "run's rows, per layer, when the run is not that path (CUDA, bf16/fp16, --compile, --decode gpu, "
           "--fast-decode): most at the first batch, a few spread over the job; recorded in the output, and a "
           "layer beyond its tolerance stops the run. 0: no proof.", minimum=0, metavar="N", changes=())
    on_error: str = option("skip", "A bad image is skipped and recorded, or stops the run.", choices=ON_ERROR,
    changes=())
    overwrite: bool = option(False, "Replace an existing output (or partial output).", changes=())
    update: bool = option(False, "OUTPUT exists: extract only the images it lacks and append them (cron), and add "
                                 "the layers --layers names that it lacks, for every stored row; rows it has stay. "
                                 "A skipped input whose file changed since is read again.", changes=())
    retry_skipped: bool = option(False, "--update that reads again every input the output records as skipped, "
                                        "changed or not (a store that was away, a decoder installed since).",
                                        changes=())
    shard: str | None = option(
        kind=str, optional=True, metavar="K/N", syntax=parse_shard,
        help="Extract part K (0-based) of N of the sorted images into OUTPUT's shard file; `none` turns off the "
             "detection of SLURM job arrays and torchrun, which shard by themselves.", changes=())
    shard_pattern: str | None = option(
        kind=str, optional=True, metavar="PATTERN", syntax=lambda pattern: shard_pattern(Path("out.h5"), pattern),
        help="Shard file names with {k} and {n}, relative to OUTPUT's folder.  [default: OUT.shard-{k}-of-{n}.h5]",
        changes=())
    merge_timeout: float = option(3600.0, "Under torchrun, seconds rank 0 waits for every rank to finish before "
                                          "merging the shards.", minimum=1, changes=())
    space_check: bool = option(True, "Refuse to start when the disk looks too small for the expected output "
                                     "(--no-space-check: start anyway).", changes=())
    # the command line, recorded in the output (not an option)
    command: str = dataclasses.field(default="", metadata=marked_as(()))

    def __post_init__(self):
        for name, declared in OPTIONS.items():
            object.__setattr__(self, name, declared.check(getattr(self, name)))
        object.__setattr__(self, "images", as_location(self.images, "images"))
        object.__setattr__(self, "update", self.update or self.retry_skipped)
        object.__setattr__(self, "output", as_location(self.output, "output"))  # a URL: `job.staging` uploads it
        object.__setattr__(self, "reduce", tuple(canonical_rule(item) for item in self.reduce))  # one spelling
        if uses_pca(self.reduce) != (self.pca_fit is not None):
            raise BadOption("--reduce pca:K needs --pca-fit N (the first N images) or --pca-fit PATH (a folder or "
                            "list file of reference images)." if self.pca_fit is None else
                            "--pca-fit is the fit set of --reduce pca:K, and no --reduce rule uses pca:K.")

    def effective(self) -> dict:
        """Every setting as plain JSON values: the configuration a file records."""
        return {key: (str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value)
                for key, value in dataclasses.asdict(self).items()}


OPTIONS: dict[str, Option] = options_of(Settings)
