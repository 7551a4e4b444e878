"""GPU decode: the JPEGs a batch left encoded, decoded by nvJPEG on the device and preprocessed there."""

from __future__ import annotations

import warnings

import torch

from featdump.errors import DeviceFailure
from featdump.inputs import ImageList
from featdump.inputs.decode import describe_failure, open_rgb
from featdump.inputs.loader import Batch
from featdump.inputs.preprocess import Preprocess


def to_device_inputs(batch: Batch, preprocess: Preprocess, images: ImageList, device: torch.device):
    """The batch's normalised model inputs on DEVICE, in source order (None if no image is usable).

    JPEGs left encoded are decoded in one nvjpeg call on the GPU and resized and cropped there; one
    that nvjpeg cannot decode is decoded on the CPU alone, and recorded as failed if that fails too.
    Afterwards `batch.positions` are the rows of the inputs and nothing is left encoded.
    """
    if not batch.jpeg_index:
        return None if batch.pixels is None else preprocess.normalize(batch.pixels.to(device, non_blocking=True))
    crops = {}
    if batch.pixels is not None:
        on_device = batch.pixels.to(device, non_blocking=True)
        crops.update(zip(batch.positions, on_device.unbind(0)))
    for position, decoded in _decode_on_gpu(batch.encoded, device):
        if decoded is not None:
            crops[position] = preprocess.resize_and_crop(decoded)
            continue
        try:  # only this image's decoding may fail it; a device error below stops the run
            pixels = preprocess.pixels(open_rgb(images.open(position).source, preprocess.draft))
        except Exception as error:  # recorded like a worker's failure
            batch.failures.append((position, describe_failure(error)))
            continue
        crops[position] = torch.from_numpy(pixels).to(device)
    batch.jpeg_bytes, batch.jpeg_index = None, []
    batch.positions = sorted(crops)
    if not crops:
        return None
    return preprocess.normalize(torch.stack([crops[p] for p in batch.positions]))


def _decode_on_gpu(encoded: list[tuple[int, torch.Tensor]], device: torch.device):
    """Yield (position, uint8 CHW tensor on DEVICE or None when nvjpeg failed on it)."""
    if not encoded:
        return
    from torchvision.io import ImageReadMode, decode_jpeg

    tensors = [data for _, data in encoded]
    if device.type == "cuda":
        # nvJPEG's hardware decoder does not wait for work queued on the stream, and its outputs come from
        # the caching allocator: memory the queued forward still uses could be handed to it and overwritten.
        torch.cuda.current_stream(device).synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        decoded = _decode_halving(tensors, lambda part: decode_jpeg(part, mode=ImageReadMode.RGB, device=device))
    yield from zip([position for position, _ in encoded], decoded)


def _decode_halving(tensors: list[torch.Tensor], decode) -> list[torch.Tensor | None]:
    """DECODE(list) on all of TENSORS; when one bad JPEG fails the batched call, the halves are decoded again
    (k bad JPEGs cost about 2k log2(n) calls, not n), and a bad one alone gives None."""
    try:
        return list(decode(tensors))
    except RuntimeError as error:
        raise_if_device_failure(error)
        if len(tensors) == 1:
            return [None]
        half = len(tensors) // 2
        return _decode_halving(tensors[:half], decode) + _decode_halving(tensors[half:], decode)


def raise_if_device_failure(error: BaseException) -> None:
    """Re-raise as DeviceFailure an error of the device itself (out of memory, a sticky CUDA error), which no
    image caused and which would fail every image after it; decode errors of one image pass."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    text = str(error)
    if isinstance(error, torch.cuda.OutOfMemoryError) or (accelerator_error and isinstance(error, accelerator_error)) \
            or "CUDA error" in text or "out of memory" in text:
        raise DeviceFailure(f"The GPU failed while decoding images ({text.strip().splitlines()[0]}); committed rows "
                            "are kept: fix the cause (a smaller --batch-size for out of memory) and run the same "
                            "command again to resume.") from error
