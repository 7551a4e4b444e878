"""Faults injected where the proof must see them: in the device-to-host copy of each batch's rows
(`featdump.output.write_behind.host_copy`), the seam between the forward and the writer. Used by the proof's tests
and by benchmarks/proof_panel.py."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from featdump.output import write_behind

Fault = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def shifted(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each batch's rows delivered one place off: row i holds row i+1's values (the last, the first's)."""
    return {name: values.roll(-1, dims=0) for name, values in rows.items()}


def zeroed(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The middle row of each batch zeroed."""
    faulty = {name: values.clone() for name, values in rows.items()}
    for values in faulty.values():
        values[len(values) // 2] = 0
    return faulty


def channel_off(axes: dict[str, int | None]) -> Fault:
    """One channel (the first along each layer's channel axis in AXES, rows without the batch) of every row off by
    1% of the row's largest |value|."""

    def fault(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        faulty = {}
        for name, values in rows.items():
            values = values.clone()
            scale = values.flatten(1).abs().amax(dim=1)
            axis = axes.get(name)
            channel = values.select(1 + axis, 0) if axis is not None and values.dim() > 2 else (
                values[:, 0] if values.dim() == 2 else values.flatten(1)[:, 0])
            channel += 0.01 * scale.view(-1, *([1] * (channel.dim() - 1)))
            faulty[name] = values
        return faulty

    return fault


def channel_scaled(axes: dict[str, int | None], factor: float) -> Fault:
    """One channel of every row multiplied by FACTOR: along each layer's channel axis in AXES, the first that is not
    all zeros in the batch (a dead channel, as a random inception_v3's `Mixed_5b` channel 0 is, scaled is no fault:
    nothing changes)."""

    def fault(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        faulty = {}
        for name, values in rows.items():
            values = values.clone()
            axis = axes.get(name)
            by_channel = values.movedim(1 + axis, 1) if axis is not None and values.dim() > 2 else values.flatten(1)
            live = by_channel.flatten(2).abs().amax(dim=(0, 2)) if by_channel.dim() > 2 else \
                by_channel.abs().amax(dim=0)
            first = int(torch.nonzero(live).flatten()[0]) if bool(live.any()) else 0
            by_channel[:, first] *= factor
            faulty[name] = values
        return faulty

    return fault


def wrong_layer(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each layer's rows replaced by the next layer's (the last's by the first's), cut or repeated to its size."""
    names = list(rows)
    faulty = {}
    for name, other in zip(names, names[1:] + names[:1]):
        size = rows[name][0].numel()
        flat = rows[other].flatten(1)
        flat = flat.repeat(1, -(-size // flat.shape[1]))[:, :size]
        faulty[name] = flat.reshape(rows[name].shape).clone()
    return faulty


@contextlib.contextmanager
def injected(fault: Fault, layers: set[str] | None = None) -> Iterator[None]:
    """Every batch's rows pass through FAULT after the copy to the host (only LAYERS' where given), while this
    lasts."""
    original = write_behind.host_copy

    def faulty_copy(features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        rows = original(features)
        changed = fault(rows)
        return {name: changed[name] if layers is None or name in layers else values for name, values in rows.items()}

    write_behind.host_copy = faulty_copy
    try:
        yield
    finally:
        write_behind.host_copy = original
