"""Space: the output's expected size, logged per layer before a run starts, and the disk checked for it."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from featdump.errors import BadOption, NotEnoughSpace
from featdump.output.specs import DatasetSpec

log = logging.getLogger("featdump")


def report_size(output: Path, specs: dict[str, DatasetSpec], image_count: int, space_check: bool,
                device_bytes: int = 0, noun: str = "image") -> None:
    """Log bytes per image per layer, the total, and DEVICE_BYTES (what projections hold on the device);
    refuse when the disk is too small."""
    for name, spec in specs.items():
        reduced = "" if spec.reduction == "none" else f", {spec.reduction}"
        log.info("Layer %s: %s per %s, shape %s, %s%s.", name, human_bytes(spec.row_bytes), noun, spec.shape,
                 spec.dtype, reduced)
    if device_bytes:
        log.info("Projection matrices: %s on the device.", human_bytes(device_bytes))
    total = image_count * sum(spec.row_bytes for spec in specs.values())
    log.info("Expected output: %s for %d %ss (%s free).", human_bytes(total), image_count, noun,
             human_bytes(shutil.disk_usage(output.resolve().parent).free))
    if space_check:
        check_space(output, total, "The output", "use --dtype float16 or --reduce, or pass --no-space-check")


def check_space(output: Path, needed: int, what: str, advice: str) -> None:
    """NotEnoughSpace when NEEDED bytes do not fit beside OUTPUT."""
    folder = output.resolve().parent
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise NotEnoughSpace(f"{what} needs about {human_bytes(needed)} but only {human_bytes(free)} is free on "
                             f"{folder}; free space, or {advice}.")


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3, "GB": 1000**3,
          "T": 1000**4, "TB": 1000**4, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4}


def parse_bytes(text: str | int, name: str = "--memory") -> int:
    """'128MB', '4GB', '1.5GiB', '512M' or a number of bytes, as bytes; BadOption naming NAME otherwise."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else None
    if unit not in _UNITS:
        raise BadOption(f"{name} {text!r}: give a size such as 512MB, 4GB or 1.5GiB.")
    return int(float(match.group(1)) * _UNITS[unit])
