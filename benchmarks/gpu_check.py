"""The GPU path in one prepared check, for a GPU machine lent for a few minutes (its own PyTorch, no featdump yet).

    python -m benchmarks.gpu_check OUT_DIR [--budget 480] [--dry-run]

From the repository's root on a fresh machine:
  1. install: featdump without touching torch (`pip install --no-deps -e .`), after the few pure packages it needs
     that are missing (each checked first);
  2. cuda tests: `pytest -m cuda` and the device tests (test_device.py, test_gpu_decode.py) on the GPU;
  3. benchmarks: `python -m benchmarks.run --gpu` (resnet50 avgpool fp32/bf16 with CPU and GPU decode, --compile bf16,
     float16 storage, tar shards, a read-out, each beside the forward alone on random tensors and the decode
     alone) over --gpu-images JPEGs;
  4. proof panel: its GPU cells (bf16 and fp16, r3d_18 fp16 among them) and a fault on the GPU path (each batch's
     rows shifted by one in the copy to the host) that the proof must stop;
  5. OUT_DIR/gpu_check.json: every step's status, seconds, figures and output's tail, the versions and the GPU's
     name; a short table printed.
Each step has its own time limit (their sum is --budget seconds) and says when it was skipped and why; a step that
fails does not stop the others. --dry-run runs every step at a tiny size where CUDA is absent (install checked, not
run): the test suite runs it, so the script is known to run before a GPU sees it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.common import benchmark

REPO = Path(__file__).resolve().parents[1]
PURE = {"click": "click>=8.1", "h5py": "h5py>=3.8", "tqdm": "tqdm>=4.64", "PIL": "pillow>=9.5",
        "numpy": "numpy>=1.24", "pytest": "pytest>=7", "pytest_timeout": "pytest-timeout>=2.1"}
SHARES = {"install": 0.05, "cuda tests": 0.35, "benchmarks": 0.3, "proof panel": 0.3}  # of the budget


@dataclass
class Step:
    """One step's outcome: ok, failed, timed out or skipped (and why), its seconds, figures and output's tail."""

    name: str
    status: str = "not run"
    seconds: float = 0.0
    why: str = ""
    command: str = ""
    figures: dict = field(default_factory=dict)
    tail: str = ""


def run(step: Step, command: list[str], limit: float, out: Path) -> str:
    """COMMAND under LIMIT seconds, its output kept in OUT/<step>.log; the step's status and tail set; its output."""
    step.command = " ".join(command)
    started = time.perf_counter()
    log = out / f"{step.name.replace(' ', '_')}.log"
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=max(1.0, limit))
        text = done.stdout + done.stderr
        step.status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
    except subprocess.TimeoutExpired as expired:
        text = _text(expired.stdout) + _text(expired.stderr)
        step.status, step.why = "timed out", f"past its {limit:.0f} s"
    step.seconds = round(time.perf_counter() - started, 1)
    log.write_text(text)
    step.tail = text[-2000:]
    return text


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def cuda_name() -> str | None:
    """The GPU's name, or None where CUDA is absent (or torch itself)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def install(step: Step, limit: float, out: Path, dry_run: bool) -> None:
    """The pure packages featdump needs that are missing, then featdump itself, torch left as it is."""
    if importlib.util.find_spec("torch") is None:
        step.status, step.why = "failed", "torch is not installed: this check uses the machine's own PyTorch"
        return
    missing = [requirement for module, requirement in PURE.items() if importlib.util.find_spec(module) is None]
    step.figures["missing"] = missing
    if dry_run:
        step.status = "skipped"
        step.why = (f"--dry-run: nothing installed (missing here: {', '.join(missing) or 'none'}; featdump from "
                    f"{'this checkout' if _featdump_here() else 'elsewhere'})")
        return
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if missing:
        run(step, [*pip, *missing], limit / 2, out)
        if step.status != "ok":
            return
    # no build isolation: a lent machine may reach no package index, and its setuptools builds featdump
    run(step, [*pip, "--no-deps", "--no-build-isolation", "-e", str(REPO)], limit / 2, out)


def _featdump_here() -> bool:
    found = importlib.util.find_spec("featdump")
    return found is not None and found.origin is not None and Path(found.origin).resolve().is_relative_to(REPO)


def cuda_tests(step: Step, limit: float, out: Path, dry_run: bool) -> None:
    """`pytest -m cuda` over the suite, then the device tests (CUDA faked where it is absent); without CUDA (a dry
    run) the first collects every GPU test and skips it."""
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    summaries = []
    for selection in (["-m", "cuda", "tests"], ["-m", "not slow", "tests/test_device.py", "tests/test_gpu_decode.py"]):
        text = run(step, [*pytest, *selection], limit / 2, out)
        counts = [line for line in text.splitlines() if " passed" in line or " skipped" in line or " failed" in line
                  or " deselected" in line]
        summaries.append(counts[-1].strip("= ") if counts else step.status)
        if step.status not in ("ok", "failed (exit 5)"):  # 5: nothing collected, not a failure of the code
            break
        step.status = "ok"
    step.figures["summary"] = "; ".join(summaries)
    if dry_run:
        step.why = "--dry-run: CUDA absent, its tests skipped; the device tests ran with CUDA faked"


def benchmarks(step: Step, limit: float, out: Path, dry_run: bool, images: int) -> None:
    """`benchmarks.run --gpu` over IMAGES JPEGs; a dry run, its rows on the CPU over 16."""
    command = [*benchmark("run"), "--gpu", "--gpu-images", str(images)]
    if dry_run:
        command = [*command[:-1], "16", "--dry-run"]
        step.why = "--dry-run: CUDA absent, run.py's --gpu rows on the CPU over 16 images (GPU decode, compile out)"
    text = run(step, command, limit, out)
    step.figures["rows"] = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]


def proof_panel(step: Step, limit: float, out: Path, dry_run: bool) -> None:
    """The panel's GPU cells and a fault on the GPU path; a dry run: one model, one cell, one fault, on the CPU."""
    folder = out / "panel"
    if dry_run:
        options = ["--models", "regnet_y_400mf", "--seeds", "0", "--configurations", "bf16", "--faults", "shifted",
                   "--no-misfits"]  # the panel's lightest model: bf16 may have no native kernels here
        step.why = "--dry-run: CUDA absent, one model's bf16 cell (regnet_y_400mf) and the shifted fault on the CPU"
    else:
        options = ["--models", "resnet50,vit_b_16,convnext_tiny,efficientnet_v2_s,r3d_18", "--seeds", "0",
                   "--configurations", "bf16,fp16", "--faults", "shifted", "--slow-fp16"]
    text = run(step, [*benchmark("proof_panel"), *options, "--out", str(folder)], limit, out)
    step.figures["rows"] = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    panel = folder / "panel.json"
    if panel.exists():
        results = json.loads(panel.read_text())
        sound = [result for result in results if "caught" not in result]
        faulty = [result for result in results if "caught" in result]
        step.figures.update(sound_runs=len(sound), finished=sum(r["outcome"] == "finished" for r in sound),
                            faults=len(faulty), caught=sum(bool(r["caught"]) for r in faulty))
        if faulty and not all(r["caught"] for r in faulty) and step.status == "ok":
            step.status = "failed (a fault was not caught)"


