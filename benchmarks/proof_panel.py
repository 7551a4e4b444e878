"""The proof's panel: no false alarm on sound runs, every injected fault caught (docs/proof.md).

    python -m benchmarks.proof_panel [--models resnet50,...] [--seeds 0,1] [--configurations bf16,fp16,...]
                                     [--faults shifted,zeroed,channel,scaled,wrong-layer] [--out DIR] [--slow-fp16]
                                     [--no-misfits]

12 architectures of different families (random weights, two seeds), each at a shallow, a middle and the deepest
layer and its output, run in-process on 8 images (one batch: the default proof of 8 samples every row) in bf16,
fp16, --fast-decode and --compile; then, under bf16 (the noisiest precision), with each fault injected in the copy
of every batch's rows to the host (`tests/makers/faults.py`), into the deepest layer's and the output's rows alone
(where bf16's own error is largest; the shallow layers stay sound), but a 2% channel scale into the shallow layer's
(its first channel that is not all zeros). A sound run must finish; a faulty one must stop with the proof's one
line; a model a precision does not fit (MISFITS: a layer bf16 rounds away, weights fp16 cannot hold) must stop
saying so. Each row of the table: the configuration, what happened, and for a sound run the largest fraction of its
bound that any layer used (over the four tests: largest element, whole row, channel means and scales).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
from PIL import Image

from benchmarks.common import machine
from featdump.errors import FeatdumpError, ProofFailed
from featdump.job.channels import channel_axis
from featdump.job.runner import extract
from featdump.job.settings import Settings
from tests.makers import faults

REPO = Path(__file__).resolve().parents[1]


PANEL = {  # model: (shallow, middle, deepest, output)
    "resnet50": "layer1,layer3,layer4,fc",
    "inception_v3": "Mixed_5b,Mixed_6e,Mixed_7c,fc",
    "efficientnet_v2_s": "features.2,features.5,features.7,classifier",
    "convnext_tiny": "features.1,features.5,features.7,classifier",
    "maxvit_t": "blocks.0,blocks.2,blocks.3,classifier",
    "swin_t": "features.1,features.5,features.7,head",
    "vit_b_16": "encoder.layers.encoder_layer_0,encoder.layers.encoder_layer_5,encoder.ln,heads",
    "regnet_y_400mf": "trunk_output.block1,trunk_output.block3,trunk_output.block4,fc",
    "mobilenet_v3_large": "features.3,features.10,features.16,classifier",
    "densenet121": "features.denseblock1,features.denseblock3,features.norm5,classifier",
    "r3d_18": "layer1,layer3,layer4,fc",
    "fasterrcnn_mobilenet_v3_large_320_fpn": "backbone.body.3,backbone.body.10,backbone.body@1,backbone@pool",
}
CONFIGURATIONS = {"bf16": dict(precision="bf16"), "fp16": dict(precision="fp16"),
                  "fast decode": dict(fast_decode=True), "compile": dict(compile=True)}
FAULTS = ("shifted", "zeroed", "channel", "scaled", "wrong-layer")
IMAGES = 8


def write_images(folder: Path) -> Path:
    """8 smooth random 2048x1536 JPEGs (large enough for --fast-decode to decode them at a quarter)."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(IMAGES):
        base = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((2048, 1536), Image.BICUBIC)
        noise = rng.integers(-12, 12, (1536, 2048, 3))
        Image.fromarray(np.clip(np.asarray(base).astype(int) + noise, 0, 255).astype(np.uint8)).save(
            folder / f"img_{index}.jpg", quality=90)
    return folder


def write_films(folder: Path) -> Path:
    """One film of 8 back-to-back 16-frame clips (r3d_18's own clip)."""
    from tests.makers.videos import write_video

    write_video(folder / "film.mp4", 16 * IMAGES, fps=15, size=(120, 160), lossless=False)
    return folder


def fault_of(name: str, axes: dict[str, int | None]):
    return {"shifted": faults.shifted, "zeroed": faults.zeroed, "channel": faults.channel_off(axes),
            "scaled": faults.channel_scaled(axes, 1.02), "wrong-layer": faults.wrong_layer}[name]


def faulty_layers(model: str, fault: str) -> set[str]:
    """Where FAULT is injected: the deepest layer's and the output's rows, where bf16's own error is largest; a
    channel scaled by 2% into the shallow layer's, where bf16 moves a channel far less (in the deepest layers of a
    random network its own error of a channel reaches 2% and more: a scale that size is rounding there)."""
    layers = PANEL[model].split(",")
    return {layers[0]} if fault == "scaled" else set(layers[2:])


