"""`featdump doctor`: what this machine offers a model and its layers, then a few measured batches in each
configuration (`job.trials`) and the fastest one the proof accepts, as a command line to copy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from featdump.forward import hardware
from featdump.job import trials as trial_runs
from featdump.job.settings import Settings
from featdump.output.space import human_bytes
from featdump.version import __version__


def examine(base: Settings, batches: int, asked: list[str] | None, folder: Path,
            report: Callable[[trial_runs.Trial], None] = lambda trial: None) -> dict:
    """The machine (at FOLDER's disk) and BASE's model measured over BATCHES batches in each configuration offered
    (or ASKED), as JSON values: the machine, every trial, the recommendation and its command."""
    machine = hardware.describe(folder)
    offered = trial_runs.offered(hardware.cpu(), hardware.gpus(), machine["compiler"] is not None, asked)
    done = trial_runs.run_trials(offered, base, batches * base.batch_size, report)
    best = trial_runs.recommended(done)
    return {"featdump": __version__, "machine": machine, "model": base.model, "layers": list(base.layers),
            "weights": base.weights, "batch_size": base.batch_size, "batches": batches,
            "trials": [trial.as_json() for trial in done],
            "recommended": None if best is None else recommendation(best, done, base)}


def recommendation(best: trial_runs.Trial, done: list[trial_runs.Trial], base: Settings) -> dict:
    """BEST's name and command; where its first batch ends later than the reference path's, the rows after which
    it has paid that back (a shorter job is sooner done on the reference path)."""
    reference = trial_runs.reference_trial(done)
    payback = None if reference is None or reference is best else trial_runs.payback_rows(best, reference)
    return {"configuration": best.configuration.name, "command": trial_runs.command_line(best, base),
            "pays_back_after_rows": payback,
            "first_batch_later_seconds": None if payback is None else
            round(best.warm_up_seconds - reference.warm_up_seconds, 1),
            "until_then": None if payback is None else reference.configuration.name,
            "later_because": None if payback is None else
            "building or loading its compiled package" if best.configuration.compile else "its start"}


def describe(result: dict) -> Iterator[str]:
    """RESULT (`examine`'s) in lines for a terminal."""
    machine, cpu = result["machine"], result["machine"]["cpu"]
    yield f"CPU: {cpu['name']}, {cpu['cores']} cores; {cpu['instruction_set']}"
    gpus = machine["gpus"]
    yield "GPU: " + ("; ".join(f"cuda:{gpu['index']} {gpu['name']} (compute {gpu['compute_capability']}, "
                               f"{human_bytes(gpu['memory_bytes'])})" for gpu in gpus) if gpus else "none")
    compiler = machine["compiler"] or "no C++ compiler: --compile runs eager"
    yield (f"torch {machine['torch']}, torchvision {machine['torchvision']}, featdump {result['featdump']}; "
           f"AOTInductor: {compiler}; {human_bytes(machine['free_disk_bytes'])} free in {machine['disk_folder']}")
    yield (f"{result['model']} ({result['weights']} weights), layers {','.join(result['layers'])}: "
           f"{result['batches']} batches of {result['batch_size']} generated images in each configuration")
    trials = result["trials"]
    baseline = {trial["device"]: trial["rows_per_second"] for trial in trials
                if trial["precision"] == "fp32" and not trial["compile"] and trial["rows_per_second"]}
    yield f"  {'configuration':<22} {'rows/s':>8} {'time':>6}  outcome"
    for trial in trials:
        rate, reference = trial["rows_per_second"], baseline.get(trial["device"])
        time_against = f"{reference / rate:.2f}x" if rate and reference else ""
        outcome = trial["outcome"] + (" (proved)" if trial["proved"] else "")
        why = f": {trial['why']}" if trial["why"] else ""
        warm = f"; first batch after {trial['warm_up_seconds']} s" if trial["warm_up_seconds"] else ""
        shown_rate = f"{rate:.1f}" if rate else ""
        yield f"  {trial['configuration']:<22} {shown_rate:>8} {time_against:>6}  {outcome}{warm}{why}"
    if not trials:
        yield "No configuration asked is on this machine (--try names a device or precision it lacks)."
    elif result["recommended"] is None:
        yield "No configuration ran: see the outcomes above."
    else:
        yield f"Fastest the proof accepts: {result['recommended']['configuration']}:"
        yield f"  {result['recommended']['command']}"
        if result["recommended"]["pays_back_after_rows"]:
            yield _payback_line(result["recommended"])


def _payback_line(recommended: dict) -> str:
    later, why = recommended["first_batch_later_seconds"], recommended["later_because"]
    return (f"Its first batch ends {later} s later than {recommended['until_then']}'s ({why}); its rate pays that "
            f"back after about {recommended['pays_back_after_rows']:,} images: a shorter job is sooner done with "
            f"{recommended['until_then']}.")
