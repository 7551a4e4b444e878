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

from featdump.analysis.choices import DEFAULT_MEMORY, METRICS
from featdump.errors import FeatdumpError, NoImages
from featdump.faces import sayings
from featdump.faces.terminal import progress_for, setup_logging
from featdump.job.options import Option
from featdump.job.settings import OPTIONS, Settings
from featdump.readout.choices import DEFAULT_ALPHAS, DEFAULT_FOLDS
from featdump.version import __version__

log = logging.getLogger("featdump")


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _Group(click.Group):
    """Turns featdump's errors, and Click's usage errors, into one-line messages with their exit codes, never a
    traceback or a usage block."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:  # `featdump nosuch`, a bad global option
            if isinstance(error, _NO_ARGS_IS_HELP):  # plain `featdump`: the help, as Click shows it
                raise
            _fail(_usage_line(error, "featdump --help"), 2)

    def invoke(self, ctx: click.Context):
        given = list(ctx.args)  # the subcommand's arguments (Click empties ctx.args as it invokes)
        try:
            return super().invoke(ctx)
        except click.UsageError as error:  # a subcommand's: missing argument, bad path, unknown option
            name = ctx.invoked_subcommand
            _fail(_usage_line(error, f"featdump {name} --help" if name else "featdump --help")
                  + sayings.spaced_layers(given), 2)
        except FeatdumpError as error:
            _fail(str(error) + (sayings.spaced_layers(given) if isinstance(error, NoImages) else ""), error.exit_code)
        except KeyboardInterrupt:
            _fail("Interrupted before any batch was written.", 130)
        except BrokenPipeError:  # `featdump list-layers resnet50 | head`
            sys.stderr.close()
            ctx.exit(0)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as error:
            if ctx.find_root().params.get("verbose", 0) >= 2:
                raise
            _fail(f"Internal error: {type(error).__name__}: {error} (rerun with -vv for the traceback).", 1)


def _usage_line(error: click.UsageError, help_command: str) -> str:
    """Click's message in one line, with where to look: `Error: Missing option '-m'. See `featdump extract --help`.`"""
    message = " ".join(error.format_message().split())
    return f"{message}{'' if message.endswith('.') else '.'} See `{help_command}`."


def _fail(message: str, exit_code: int):
    exception = click.ClickException(message)
    exception.exit_code = exit_code
    raise exception


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "FEATDUMP"})
@click.version_option(__version__, prog_name="featdump")
@click.option("-v", "--verbose", count=True, help="More detail: -v stage timings and skipped images, -vv tracebacks.")
@click.option("-q", "--quiet", is_flag=True, help="Only errors and the final summary.")
def main(verbose: int, quiet: bool) -> None:
    """Dump intermediate activations of vision models (torchvision, timm, your own) over images into HDF5.

    \b
    featdump list-layers resnet18
    featdump extract --model resnet18 --layers layer3.0.downsample.1,avgpool ./images out.h5
    featdump info out.h5
    featdump show out.h5 --layer layer3.0.downsample.1 -o fmap.png

    Shell completion (bash): eval "$(_FEATDUMP_COMPLETE=bash_source featdump)"
    """
    setup_logging(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)


def console() -> None:
    """The `featdump` command: `main`, then an exit without Python's last garbage collection, which walks the
    300,000-odd objects torch and torchvision leave (1-1.5 s of every command on a 2-core Zen 3). Every file a command
    writes is closed before it returns, and HDF5 closes any left open at exit in any case."""
    try:
        main(prog_name="featdump")
    finally:
        gc.freeze()


class _Checked(click.ParamType):
    """A Click type that checks a value with its option's own declaration (the API and config files use the same)."""

    def __init__(self, declared: Option):
        self.declared = declared
        self.name = {int: "integer", float: "float"}.get(declared.kind, "text")

    def convert(self, value, param, ctx):
        # A BadOption raised here reaches the user as the same one line the API and config files give.
        return self.declared.from_text(value) if isinstance(value, str) else self.declared.check(value)


class _GeneratedHelp(click.Option):
    """An option whose help is generated when shown (a list of kinds read from a registry, which loads them)."""

    def __init__(self, *args, generated, **kwargs):
        super().__init__(*args, **kwargs)
        self.generated = generated

    def get_help_record(self, ctx):
        self.help = self.generated()
        return super().get_help_record(ctx)


class _KindsOfInput(click.Command):
    """A command whose help lists the kinds of input the readers read where it says INPUT_KINDS."""

    def format_help_text(self, ctx, formatter):
        from featdump.inputs.readers import input_kinds

        self.help = self.help.replace("INPUT_KINDS", input_kinds())
        super().format_help_text(ctx, formatter)


