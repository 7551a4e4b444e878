"""Storage: the one cast of a batch's rows (host tensors, as the forward made them) to the dtype of their datasets,
and the refusal of what the cast itself would lose: a finite value made inf (float16 holds at most 65,504), and a
row whose values all lie below the narrow dtype's smallest normal number (float16: 6.1e-5), which the cast turns
into zeros or subnormals that keep fewer digits than the dtype's own rounding (2^-11 of the row's largest value)
allows. Nothing else in featdump casts rows to the storage dtype: the forward hands float32 rows on, and the writer
stores what this module returns."""

from __future__ import annotations

import numpy as np
import torch

from featdump.errors import StorageOverflow, StorageUnderflow

FLOAT16_LARGEST = 65504.0


def to_storage(rows: dict[str, torch.Tensor], dtypes: dict[str, np.dtype]) -> dict[str, np.ndarray]:
    """ROWS (layer: a host tensor) as arrays of each layer's DTYPES entry; StorageOverflow where a finite value is
    not finite once cast."""
    stored = {}
    for name, values in rows.items():
        dtype = torch.from_numpy(np.zeros(0, dtype=dtypes[name])).dtype
        cast = values if values.dtype == dtype else values.to(dtype)
        if cast is not values and _may_overflow(values.dtype, dtype):
            _refuse_overflow(name, values, cast)
        if cast is not values and _may_underflow(values.dtype, dtype):
            _refuse_underflow(name, values, dtype)
        stored[name] = cast.numpy()
    return stored


def _may_overflow(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether a cast from SOURCE to TARGET can turn a finite value into inf: a floating TARGET whose largest
    value is below SOURCE's (float32 holds every bfloat16 and float16 value, so widening is never checked)."""
    if not target.is_floating_point:
        return False
    return not source.is_floating_point or torch.finfo(target).max < torch.finfo(source).max


def _refuse_overflow(name: str, values: torch.Tensor, cast: torch.Tensor) -> None:
    """StorageOverflow when CAST holds a non-finite value where VALUES (before the cast) holds a finite one."""
    if bool(torch.isfinite(cast).all()):
        return
    made = ~torch.isfinite(cast) & torch.isfinite(values)
    count = int(made.sum())
    if not count:
        return
    largest = float(values[made].abs().max())
    raise StorageOverflow(
        f"Layer {name}: {count} value(s) became inf when stored as {_dtype_name(cast)} (largest {largest:.2e}; "
        f"{_dtype_name(cast)} holds at most {FLOAT16_LARGEST:,.0f}).",
        name, largest)


def _may_underflow(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether a cast from SOURCE to TARGET can flush a normal value to a subnormal or zero: a floating TARGET whose
    smallest normal number is above SOURCE's."""
    return source.is_floating_point and target.is_floating_point and \
        torch.finfo(target).tiny > torch.finfo(source).tiny


def _refuse_underflow(name: str, values: torch.Tensor, target: torch.dtype) -> None:
    """StorageUnderflow when a row of VALUES holds non-zero values whose largest is below TARGET's smallest normal:
    cast, the row would be zeros or subnormals, farther from its values than TARGET's rounding of a normal row."""
    tiny = torch.finfo(target).tiny
    flat = values.reshape(len(values), -1) if values.dim() else values.reshape(1, 1)
    scale = torch.where(torch.isfinite(flat), flat.abs(), torch.zeros((), dtype=flat.dtype)).amax(dim=1) \
        if flat.shape[1] else torch.zeros(len(flat))
    lost = (scale > 0) & (scale < tiny)
    if not bool(lost.any()):
        return
    largest = float(scale[lost].max())
    name_of = str(target).removeprefix("torch.")
    raise StorageUnderflow(
        f"Layer {name}: {int(lost.sum())} of {len(flat)} rows hold values no larger than {largest:.1e}, below "
        f"{name_of}'s smallest normal number ({tiny:.1e}): stored as {name_of} they would be zeros or lose their "
        "digits.", name, largest)


def _dtype_name(values: torch.Tensor) -> str:
    return str(values.dtype).removeprefix("torch.")