def versions() -> dict:
    found = {"python": platform.python_version(), "machine": platform.machine(), "gpu": cuda_name() or "none"}
    for module in ("torch", "torchvision", "featdump"):
        try:
            found[module] = str(__import__(module).__version__)
        except (ImportError, AttributeError):
            found[module] = "not installed"
    return found


def table(steps: list[Step]) -> str:
    lines = ["| step | status | s | note |", "| --- | --- | ---: | --- |"]
    for step in steps:
        note = step.why or ", ".join(f"{key} {value}" for key, value in step.figures.items()
                                     if not isinstance(value, list))
        lines.append(f"| {step.name} | {step.status} | {step.seconds:.0f} | {note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder the results file (gpu_check.json) and logs go to")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for all the steps together")
    parser.add_argument("--gpu-images", type=int, default=2048, help="JPEGs of benchmarks.run's GPU rows")
    parser.add_argument("--dry-run", action="store_true", help="every step at a tiny size, CUDA absent")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = cuda_name()
    dry_run = args.dry_run or gpu is None
    if not args.dry_run and gpu is None:
        print("gpu_check: CUDA is not available here: running the dry run instead.", flush=True)
    steps = [Step(name) for name in SHARES]
    limits = {name: share * args.budget for name, share in SHARES.items()}
    install(steps[0], limits["install"], args.out, dry_run)
    for step, body in zip(steps[1:], (lambda step, limit: cuda_tests(step, limit, args.out, dry_run),
                                      lambda step, limit: benchmarks(step, limit, args.out, dry_run, args.gpu_images),
                                      lambda step, limit: proof_panel(step, limit, args.out, dry_run))):
        if steps[0].status.startswith("failed"):
            step.status, step.why = "skipped", "featdump could not be installed (see the install step)"
            continue
        try:
            body(step, limits[step.name])
        except Exception as error:  # one step's own fault: said, and the others go on
            step.status, step.why = "failed", f"{type(error).__name__}: {error}"
        print(f"gpu_check: {step.name}: {step.status} in {step.seconds:.0f} s", flush=True)
    result = {"dry_run": dry_run, "budget_s": args.budget, "versions": versions(),
              "steps": [asdict(step) for step in steps]}
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=1))
    print(table(steps))
    return 0 if all(step.status in ("ok", "skipped") for step in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
