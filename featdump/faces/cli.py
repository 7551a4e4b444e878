"""CLI: Click commands that parse options, call the library, and turn its errors into messages."""

from __future__ import annotations

import gc
import json
import logging
import shlex
import sys
import time
from pathlib import Path

import click

from featdump.errors import FeatdumpError
from featdump.faces import (
    analysis_commands,  # noqa: F401  (registers rdm, cka, probe, encode, top, atlas)
    )
from featdump.faces.group import KindsOfInput, click_option, extract_options, fail, main
from featdump.faces.terminal import progress_for
from featdump.job.settings import Settings

log = logging.getLogger("featdump")


def console() -> None:
    """The `featdump` command: `main`, then an exit without Python's last garbage collection, which walks the
    300,000-odd objects torch and torchvision leave (1-1.5 s of every command on a 2-core Zen 3). Every file a command
    writes is closed before it returns, and HDF5 closes any left open at exit in any case."""
    try:
        main(prog_name="featdump")
    finally:
        gc.freeze()


@main.command("list-layers")
@click.argument("model")
@click.option("--depth", type=click.IntRange(min=1), help="Show modules down to this depth only.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per module instead of a tree.")
@click_option("transform")
@click_option("trust_pickle")
@click.option("--match", "pattern", metavar="PATTERN",
              help="Only the layers PATTERN selects, as --layers would (layer2.*, layer2.**.conv1, relu:*).")
def list_layers(model: str, depth: int | None, as_json: bool, transform: str | None, trust_pickle: bool,
                pattern: str | None) -> None:
    """List every module path of MODEL with its type, output shape and calls per forward.

    Shapes come from one dry forward of a randomly initialised MODEL on a dummy batch of its
    preprocessing's size; they exclude the batch dimension. A module that runs several times per
    forward is selected with PATH:K.

    \b
    Example:
      featdump list-layers resnet18 --depth 2
      featdump list-layers timm:convnext_tiny --json
      featdump list-layers vit_b_16 --match 'encoder.layers.*'
    """
    from featdump.faces.layers import layer_listing

    for line in layer_listing(model, depth, as_json, transform, trust_pickle, pattern):
        click.echo(line)


def _read_config(ctx: click.Context, param, path: Path | None):
    """--config FILE: its options become defaults, below environment variables and the command line."""
    if path is not None:
        from featdump.job.config import read_config

        try:
            ctx.default_map = {**(ctx.default_map or {}), **read_config(path)}
        except FeatdumpError as error:
            fail(str(error), error.exit_code)
    return path


@main.command(cls=KindsOfInput)
@click.argument("images")
@click.argument("output", type=click.Path(dir_okay=False))
@click.option("-c", "--config", type=click.Path(exists=True, dir_okay=False, path_type=Path), is_eager=True,
              expose_value=True, callback=_read_config,
              help="TOML file of options (keys: the option names with underscores); the environment "
                   "(FEATDUMP_EXTRACT_*) and the command line override it.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="auto", default=None, metavar="[ADDRESS]",
              help="Run the job on a Ray cluster (RAY_ADDRESS, ADDRESS, or a local one without either), one task per "
                   "shard, retried when its worker dies; the shards are merged at the end (featdump[ray]).")
@click.option("--shards", type=click.IntRange(min=1), metavar="N",
              help="With --ray: how many shards (tasks) the job is split into.  [default: 4 per task the cluster "
                   "runs at once]")
@click.option("--merge/--no-merge", "merge_shards", default=True, show_default=True,
              help="With --ray: merge the shards into OUTPUT at the end (through --scratch for a store's: twice "
                   "their size on the driver's disk), or leave them where they lie for `featdump merge` later.")
@extract_options
def extract(images: str, output: str, ray_address: str | None, shards: int | None, merge_shards: bool,
            **options) -> None:
    """Extract the activations of --layers for every image in IMAGES into the HDF5 file OUTPUT.

    IMAGES is INPUT_KINDS. Files may be at a URL too (credentials and endpoints as fsspec and the AWS/GCS
    tools take them). OUTPUT is written as
    OUTPUT.partial and renamed when every image is done; the same command again after an interruption
    resumes where it stopped.

    \b
    Example:
      featdump extract -m resnet50 -l layer3,avgpool --reduce avgpool ./images feats.h5
      featdump extract --config configs/linear_probe.toml ./images feats.h5
    """
    options.pop("config")
    settings = Settings(images=images, output=output, command=shlex.join(["featdump", *sys.argv[1:]]), **options)
    from featdump.engines.choice import run_extract

    summary = run_extract(settings, progress_for(), ray_address, shards, merge_shards)
    click.echo(summary.line(), err=True)


@main.command()
@click.argument("output")
@click_option("shard_pattern")
@click.option("--copy/--view", default=None,
              help="A self-contained file (--copy; always, for shards in a store), or virtual datasets over the "
                   "shards (--view).  [default: a copy of shards under 64 MiB of rows each, which a view reads "
                   "slowly; else a view]")
