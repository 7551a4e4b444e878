"""What the tests share: small real image folders and featdump outputs made on disk, featdump run in-process (or
as a real process where one is what is tested), its outputs read back with plain h5py, and the comparisons of rows
(one `assert_same_rows`, one `images_fixture`)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from featdump.job.settings import Settings
from tests.makers.outputs import write_output as write_output  # the tests' name for it

REPO = Path(__file__).resolve().parents[1]
# resnet18's module paths in miniature over 32 x 32 inputs (tests.makers.small_resnet), for the tests whose point is
# not the model: an extract of a few images in about a tenth of resnet18's time at 224 pixels
SMALL_RESNET_MODEL = ("-m", "tests.makers.small_resnet:build", "-w", "none")  # with a --transform of the test's own
SMALL_RESNET = (*SMALL_RESNET_MODEL, "--transform", "featdump.testing.models:small_transform")
SMALL_RESNET_SETTINGS = {"model": "tests.makers.small_resnet:build",
                         "transform": "featdump.testing.models:small_transform"}


def write_images(root: Path, layout: dict[str, int], seed: int = 0, size=(64, 48)) -> list[str]:
    """Write random-but-smooth RGB JPEG/PNG images: {class folder: count}; '' puts them at the root."""
    rng = np.random.default_rng(seed)
    written = []
    for folder, count in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            width, height = size[0] + 8 * index, size[1] + 4 * index
            base = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
            image = Image.fromarray(base).resize((width, height), Image.BILINEAR)
            noise = rng.integers(-20, 20, size=(height, width, 3))
            pixels = np.clip(np.asarray(image).astype(int) + noise, 0, 255).astype(np.uint8)
            suffix = ".png" if index % 3 == 2 else ".jpg"
            path = root / folder / f"img_{index:03d}{suffix}"
            Image.fromarray(pixels).save(path)
            written.append(path.relative_to(root).as_posix())
    return sorted(written)


@contextlib.contextmanager
def user_project(folder: Path, module: str, source: str, layout: dict[str, int]):
    """FOLDER holding a user's own model code (MODULE.py) and images; importable here while it lasts."""
    (folder / f"{module}.py").write_text(source)
    write_images(folder / "images", layout)
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(module, None)


def settings_for(images: Path, output: Path, **overrides) -> Settings:
    options = dict(model="resnet18", layers=("avgpool",), images=images, output=output, weights="none",
                   batch_size=4, num_workers=0, device="cpu")
    options.update(overrides)
    return Settings(**options)


def featdump_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_featdump(*args, env=None, cwd=None, timeout=300, process=False) -> subprocess.CompletedProcess:
    """featdump ARGS as a user runs it: in this process through Click's runner (torch is imported once, not per
    test), or, with PROCESS, as a real `python -m featdump` process (for what needs one: signals, kills, locks
    between processes, the entry point, a fresh interpreter's environment). ENV and CWD apply either way."""
    if process:
        return subprocess.run([sys.executable, "-m", "featdump", *map(str, args)], capture_output=True, text=True,
                              env=env or featdump_env(), timeout=timeout, cwd=cwd)
    return _in_process([str(arg) for arg in args], env, cwd)


def _in_process(args: list[str], env: dict | None, cwd) -> subprocess.CompletedProcess:
    """ARGS through the CLI in this process, with ENV's changes to os.environ, in CWD, importing user modules
    from CWD and ENV's PYTHONPATH as a new process would (and forgetting them afterwards)."""
    from click.testing import CliRunner

    from featdump.faces.cli import main

    changes = {}
    if env is not None:
        changes = {key: value for key, value in env.items() if os.environ.get(key) != value}
        changes.update({key: None for key in os.environ if key not in env})
    folders = [str(Path(cwd or os.getcwd()).resolve())]
    folders += [entry for entry in (env or {}).get("PYTHONPATH", "").split(os.pathsep) if entry]
    own = [folder for folder in folders if Path(folder).resolve() != REPO]  # where user modules come from
    modules_before, path_before, directory, argv = set(sys.modules), list(sys.path), os.getcwd(), sys.argv
    sys.argv = ["featdump", *args]  # the command line the output records
    logger = logging.getLogger("featdump")  # the CLI sets it up for its run; the tests' own logging is put back
    logging_before = (list(logger.handlers), logger.level, logger.propagate)
    sys.path[:0] = folders
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = CliRunner().invoke(main, args, env=changes)
    finally:
        os.chdir(directory)
        sys.path[:], sys.argv = path_before, argv
        logger.handlers[:], logger.level, logger.propagate = logging_before
        for name in set(sys.modules) - modules_before:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if any(origin.startswith(folder) for folder in own) and not name.startswith("featdump"):
                del sys.modules[name]
    return subprocess.CompletedProcess(["featdump", *args], result.exit_code, result.stdout, result.stderr)