def _click_option(name: str):
    """The Click option of the extract option NAME, derived from its one declaration in Settings."""
    declared = OPTIONS[name]
    spellings = [*([declared.short] if declared.short else []), declared.flag]
    keywords = {"generated": declared.help, "cls": _GeneratedHelp} if callable(declared.help) else \
        {"help": declared.help}
    if declared.kind is bool:
        if declared.default:  # on by default: --space-check/--no-space-check
            spellings = [f"{declared.flag}/--no-{declared.flag[2:]}"]
        return click.option(*spellings, name, is_flag=True, default=declared.default, **keywords)
    if declared.kind is tuple:
        return click.option(*spellings, name, multiple=True, required=declared.required, metavar=declared.metavar,
                            **keywords)
    metavar = declared.metavar or ("[" + "|".join(declared.choices) + "]" if declared.choices else None)
    return click.option(*spellings, name, type=_Checked(declared), required=declared.required, metavar=metavar,
                        default=declared.default, show_default=declared.default is not None, **keywords)


def _extract_options(command):
    """Every extract option, in declaration order."""
    for name in reversed(OPTIONS):
        command = _click_option(name)(command)
    return command


@main.command("list-layers")
@click.argument("model")
@click.option("--depth", type=click.IntRange(min=1), help="Show modules down to this depth only.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per module instead of a tree.")
@_click_option("transform")
@_click_option("trust_pickle")
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
            _fail(str(error), error.exit_code)
    return path


@main.command(cls=_KindsOfInput)
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
@_extract_options
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
@_click_option("shard_pattern")
@click.option("--copy/--view", default=None,
              help="A self-contained file (--copy; always, for shards in a store), or virtual datasets over the "
                   "shards (--view).  [default: a copy of shards under 64 MiB of rows each, which a view reads "
                   "slowly; else a view]")
@_click_option("overwrite")
@_click_option("scratch")
@_click_option("store_patience")
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


def _analysis_options(command):
    """The options `rdm` and `cka` share: the slabs' memory, the device, a picture, overwriting."""
    for option in reversed([
        click.option("--memory", default=DEFAULT_MEMORY, show_default=True,
                     help="Memory for the slabs of a layer read at once (128MB, 4GB), beyond the N x N results: any "
                          "layer's width fits it."),
        _click_option("device"),
        click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
                     help="Also draw the result into this PNG (as `featdump show` does)."),
        click.option("--overwrite", is_flag=True, help="Replace an existing --out."),
    ]):
        command = option(command)
    return command


@main.command()
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-l", "--layers", help="Layers (names or patterns, as for extract; comma-separated).  [default: all]")
@click.option("--metric", type=click.Choice(METRICS), default="correlation", show_default=True,
              help="correlation: 1 - Pearson's r; euclidean: the mean squared difference (as rsatoolbox's); cosine.")