MISFIT_MODELS = '''
import torch
from torch import nn


class Offset(nn.Module):
    def forward(self, x):
        return (x + 1000.0) - 1000.0  # x in fp32; 0 in bf16 wherever |x| < 2


def gated():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 8),
                         Offset())


def tiny():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=8, bias=False), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    with torch.no_grad():
        model[0].weight.copy_(torch.linspace(-1e-9, 2e-9, 108).reshape(4, 3, 3, 3))  # below fp16's subnormals
    return model
'''
MISFITS = {  # a precision that does not fit the model at a layer: must stop, saying so
    "bf16 rounds a layer away (panel_misfits:gated)": ("panel_misfits:gated", "4", "bf16"),
    "fp16 holds none of its weights (panel_misfits:tiny)": ("panel_misfits:tiny", "2", "fp16"),
}


def run_misfits(images: Path, work: Path) -> list[dict]:
    """Each MISFITS case: it must stop with the proof's "does not fit" line (a sound finish is a miss)."""
    (work / "panel_misfits.py").write_text(MISFIT_MODELS)
    os.chdir(work)  # featdump imports a factory from the current folder
    results = []
    for name, (model, layer, precision) in MISFITS.items():
        started = time.perf_counter()
        try:
            extract(Settings(model=model, layers=(layer,), images=images, output=work / "misfit.h5",
                             precision=precision, overwrite=True))
            outcome = "finished"
        except FeatdumpError as error:
            outcome = str(error)
        stopped = "does not fit this model at this layer" in outcome
        results.append({"model": name, "seed": 0, "configuration": f"{precision} misfit", "outcome": outcome,
                        "caught": stopped, "seconds": time.perf_counter() - started})
        print(f"| {name} | 0 | {precision} misfit | {'stopped: ' if stopped else 'MISSED: '}{outcome[:140]} | | "
              f"{time.perf_counter() - started:.0f} |", flush=True)
    return results


def run(model: str, inputs: Path, output: Path, seed: int, cache: Path, **options) -> tuple[str, float, dict]:
    """One extract: ("finished" or the proof's message, seconds, the proof's entry)."""
    started = time.perf_counter()
    settings = Settings(model=model, layers=tuple(PANEL[model].split(",")), images=inputs, output=output,
                        weights="none", seed=seed, overwrite=True, compile_cache=str(cache), **options)
    try:
        extract(settings)
    except ProofFailed as error:
        return str(error), time.perf_counter() - started, {}
    except FeatdumpError as error:
        return f"ERROR {error}", time.perf_counter() - started, {}
    with h5py.File(output, "r") as h5file:
        (entry,) = json.loads(h5file.attrs["proof"])
        compiled = str(h5file.attrs.get("compiled", ""))
    if options.get("compile") and not compiled.startswith("yes"):
        return f"finished, not compiled: {compiled}", time.perf_counter() - started, entry
    return "finished", time.perf_counter() - started, entry


def true_stop(outcome: str) -> bool:
    """A stop that is right: the precision's (or the storage's) values are inf or NaN where fp32's are finite, or
    the CPU's own emulation of the precision is beyond its ceiling (the precision does not fit the model there)."""
    return any(words in outcome for words in ("non-finite (inf or NaN) where the reference path's are finite",
                                              "holds at most", "does not fit this model at this layer"))


def false_alarm(outcome: str) -> bool:
    return not outcome.startswith("finished") and not true_stop(outcome)


def margin(entry: dict) -> tuple[float, str]:
    """The largest fraction of a bound any layer used, and which (layer, test)."""
    used = []
    for name, layer in entry.get("layers", {}).items():
        used += [(share(layer["nearest"], layer["bound"]), f"{name} largest"),
                 (share(layer["whole_nearest"], layer["whole_bound"]), f"{name} whole"),
                 (share(layer["channel_shift"], layer["shift_bound"]), f"{name} channel"),
                 (share(layer["channel_scale"], layer["scale_bound"]), f"{name} scale")]
    return max(used, default=(0.0, ""))


def share(value, bound) -> float:
    """VALUE's share of BOUND; a bound of 0 (a run that fell back to the reference path: exact) is used by nothing
    but a difference."""
    value, bound = float(value), float(bound)
    return value / bound if bound > 0 else (np.inf if value > 0 else 0.0)


def channel_axes(output: Path) -> dict[str, int | None]:
    with h5py.File(output, "r") as h5file:
        return {name: channel_axis(dataset.shape[1:], dict(dataset.attrs))
                for name, dataset in h5file["features"].items()}


