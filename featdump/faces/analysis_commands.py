"""The analysis commands of the CLI (rdm, cka, probe, encode, top, atlas): Click commands on `faces.cli`'s group
that parse options, call the library and say what was written."""

from __future__ import annotations

import time
from pathlib import Path

import click

from featdump.analysis.choices import COMPARISONS, DEFAULT_MEMORY, METRICS, RESAMPLES
from featdump.faces import sayings
from featdump.faces.group import click_option, main
from featdump.faces.terminal import progress_for
from featdump.readout.choices import DEFAULT_ALPHAS, DEFAULT_FOLDS


def _analysis_options(command):
    """The options `rdm` and `cka` share: the slabs' memory, the device, a picture, overwriting."""
    for option in reversed([
        click.option("--memory", default=DEFAULT_MEMORY, show_default=True,
                     help="Memory for the slabs of a layer read at once (128MB, 4GB), beyond the N x N results: any "
                          "layer's width fits it."),
        click_option("device"),
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
@click.option("--repeats", is_flag=True,
              help="Rows of TARGETS naming the same image are its trials (NSD's three): their mean is fitted, and "
                   "each target's noise ceiling (NCSNR) bounds its score.")
@click.option("--rois", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A CSV of target,region lines: each layer's score, interval and tests per region.")
@click.option("--samples", default=1000, show_default=True, type=click.IntRange(min=2),
              help="Bootstrap resamples of the images for the regions' intervals and tests.")
@click.option("--fdr", is_flag=True, help="Correct the pairs' p by Benjamini-Hochberg's FDR (else Bonferroni).")
@click.option("--table", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the scores per layer and region (.csv, the pairs' tests in TABLE.pairs.csv; or .nc).")
@_readout_options
def encode(output: Path, targets: str, alpha_per_target: bool, delays: str | None, gap: float | None,
           repeats: bool, rois: Path | None, samples: int, fdr: bool, table: Path | None,
           layers: str | None, folds: int, alphas: str, seed: int, common: bool, to: Path, memory: str, device: str,
           plot: Path | None, overwrite: bool) -> None:
    """Ridge encoding models from every layer of OUTPUT to TARGETS (neurons, voxels, behaviour), out of core,
    cross-validated, alpha chosen by leave-one-out in each fold. TARGETS: a CSV/TSV with a `path` column and a column
    per target, an .npy in OUTPUT's row order, or FILE.h5:DATASET with a `paths` dataset. Records every image's
    held-out predictions, each target's Pearson r and R^2, each layer's median r. With --repeats, --rois or
    --table: each layer's score per region with its 95% interval (a bootstrap over the images), the noise
    ceiling and the share of it reached (--repeats), and tests between the layers in each region.

    \b
    Example:
      featdump encode feats.h5 it_neurons.csv -l 'layer*' -o enc.h5 --plot enc.png
      featdump encode film.h5 bold.csv --delays 1,2,3,4 -o enc.h5     # clip rows on a TR grid
      featdump encode feats.h5 betas.h5:betas --repeats --rois rois.csv --table v4.csv -o enc.h5
    """
    from featdump.readout.readouts import encode as compute

    started, done_before = time.perf_counter(), to.exists() and not overwrite
    readouts = compute(output, targets, layers, folds=folds, alphas=alphas, per_target=alpha_per_target,
                       common=common, seed=seed, memory=memory, device=device, to=to, overwrite=overwrite,
                       progress=progress_for("MB"), delays=delays, gap=gap, repeats=repeats, rois=rois,
                       samples=samples, fdr=fdr, table=table)
    click.echo(sayings.readouts_line("encode", readouts, to, plot, started, done_before), err=True)


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


@main.command()
@click.argument("rdms", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("data", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-l", "--layers", help="Layers (names or patterns; comma-separated).  [default: all]")
@click.option("--method", type=click.Choice(COMPARISONS), default="corr", show_default=True,
              help="How a layer's RDM is compared with a subject's, as rsatoolbox names it.")
@click.option("--bootstrap", "resample", type=click.Choice(RESAMPLES), default="subjects", show_default=True,
              help="What the bootstrap draws with replacement: subjects, images, both, or none (no interval).")
@click.option("--samples", default=1000, show_default=True, type=click.IntRange(min=2), help="Bootstrap samples.")
@click.option("--seed", default=0, show_default=True, type=int, help="The bootstrap's seed.")
@click.option("--fdr", is_flag=True, help="Correct the pairs' p by Benjamini-Hochberg's FDR (else Bonferroni).")
@click.option("--common", is_flag=True, help="Compare over the images both files name (else they must match).")
@click.option("--indices", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write each resample's subject and image indices here (.npz).")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Also draw the layers' scores, intervals, the ceiling and the differing pairs (.png).")
@click.option("--memory", default=DEFAULT_MEMORY, show_default=True,
              help="Memory for the data RDMs held at once (128MB, 4GB): where all subjects' do not fit, each is "
                   "read from DATA when used. One layer's RDM comes on top.")
@click.option("-o", "--out", "to", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The table to write: .csv (a row per layer; the pairs' tests in OUT.pairs.csv beside it) or .nc "
                   "(NetCDF: both, for xarray).")
def compare(rdms: tuple[Path, ...], data: Path, layers: str | None, method: str, resample: str, samples: int, seed: int,
            fdr: bool, common: bool, indices: Path | None, plot: Path | None, memory: str, to: Path) -> None:
    """Which of RDMS' layers explains the data RDMs in DATA best, and how sure: each layer's mean comparison over
    subjects, its bootstrap interval and test against zero, the noise ceiling, and tests between every pair of
    layers. RDMS: a `featdump rdm` file, or an output (its RDMs computed beside it first); several: each model's,
    its layers named FILE:LAYER and tested against the others'. DATA: HDF5 or .npz holding `rdms` (subjects x N x
    N) and `paths`.

    \b
    Example:
      featdump compare rdms.h5 v4.npz --method spearman --bootstrap both -o v4.csv
    """
    from featdump.analysis.compare import compare as run

    if not rdms:  # click gives a lone file to DATA, the last argument
        raise click.UsageError(f"Missing argument 'DATA': {data} is taken as the model's RDMs (or output); name the "
                               "data RDMs after it: featdump compare RDMS... DATA -o RESULT.")
    started = time.perf_counter()
    result = run(list(rdms), data, layers, method=method, resample=resample, samples=samples, seed=seed, fdr=fdr,
                 common=common, to=to, indices=indices, memory=memory)
    if plot is not None:
        from featdump.faces.compared import draw

        draw(result, plot, method)
    best = int(result.scores.argmax())
    click.echo(f"Compared {len(result.layers)} layers with {result.subjects} subjects over {result.images} images "
               f"into {to} in {time.perf_counter() - started:.1f} s: best {result.layers[best]} "
               f"({result.scores[best]:.3f}; ceiling {result.ceiling[0]:.3f} to {result.ceiling[1]:.3f}).", err=True)