def start_featdump(*args, env=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs) -> subprocess.Popen:
    """Start `python -m featdump ARGS` as a real process, to kill or to watch while it runs."""
    return subprocess.Popen([sys.executable, "-m", "featdump", *map(str, args)], env=env or featdump_env(),
                            stdout=stdout, stderr=stderr, text=True, **kwargs)


def read_output(path, rows=None) -> dict:
    """Everything an output holds, read with plain h5py: each layer's features, paths and labels (cut to ROWS,
    e.g. a partial file's committed rows), skipped images and reasons, classes, the counters, completeness."""
    with h5py.File(path, "r", locking=False) as h5file:
        rows = h5file["paths"].shape[0] if rows is None else rows
        content = {name: h5file["features"][name][:rows] for name in h5file.attrs["layers"]}
        content["paths"] = list(h5file["paths"].asstr()[:rows])
        content["labels"] = h5file["labels"][:rows]
        content["skipped"] = list(h5file["skipped/paths"].asstr()[:])
        content["reasons"] = list(h5file["skipped/reasons"].asstr()[:])
        content["classes"] = [str(name) for name in h5file["labels"].attrs["classes"]]
        content["committed"] = [int(value) for value in h5file.attrs["committed"]]
        content["complete"] = bool(h5file.attrs["complete"])
    return content


def read_features(path) -> dict:
    """Each layer's features of an output, by layer name."""
    with h5py.File(path, "r", locking=False) as h5file:
        return {name: h5file["features"][name][:] for name in h5file.attrs["layers"]}


def committed_rows(path) -> int:
    """The committed rows of an output or partial file; -1 while it cannot be read (being created or written)."""
    try:
        with h5py.File(path, "r", locking=False) as h5file:
            return int(h5file.attrs["committed"][0])  # [rows, images, skipped]
    except (OSError, KeyError):
        return -1


class CrashAfterFirstBatch:
    """A progress reporter that crashes the run after its first batch is written: leaves a partial file."""

    def start(self, total, done, noun="image"):
        pass

    def advance(self, images):
        raise RuntimeError("simulated crash")

    def close(self):
        pass


MEASURE = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-m", "featdump", *sys.argv[1:]], capture_output=True, text=True)
assert done.returncode == 0, done.stderr
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_rss_mib(*arguments) -> float:
    """Peak RSS of one `featdump ARGUMENTS` process (a fresh parent: no other child counts)."""
    result = subprocess.run([sys.executable, "-c", MEASURE, *map(str, arguments)], capture_output=True, text=True,
                            env=featdump_env(), check=True)
    return int(result.stdout.strip()) / 1024


SAME_RUN_MAY_DIFFER = ("complete", "skipped", "reasons", "classes", "committed")  # beside the rows themselves


def assert_same_rows(actual: dict, expected: dict, rows: int | None = None,
                     ignore: tuple[str, ...] = SAME_RUN_MAY_DIFFER) -> None:
    """ACTUAL (`read_output`'s) holds EXPECTED's rows (its first ROWS): the same paths and labels, each layer bit for
    bit (the CPU's); the keys in IGNORE aside."""
    for key, values in expected.items():
        if key in ignore:
            continue
        wanted = values[:rows] if rows is not None and not isinstance(values, (bool, int)) else values
        if isinstance(values, list):
            assert actual[key] == wanted, key
        else:
            np.testing.assert_array_equal(actual[key], wanted, err_msg=key)


def images_fixture(layout: dict[str, int], seed: int = 0, size=(64, 48), broken: dict[str, bytes] | None = None,
                   scope: str = "module"):
    """A fixture of a folder of images (`write_images(LAYOUT, SEED, SIZE)`, one per SCOPE), with BROKEN: files at
    these relative paths holding these bytes, which no decoder opens."""

    @pytest.fixture(scope=scope)
    def images(tmp_path_factory) -> Path:
        root = tmp_path_factory.mktemp("images") / "images"
        write_images(root, layout, seed, size)
        for relative, data in (broken or {}).items():
            (root / relative).write_bytes(data)
        return root

    return images