def summary_table(results: list[dict]) -> str:
    """One row per model: each sound configuration's outcome and largest fraction of a bound used per seed, and
    the faults caught of those injected."""
    configurations = [name for name in CONFIGURATIONS if any(r["configuration"] == name for r in results)]
    lines = ["| model | " + " | ".join(configurations) + " | faults caught |",
             "| --- |" + " --- |" * (len(configurations) + 1)]
    for model in dict.fromkeys(r["model"] for r in results):
        mine = [r for r in results if r["model"] == model]
        cells = []
        for name in configurations:
            runs = [r for r in mine if r["configuration"] == name]
            cells.append(", ".join(f"{r['used']:.2f}" if r["outcome"] == "finished" else
                                   "does not fit: right stop" if "does not fit" in r["outcome"] else
                                   "inf: right stop" if true_stop(r["outcome"]) else
                                   "FALSE ALARM" if false_alarm(r["outcome"]) else r["outcome"][:40]
                                   for r in runs) or "-")
        faulty = [r for r in mine if "caught" in r]
        lines.append(f"| {model} | " + " | ".join(cells) + f" | {sum(r['caught'] for r in faulty)} of {len(faulty)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(PANEL))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--configurations", default=",".join(CONFIGURATIONS))
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--slow-fp16", action="store_true", help="Run r3d_18 in fp16 too (10+ minutes a run here).")
    parser.add_argument("--summarize", type=Path, nargs="+", help="Print the summary of these panel.json files.")
    parser.add_argument("--no-misfits", dest="misfits", action="store_false",
                        help="Leave out the models a precision does not fit (which must stop).")
    args = parser.parse_args()
    print(f"Machine: {machine()}", flush=True)  # every figure below is this CPU's
    if args.summarize:
        print(summary_table([result for path in args.summarize for result in json.loads(path.read_text())]))
        return
    work = args.out or Path(tempfile.mkdtemp(prefix="featdump-panel-"))
    images, films = write_images(work / "images"), write_films(work / "films")
    results = []
    print("| model | seed | configuration | outcome | nearest bound (fraction used) | s |")
    print("| --- | --- | --- | --- | --- | --- |", flush=True)
    for model in args.models.split(","):
        inputs = films if model == "r3d_18" else images
        for seed in (int(seed) for seed in args.seeds.split(",")):
            sound = None
            for name in args.configurations.split(","):
                if name == "fast decode" and model == "r3d_18":
                    continue  # a film's frames have no reduced decode
                if name == "fp16" and model == "r3d_18" and not args.slow_fp16:
                    continue  # the CPU has no fast fp16 Conv3d: a run of 8 clips takes 10 minutes or more
                outcome, seconds, entry = run(model, inputs, work / "run.h5", seed, work / "cache",
                                              **CONFIGURATIONS[name])
                used, where = margin(entry)
                results.append({"model": model, "seed": seed, "configuration": name, "outcome": outcome,
                                "used": used, "where": where, "seconds": seconds, "proof": entry})
                print(f"| {model} | {seed} | {name} | {outcome[:160]} | {used:.2f} ({where}) | {seconds:.0f} |",
                      flush=True)
                if name == "bf16" and outcome == "finished":
                    sound = channel_axes(work / "run.h5")
            for fault in [] if sound is None or not args.faults else args.faults.split(","):
                with faults.injected(fault_of(fault, sound), faulty_layers(model, fault)):
                    outcome, seconds, _ = run(model, inputs, work / "fault.h5", seed, work / "cache",
                                              precision="bf16")
                caught = outcome != "finished" and not outcome.startswith("ERROR")  # the proof's own line
                results.append({"model": model, "seed": seed, "configuration": f"bf16 + {fault}",
                                "outcome": outcome, "caught": caught, "seconds": seconds})
                print(f"| {model} | {seed} | bf16 + {fault} | {'caught: ' if caught else 'MISSED: '}"
                      f"{outcome[:140]} | | {seconds:.0f} |", flush=True)
    if args.misfits:
        results += run_misfits(images, work)
    (work / "panel.json").write_text(json.dumps(results, indent=1))
    print("\n" + summary_table(results))
    sound = [result for result in results if "caught" not in result]
    faulty = [result for result in results if "caught" in result]
    print(f"\nSound runs: {len(sound)}, false alarms: {sum(false_alarm(r['outcome']) for r in sound)}, "
          f"right stops (inf where fp32 is finite): {sum(true_stop(r['outcome']) for r in sound)}; "
          f"faults injected: {len(faulty)}, caught: {sum(r['caught'] for r in faulty)}. ({work / 'panel.json'})")


if __name__ == "__main__":
    main()