@click.option("-o", "--out", "to", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The HDF5 file to write: /rdms/LAYER (N x N), /paths, /labels.")
@_analysis_options
def rdm(output: Path, layers: str | None, metric: str, to: Path, memory: str, device: str, plot: Path | None,
        overwrite: bool) -> None:
    """Representational dissimilarity matrices of OUTPUT's layers, out of core: each layer read once, in slabs
    that fit --memory; a killed run resumes at the first layer not written.

    \b
    Example:
      featdump rdm feats.h5 -l 'layer*' --metric correlation -o rdms.h5 --plot rdms.png
    """
    from featdump.analysis.rdm import rdm as compute

    started, done_before = time.perf_counter(), to.exists() and not overwrite  # then made by this same command
    matrices = compute(output, layers, metric=metric, memory=memory, device=device, to=to, overwrite=overwrite,
                       progress=progress_for("MB"))
    click.echo(sayings.rdms_line(metric, matrices, to, plot, started, done_before), err=True)


@main.command()
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("other", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-l", "--layers", help="OUTPUT's layers (names or patterns; comma-separated).  [default: all]")
@click.option("--other-layers", help="OTHER's layers.  [default: all]")
@click.option("--unbiased", is_flag=True, help="The debiased HSIC estimator (Song et al. 2012) instead of the biased.")
@click.option("--common", is_flag=True, help="Compare two outputs over the images both hold (else they must match).")
@click.option("-o", "--out", "to", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The HDF5 file to write: /cka with the attributes rows and columns (layer names).")
@_analysis_options
def cka(output: Path, other: Path | None, layers: str | None, other_layers: str | None, unbiased: bool, common: bool,
        to: Path, memory: str, device: str, plot: Path | None, overwrite: bool) -> None:
    """Linear CKA between every pair of OUTPUT's layers, or between OUTPUT's and OTHER's (two models on the same
    images, rows matched by path), out of core; a killed run resumes at the first Gram matrix not computed.

    \b
    Example:
      featdump cka resnet.h5 vit.h5 -l 'layer*' --other-layers 'encoder.layers.*' -o cka.h5 --plot cka.png
    """
    from featdump.analysis.cka import cka as compute

    started, done_before = time.perf_counter(), to.exists() and not overwrite  # then made by this same command
    result = compute(output, other, layers=layers, other_layers=other_layers, unbiased=unbiased, common=common,
                     memory=memory, device=device, to=to, overwrite=overwrite, progress=progress_for("MB"))
    click.echo(sayings.cka_line(result, unbiased, to, plot, started, done_before), err=True)


def _readout_options(command):
    """The options `probe` and `encode` share, then those of every analysis."""
    command = _analysis_options(command)
    for option in reversed([
        click.option("-l", "--layers", help="Layers (names or patterns, as for extract; comma-separated).  "
                                            "[default: all]"),
        click.option("--folds", default=DEFAULT_FOLDS, show_default=True, type=click.IntRange(min=2),
                     help="Cross-validation folds (seeded; stratified by class for a probe)."),
        click.option("--alphas", default=DEFAULT_ALPHAS, show_default=True,
                     help="The ridge penalties to choose from by leave-one-out in each fold: 0.1,1,10 or FROM:TO:COUNT "
                          "(log-spaced)."),
        click.option("--seed", default=0, show_default=True, type=int, help="The folds' seed."),
        click.option("--common", is_flag=True, help="Use the images both the output and the labels or targets name "
                                                    "(else they must match)."),
        click.option("-o", "--out", "to", required=True, type=click.Path(dir_okay=False, path_type=Path),
                     help="The HDF5 file to write: /readouts/LAYER (held-out predictions, alphas, scores), /fold, "
                          "/paths."),
    ]):
        command = option(command)
    return command


@main.command()
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--labels", type=click.Path(dir_okay=False, path_type=Path),
              help="A CSV/TSV of path,label to probe for.  [default: the output's labels (class folders, tar .cls)]")
@_readout_options
def probe(output: Path, labels: Path | None, layers: str | None, folds: int, alphas: str, seed: int, common: bool,
          to: Path, memory: str, device: str, plot: Path | None, overwrite: bool) -> None:
    """A linear probe of every layer of OUTPUT, out of core: a ridge classifier (one-vs-rest, as scikit-learn's
    RidgeClassifierCV), cross-validated over stratified folds, alpha chosen by leave-one-out in each fold. Records
    each fold's accuracy and alpha and every image's held-out decision values; a killed run resumes at the first
    layer not written.

    \b
    Example:
      featdump probe feats.h5 -l 'layer*,avgpool' -o probes.h5 --plot probes.png
      featdump probe feats.h5 --labels labels.csv -o probes.h5
    """
    from featdump.readout.readouts import probe as compute

    started, done_before = time.perf_counter(), to.exists() and not overwrite
    readouts = compute(output, layers, folds=folds, alphas=alphas, labels=labels, common=common, seed=seed,
                       memory=memory, device=device, to=to, overwrite=overwrite, progress=progress_for("MB"))
    click.echo(sayings.readouts_line("probe", readouts, to, plot, started, done_before), err=True)


@main.command()
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("targets")
@click.option("--alpha-per-target", is_flag=True,
              help="Choose an alpha for each target (else one for all, as RidgeCV).")
@click.option("--delays", metavar="D1,D2,...",
              help="Clip rows: fit each layer's features at these earlier onsets of the same video, stacked (FIR "
                   "delays of the haemodynamic response): steps of the rows' grid (1,2,3,4) or seconds (1.5s,3s); "
                   "zeros before a video's first row.")
@click.option("--gap", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Clip rows cut into stretches of time (fewer videos than folds): seconds of a video left out of a "
                   "fold's training on both sides of its held-out stretch.  [default: the longest delay plus one "
                   "step of the grid]")
@_readout_options
def encode(output: Path, targets: str, alpha_per_target: bool, delays: str | None, gap: float | None,
           layers: str | None, folds: int, alphas: str, seed: int, common: bool, to: Path, memory: str, device: str,
           plot: Path | None, overwrite: bool) -> None:
    """Ridge encoding models from every layer of OUTPUT to TARGETS (neurons, voxels, behaviour), out of core,
    cross-validated, alpha chosen by leave-one-out in each fold. TARGETS: a CSV/TSV with a `path` column and a column
    per target, an .npy in OUTPUT's row order, or FILE.h5:DATASET with a `paths` dataset. Records every image's
    held-out predictions, each target's Pearson r and R^2, each layer's median r.

    \b
    Example:
      featdump encode feats.h5 it_neurons.csv -l 'layer*' -o enc.h5 --plot enc.png
      featdump encode film.h5 bold.csv --delays 1,2,3,4 -o enc.h5     # clip rows on a TR grid
    """
    from featdump.readout.readouts import encode as compute

    started, done_before = time.perf_counter(), to.exists() and not overwrite
    readouts = compute(output, targets, layers, folds=folds, alphas=alphas, per_target=alpha_per_target,
                       common=common, seed=seed, memory=memory, device=device, to=to, overwrite=overwrite,
                       progress=progress_for("MB"), delays=delays, gap=gap)
    click.echo(sayings.readouts_line("encode", readouts, to, plot, started, done_before), err=True)


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


@main.command()
@click.argument("output")
@click.option("-l", "--layers", help="Layers (names or patterns, as for extract; comma-separated).  [default: all]")
@click.option("-k", "k", default=16, show_default=True, type=click.IntRange(min=1),
              help="Images kept per unit, at the top and at the bottom.")
@click.option("--score", type=click.Choice(["max", "mean"]), default="max", show_default=True,
              help="A unit's score for an image: the maximum over its positions (and where it lies), or the mean.")
@click.option("--memory", default="1GB", show_default=True, help="Memory for the slab of rows read at once.")
@click.option("-o", "--out", "to", type=click.Path(dir_okay=False, path_type=Path),
              help="The HDF5 file to write: /top/LAYER/{rows,values,positions,bottom_rows,bottom_values}.  "
                   "[default: OUTPUT.top.h5 beside OUTPUT; for an OUTPUT at a URL, computed on a copy on the local "
                   "scratch disk and uploaded beside it]")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out.")
def top(output: str, layers: str | None, k: int, score: str, memory: str, to: Path | None, overwrite: bool) -> None:
    """The K images that drive each unit of OUTPUT's layers most and least, out of core: each layer read once in
    slabs that fit --memory; a killed run resumes at the first layer not written. Ties go to the lower row.

    \b
    Example:
      featdump top feats.h5 -l layer4,avgpool -k 16
    """
    from featdump.units.top import top as rank
    from featdump.units.top import written_to

    started = time.perf_counter()
    ranked = rank(output, layers, k=k, score=score, memory=memory, to=to, overwrite=overwrite,
                  progress=progress_for("MB"))
    units = sum(len(ranking.rows) for ranking in ranked.values())
    click.echo(f"Ranked {units} units of {len(ranked)} layer{'s' * (len(ranked) != 1)} into "
               f"{written_to(output, to)} in {time.perf_counter() - started:.1f} s.", err=True)


@main.command()
@click.argument("output", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", "folder", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The folder of the site (index.html); made if missing.")
@click.option("-l", "--layers", help="Layers (names or patterns, as for extract; comma-separated).  [default: all]")
@click.option("-k", "k", default=16, show_default=True, type=click.IntRange(min=1),
              help="Images shown per unit, at the top and at the bottom.")
@click.option("--memory", default="1GB", show_default=True, help="Memory for the slab of rows read at once.")
@click.option("--overwrite", is_flag=True, help="Rank again into OUTPUT.top.h5 though it holds another ranking.")
def atlas(output: Path, folder: Path, layers: str | None, k: int, memory: str, overwrite: bool) -> None:
    """A static site of what each unit of OUTPUT's layers answers to: an index (searchable, paged) and a page per
    unit with its top and bottom images as the model saw them, their values, where a map's maximum lies, its
    histogram and its top images' classes; the arrow keys move between units. Plain files: open DIR/index.html
    from disk or a bucket. A rerun writes only what changed.

    \b
    Example:
      featdump atlas feats.h5 -l layer4 -o atlas/
    """
    from featdump.faces.atlas import atlas as build

    started = time.perf_counter()
    written = build(output, folder, layers, k=k, memory=memory, overwrite=overwrite)
    click.echo(f"Wrote {written.changed} files ({written.unchanged} unchanged) of {written.folder / 'index.html'} "
               f"in {time.perf_counter() - started:.1f} s.", err=True)
