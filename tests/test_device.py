"""The device set-up (`featdump.forward.device`): every way of naming a GPU reaches one path, an index always,
the current device set, cudnn.benchmark on; TF32 through the API this torch has; a device's out-of-memory error as
one line. CUDA's availability is faked (no GPU here), so CI runs the path a GPU node runs."""

from __future__ import annotations

import warnings

import pytest
import torch

from featdump.errors import DeviceFailure, UsageProblem
from featdump.forward import device as devices


@pytest.fixture
def fake_cuda(monkeypatch):
    """A machine with 2 GPUs, GPU 1 current: the set-device calls recorded, cudnn's flag put back afterwards."""
    made_current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: made_current.append(torch.device(device)))
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    return made_current


@pytest.mark.parametrize("name, local_rank, index", [
    ("cuda", None, 1),  # the current device (torch's "cuda" has no index, which set_device refuses)
    ("auto", None, 1),
    ("cuda:0", None, 0),
    ("cuda:1", 0, 1),  # an explicit index wins over LOCAL_RANK
    ("auto", 0, 0),  # torchrun: this rank's GPU
    ("cuda", 0, 0),
])
def test_every_way_of_naming_a_gpu_sets_up_one_indexed_device(fake_cuda, name, local_rank, index):
    device = devices.resolve_device(name, local_rank)
    assert device == torch.device("cuda", index) and device.index == index
    assert fake_cuda == [device]
    assert torch.backends.cudnn.benchmark is True


def test_a_gpu_that_is_not_there_is_one_usage_line(fake_cuda):
    with pytest.raises(UsageProblem, match=r"Device 'cuda:2' is GPU 2, which does not exist: this machine has 2"):
        devices.resolve_device("cuda:2")
    with pytest.raises(UsageProblem, match="'cuda' is GPU 5"):
        devices.resolve_device("cuda", local_rank=5)
    assert fake_cuda == []


def test_without_cuda_auto_is_the_cpu_and_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_device("auto", local_rank=3) == torch.device("cpu")
    with pytest.raises(UsageProblem, match="CUDA is not available here; use --device cpu"):
        devices.resolve_device("cuda")


def test_tf32_is_set_and_restored_without_a_warning_or_a_mix_of_apis():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch 2.9+ warns of the legacy allow_tf32 flags
        devices.set_tf32(False)
        with devices.exact_float32():
            pass
        devices.set_tf32(True)
        with devices.exact_float32():
            pass
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"
        devices.set_tf32(False)
        assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.conv.fp32_precision == "ieee"
    else:
        assert torch.backends.cuda.matmul.allow_tf32 is True
        devices.set_tf32(False)
        assert torch.backends.cuda.matmul.allow_tf32 is False
    devices.set_tf32(True)  # torch's default, for the tests after this one


def test_an_export_after_a_cuda_run_s_exact_float32_works_and_leaves_it_set():
    """An fp32 CUDA run sets cuDNN to "ieee" through the new API; torch.export, later in the same process (doctor's
    compile trial after its CUDA one, a warm worker), reads the legacy flags, which torch then refuses: featdump's
    export makes them readable while it runs and puts them back."""
    from featdump.forward.ahead import export

    devices.set_tf32(False)
    try:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
        exported = export(torch.fx.symbolic_trace(model), torch.randn(2, 3, 8, 8))
        assert "aten.conv2d" in exported.graph_module.code
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            assert torch.backends.cudnn.conv.fp32_precision == torch.backends.cudnn.rnn.fp32_precision == "ieee"
    finally:
        devices.set_tf32(True)  # torch's default, for the tests after this one


@pytest.mark.parametrize("error", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)"),
    RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    RuntimeError("run_func_( container_handle_, ...) API call failed: CUDA out of memory"),  # an AOTInductor package
])
def test_out_of_memory_becomes_one_line_naming_the_batch_size_and_the_way_out(error):
    with pytest.raises(DeviceFailure) as raised:
        with devices.out_of_memory_as_failure(torch.device("cuda", 0), 256, "out.h5.partial"):
            raise error
    message = str(raised.value)
    assert "\n" not in message and message.startswith("Out of memory on cuda:0 at --batch-size 256 (")
    assert message.endswith("kept in out.h5.partial: run the same command with a smaller --batch-size (e.g. 128) "
                            "to resume.")


def test_other_errors_pass_as_they_are():
    with pytest.raises(RuntimeError, match="shape mismatch"):
        with devices.out_of_memory_as_failure(torch.device("cpu"), 8, "out.h5.partial"):
            raise RuntimeError("shape mismatch")