@click_option("overwrite")
@click_option("scratch")
@click_option("store_patience")
def merge(output: str, shard_pattern: str | None, copy: bool | None, overwrite: bool, scratch: Path | None,
          store_patience: float) -> None:
    """Join the finished shards of OUTPUT (OUTPUT.shard-K-of-N.h5) into OUTPUT.

    Checks that all N shards exist, are finished and were made with one configuration, then writes
    OUTPUT with virtual datasets over the shards' features (instant; keep the shards beside it), or a
    copy of small shards' rows, and the paths, labels and skipped images joined in order. The result
    reads like one run's output.
    OUTPUT may be a URL (s3://bucket/run/out.h5): the shards in the store are copied to --scratch,
    merged there into a self-contained file, and that file is uploaded to OUTPUT.

    \b
    Example:
      featdump merge feats.h5            # feats.shard-0-of-8.h5 ... feats.shard-7-of-8.h5
      featdump merge --copy feats.h5     # a self-contained file
      featdump merge --view feats.h5     # virtual datasets, however small the shards
      featdump merge s3://bucket/run/feats.h5
    """
    from featdump.inputs.stores import Patience
    from featdump.output.places import merge_at

    started = time.perf_counter()
    merged, view = merge_at(output, shard_pattern, copy=copy, overwrite=overwrite, scratch=scratch,
                            patience=Patience(store_patience))
    click.echo(f"Merged into {merged} in {time.perf_counter() - started:.1f} s"
               f"{' (virtual datasets over the shards)' if view else ' (self-contained copy)'}.", err=True)


@main.command()
@click.argument("output")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts and dashboards).")
def info(output: str, as_json: bool) -> None:
    """Describe an output file (or OUTPUT.partial of an unfinished run, or OUTPUT's shards; at a URL, the
    output or its shards in the store).

    \b
    Example:
      featdump info feats.h5
      featdump info --json feats.h5 | jq .rows
    """
    from featdump.faces.info import describe, read_info

    if as_json:
        click.echo(json.dumps(read_info(output), indent=2))
        return
    for line in describe(output):
        click.echo(line)


@main.command()
@click.argument("output", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-l", "--layer", help="Layer to draw (default: the file's first).")
@click.option("-i", "--index", default=0, show_default=True, type=click.IntRange(min=0), help="Row (image) to draw.")
@click.option("-o", "--out", "picture", type=click.Path(dir_okay=False, path_type=Path),
              help="PNG to write.  [default: OUTPUT-LAYER-INDEX.png beside OUTPUT]")
@click.option("--channels", default=16, show_default=True, type=click.IntRange(min=1, max=64),
              help="How many of the strongest channels (or units) to draw.")
def show(output: Path, layer: str | None, index: int, picture: Path | None, channels: int) -> None:
    """Draw one image's features: the input image, the channel-mean map and the strongest channels
    (a bar plot of the strongest units for pooled or vector layers); or the RDMs or CKA matrix of a file that
    `featdump rdm` or `featdump cka` wrote. Needs matplotlib.

    \b
    Example:
      featdump show feats.h5 --layer layer3 --index 0 -o fmap.png
      featdump show rdms.h5 -o rdms.png
    """
    from featdump.faces.matrices import draw_results, is_results
    from featdump.faces.show import draw

    if is_results(output):
        written = draw_results(output, picture or output.with_suffix(".png"))
    else:
        written = draw(output, layer, index, picture, channels)
    click.echo(f"Wrote {written}.", err=True)


@main.command()
@click.option("-m", "--model", default="resnet50", show_default=True, help="The model a job would run.")
@click.option("-l", "--layers", default="avgpool", show_default=True, help="Its layers, as extract takes them.")
@click.option("-w", "--weights", default="none", show_default=True,
              help="Weights to load (none: random ones, the same speed, nothing downloaded).")
@click.option("-b", "--batch-size", type=click.IntRange(min=1), help="Images per batch.  [default: 32]")
@click.option("--batches", default=3, show_default=True, type=click.IntRange(min=2),
              help="Batches measured in each configuration (the first is the warm-up).")
@click.option("--try", "asked", metavar="WORDS",
              help="Only the configurations these words name (cpu, cuda, fp32, bf16, fp16, compile), comma "
                   "separated; a precision named is tried even where it has no native kernels.  [default: every "
                   "configuration this machine runs natively, --compile included]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
def doctor(model: str, layers: str, weights: str, batch_size: int | None, batches: int, asked: str | None,
           as_json: bool) -> None:
    """What this machine offers MODEL's LAYERS, and the fastest configuration the proof accepts.

    Says the CPU's instruction set and its native precisions, the GPUs, the versions, whether --compile
    builds here and the free disk; then runs a few batches of generated images in each configuration
    (fp32, compiled, bf16 and fp16 where native, on the CPU and each GPU), each proved against the CPU's fp32
    as a real run is, and prints the fastest accepted as a command line to copy.

    \b
    Example:
      featdump doctor -m resnet50 -l avgpool
      featdump doctor -m vit_b_16 -l encoder.ln --try cuda,bf16,fp16 --json
    """
    from featdump.faces.doctor import describe, examine

    base = Settings(model=model, layers=layers, weights=weights, batch_size=batch_size or 32, images=".",
                    output="doctor.h5")
    words = [word.strip() for word in asked.split(",") if word.strip()] if asked else None
    unknown = sorted(set(words or []) - {"cpu", "cuda", "fp32", "bf16", "fp16", "compile"})
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: name cpu, cuda, fp32, bf16, fp16 or compile.",
                                 param_hint="'--try'")
    if log.getEffectiveLevel() > logging.DEBUG:  # the trials' own lines only with -v
        log.setLevel(logging.WARNING)

    def report(trial):
        click.echo(f"doctor: {trial.configuration.name}: {trial.outcome}"
                   f"{f' at {trial.rows_per_second:.1f} rows/s' if trial.rows_per_second else ''}", err=True)

    result = examine(base, batches, words, Path.cwd(), report)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        for line in describe(result):
            click.echo(line)
    if result["recommended"] is None:  # nothing ran: a script must not read this as a recommendation
        click.get_current_context().exit(1)


