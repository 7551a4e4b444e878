"""Training from the stored features (featdump.FeatureDataset): every row (or row and token) exactly once per epoch
with 0 and 2 loader workers and over ranks, values and labels equal to the file's, seeded orders, a resumed epoch
equal to the rest of an uninterrupted one, batches that mix chunks, merged views, shard lists, compressed float16
layers, an unfinished file's committed rows, and one-line errors for bad input."""

from __future__ import annotations

import re
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import featdump
from featdump.errors import FeatdumpError
from featdump.output.layout import open_to_read
from featdump.output.merge import merge
from featdump.output.specs import DatasetSpec
from featdump.output.writer import FeatureWriter
from featdump.training import dataset as dataset_module
from featdump.training.dataset import _Files
from featdump.training.plan import EpochPlan, Order, blocks_of

from .helpers import featdump_env, run_featdump, write_images

ROWS = 203  # no multiple of the chunks, the batches or the buffer


def write_output(path, rows: int = ROWS, compression: str = "none", dtype: str = "float32", finish: bool = True,
                 batch: int = 8, classes=("a", "b", "c"), only=None):
    """A featdump output by featdump's writer: a map (6, 4, 4), a vector (10,), a sequence (5, 8) with one class
    token and a 2x2 patch grid; labels 0-2; rows written in batches of BATCH (its chunks follow them)."""
    rng = np.random.default_rng(7)
    layers = {"map": rng.standard_normal((rows, 6, 4, 4)), "vector": rng.standard_normal((rows, 10)),
              "sequence": rng.standard_normal((rows, 5, 8))}
    layers = {name: values.astype(dtype) for name, values in layers.items() if only is None or name in only}
    specs = {name: DatasetSpec(values.shape[1:], dtype, tokens=(1, 2, 2) if name == "sequence" else None)
             for name, values in layers.items()}
    writer = FeatureWriter.open(path, specs, {"image_count": rows}, {"model": "synthetic", "layers": list(layers)},
                                list(classes), batch, compression)
    for start in range(0, rows, batch):
        stop = min(start + batch, rows)
        writer.append({name: values[start:stop] for name, values in layers.items()},
                      [f"img/{row:05d}.jpg" for row in range(start, stop)], [row % 3 for row in range(start, stop)],
                      [], stop)
    if finish:
        return writer.finish(), layers
    writer.close()
    return path, layers


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    return write_output(tmp_path_factory.mktemp("training") / "out.h5")


def collect(batches) -> dict[str, np.ndarray]:
    """Batches joined: features by layer, row, label (and token)."""
    batches = list(batches)
    joined = {key: torch.cat([batch[key] for batch in batches]).numpy() for key in batches[0] if key != "features"}
    for name in batches[0]["features"]:
        joined[name] = torch.cat([batch["features"][name] for batch in batches]).numpy()
    return joined


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_yields_every_row_once_with_the_file_s_values_and_labels(output, workers):
    path, layers = output
    dataset = featdump.FeatureDataset(path, batch_size=16, buffer_rows=48)
    assert dataset.shapes == {"map": (6, 4, 4), "vector": (10,), "sequence": (5, 8)}
    assert dataset.classes == ["a", "b", "c"] and dataset.layers == ["map", "vector", "sequence"]
    batches = list(DataLoader(dataset, batch_size=None, num_workers=workers))
    assert len(batches) == len(dataset) == -(-ROWS // 16)
    assert sum(len(batch["row"]) < 16 for batch in batches) == 1  # only the last one is short
    got = collect(batches)
    assert sorted(got["row"]) == list(range(ROWS)) and list(got["row"]) != list(range(ROWS))
    for name, values in layers.items():
        np.testing.assert_array_equal(got[name], values[got["row"]])
    np.testing.assert_array_equal(got["label"], got["row"] % 3)
    dropped = collect(DataLoader(featdump.FeatureDataset(path, batch_size=16, buffer_rows=48, drop_last=True),
                                 batch_size=None, num_workers=workers))
    assert len(dropped["row"]) == ROWS // 16 * 16 and len(set(dropped["row"])) == len(dropped["row"])


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_split_an_epoch_into_runs_of_the_same_length(output, drop_last):
    path, _ = output
    parts = [collect(DataLoader(featdump.FeatureDataset(path, batch_size=16, rank=rank, world=2, drop_last=drop_last),
                                batch_size=None, num_workers=2))["row"] for rank in range(2)]
    shared = set(parts[0]) & set(parts[1])
    if drop_last:  # 101 each (the last row of the order left out), whole batches: 6 of 16
        assert len(parts[0]) == len(parts[1]) == 96 and not shared
    else:  # 102 each: the last rank's run wraps around to the first row of the order, as DistributedSampler pads
        assert len(parts[0]) == len(parts[1]) == 102 and len(shared) == 1
        assert sorted(set([*parts[0], *parts[1]])) == list(range(ROWS))


@pytest.mark.parametrize("workers", [0, 3])
def test_every_rank_yields_as_many_batches(workers):
    """240 rows, world 7, batch 17: ranks of 34 or 35 samples yielded 2 or 3 batches, and DDP hung."""
    for drop_last in (False, True):
        counts = []
        for rank in range(7):
            plan = EpochPlan(blocks_of([240], [8]), 1, 17, 17 * 4, Order(True, 0, 0), rank, 7, drop_last)
            yielded = [plan.stream(worker, max(workers, 1)) for worker in range(max(workers, 1))]
            counts.append(sum(len(stream) for stream in yielded))
            assert counts[-1] == len(plan)
        assert counts == [2 if drop_last else 3] * 7, counts


def test_the_order_depends_on_the_seed_and_the_epoch_only(output):
    path, _ = output

    def rows(seed=0, epoch=0, **options):
        dataset = featdump.FeatureDataset(path, batch_size=16, seed=seed, **options)
        dataset.set_epoch(epoch)
        return list(collect(dataset)["row"])

    assert rows() == rows() and rows(epoch=1) == rows(epoch=1)
    assert rows() != rows(epoch=1) and rows() != rows(seed=1)
    assert rows(shuffle=False) == list(range(ROWS))
    assert sorted(rows(epoch=1)) == list(range(ROWS))


def test_a_batch_over_many_chunks_is_read_from_the_file_s_bytes_a_read_per_run_and_equals_h5py(tmp_path,
                                                                                                monkeypatch):
    """Chunks of whole rows, the writer's other datasets between them in the file: a batch in file order is a read
    of the raw bytes per chunk it spans (HDF5's index walked once), every value as h5py reads it; a compressed file
    and a chunk never written go through h5py."""
    path, values = tmp_path / "wide.h5", np.random.default_rng(3).standard_normal((100, 64, 8, 8)).astype(np.float32)
    writer = FeatureWriter.open(path, {"map": DatasetSpec((64, 8, 8), "float32")}, {"image_count": 100},
                                {"model": "synthetic", "layers": ["map"]}, ["a"], 8)
    for start in range(0, 100, 8):  # rows of 16 KB in batches of 8: chunks of 8 rows, paths and labels between
        stop = min(start + 8, 100)
        writer.append({"map": values[start:stop]}, [f"{row}.jpg" for row in range(start, stop)],
                      [0] * (stop - start), [], stop)
    writer.finish()
    layers = {"map": values}
    with open_to_read(path) as h5file:
        size = h5file["features/map"].chunks[0]
    assert size == 8
    reads, real_preadv = [], dataset_module.os.preadv

    def counted(descriptor, buffers, offset):
        reads.append(offset)
        return real_preadv(descriptor, buffers, offset)

    monkeypatch.setattr(dataset_module.os, "preadv", counted)
    batches = list(featdump.FeatureDataset(path, "map", batch_size=size + 8, shuffle=False))  # each over 2 chunks
    np.testing.assert_array_equal(torch.cat([batch["features"]["map"] for batch in batches]).numpy(), layers["map"])
    spans = [len({row // size for row in batch["row"].tolist()}) for batch in batches]
    assert max(spans) == 2 and len(batches) <= len(reads) <= sum(spans), (reads, spans)  # chunks end to end: one
    with open_to_read(path) as h5file:
        dataset = h5file["features/map"]
        offsets = dataset_module._chunk_offsets(dataset)
        row = 64 * 8 * 8 * 4  # bytes
        assert dataset_module._raw_runs(dataset, offsets, 4, size + 12) == [
            (int(offsets[0]) + 4 * row, 0, size - 4), (int(offsets[1]), size - 4, size + 8)]
        offsets[1] = -1  # a chunk never written (a file cut short): HDF5 reads it, as the fill value
        assert dataset_module._raw_runs(dataset, offsets, 4, size + 12) is None
    reads.clear()
    packed, packed_layers = write_output(tmp_path / "packed.h5", rows=100, compression="gzip", only=("map",))
    batches = list(featdump.FeatureDataset(packed, "map", batch_size=32, shuffle=False))
    np.testing.assert_array_equal(torch.cat([batch["features"]["map"] for batch in batches]).numpy(),
                                  packed_layers["map"])
    assert not reads


def test_a_batch_mixes_the_rows_of_many_chunks(tmp_path):
    """Rows of 16 KB written in batches of 8: chunks of 8 rows; a window of 96 rows holds 12 of them."""
    path = tmp_path / "wide.h5"
    writer = FeatureWriter.open(path, {"wide": DatasetSpec((64, 8, 8), "float32")}, {"image_count": 200},
                                {"model": "synthetic", "layers": ["wide"]}, ["a"], 8)
    for start in range(0, 200, 8):
        writer.append({"wide": np.zeros((8, 64, 8, 8), dtype=np.float32)}, [f"{row}.jpg" for row in
                                                                               range(start, start + 8)], [0] * 8, [],
                      start + 8)
    writer.finish()
    with h5py.File(path) as h5file:
        assert h5file["features/wide"].chunks[0] == 8
    batches = list(featdump.FeatureDataset(path, batch_size=16, buffer_rows=96))
    assert [len(batch["row"]) for batch in batches] == [16] * 12 + [8]  # 200 = 2 windows of 96 and one of 8
    for batch in batches[:-1]:
        assert len(set(batch["row"].numpy() // 8)) >= 5, batch["row"]


def test_a_class_sorted_file_s_batches_hold_nearly_as_many_classes_as_a_permutation_s(tmp_path):
    """20 classes of 200 rows in class order, chunks of 32 rows, a window of 1,024 rows (32 chunks) and batches of
    64: blocks of whole 8 MB (the file) gave a window of 1,024 neighbouring rows, about 5.5 classes a batch."""
    path, classes, each = tmp_path / "sorted.h5", 20, 200
    labels = np.repeat(np.arange(classes), each)
    writer = FeatureWriter.open(path, {"x": DatasetSpec((512,), "float32")}, {"image_count": classes * each},
                                {"model": "synthetic", "layers": ["x"]}, [f"c{k}" for k in range(classes)], 8)
    for start in range(0, classes * each, 8):
        writer.append({"x": np.zeros((8, 512), dtype=np.float32)}, [f"{row}.jpg" for row in range(start, start + 8)],
                      labels[start:start + 8].tolist(), [], start + 8)
    writer.finish()
    with h5py.File(path) as h5file:
        assert h5file["features/x"].chunks[0] == 32
    mine = [len(set(batch["label"].tolist()))
            for batch in featdump.FeatureDataset(path, batch_size=64, buffer_rows=1024)][:-1]
    rng = np.random.default_rng(0)
    shuffled = [labels[rng.permutation(len(labels))[:64]] for _ in range(200)]
    permutation = np.mean([len(set(batch.tolist())) for batch in shuffled])  # about 19.3
    assert np.mean(mine) >= 0.6 * permutation, (np.mean(mine), permutation)  # 16.8 measured


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on 2 cores: slow, not wrong
@pytest.mark.parametrize("workers, start", [(0, 5), (2, 0), (2, 3), (2, 6), (2, 12), (3, 7)])
def test_start_batch_yields_the_rest_of_the_uninterrupted_epoch(output, workers, start):
    path, _ = output

    def epoch(start_batch=0):
        dataset = featdump.FeatureDataset(path, batch_size=16, buffer_rows=32, seed=3, start_batch=start_batch)
        dataset.set_epoch(2)
        return list(DataLoader(dataset, batch_size=None, num_workers=workers))

    whole, resumed = epoch(), epoch(start)
    assert len(resumed) == len(whole) - start
    for expected, got in zip(whole[start:], resumed):
        assert torch.equal(expected["row"], got["row"])
        torch.testing.assert_close(expected["features"]["map"], got["features"]["map"], rtol=0, atol=0)


def in_turn(streams: list[list]) -> list:
    """What a DataLoader yields from its workers' STREAMS: one batch of each in turn, skipping those with none left."""
    order, taken = [], [0] * len(streams)
    while any(taken[index] < len(stream) for index, stream in enumerate(streams)):
        for index, stream in enumerate(streams):
            if taken[index] < len(stream):
                order.append(stream[taken[index]])
                taken[index] += 1
    return order


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("start", [0, 1, 30, 61, 62, 63])
def test_a_resumed_epoch_reads_only_the_windows_of_the_batches_it_yields(workers, start):
    """1,000 rows, windows of 4 batches of 16 (the last window shorter): the resumed workers' streams, taken in
    turn, are the uninterrupted ones' from START on, and no window whose batches all come before is read."""
    plan = EpochPlan(blocks_of([1000], [10]), 1, 16, 64, Order(True, 0, 0), 0, 1, False)
    key = [(window.index, batch) for window, batch in in_turn([plan.stream(worker, workers) for worker in
                                                               range(workers)])]
    resumed = in_turn([plan.stream(worker, workers, start) for worker in range(workers)])
    assert [(window.index, batch) for window, batch in resumed] == key[start:]
    assert {window.index for window, _ in resumed} == {index for index, _ in key[start:]}


def test_token_rows_and_a_map_s_positions(output):
    path, layers = output
    every = collect(featdump.FeatureDataset(path, "sequence", batch_size=32, tokens="all"))
    pairs = sorted(zip(every["row"], every["token"]))
    assert pairs == [(row, token) for row in range(ROWS) for token in range(5)]
    np.testing.assert_array_equal(every["sequence"], layers["sequence"][every["row"], every["token"]])
    patches = collect(featdump.FeatureDataset(path, "sequence", batch_size=32, tokens="patches", shuffle=False))
    assert list(patches["token"][:8]) == [1, 2, 3, 4, 1, 2, 3, 4] and len(patches["row"]) == ROWS * 4
    np.testing.assert_array_equal(patches["sequence"], layers["sequence"][patches["row"], patches["token"]])
    positions = collect(featdump.FeatureDataset(path, "map", batch_size=64, tokens="all", buffer_rows=128))
    assert len(positions["row"]) == ROWS * 16 and positions["map"].shape[1:] == (6,)
    y, x = np.divmod(positions["token"], 4)
    np.testing.assert_array_equal(positions["map"], layers["map"][positions["row"], :, y, x])


def test_a_compressed_float16_layer_and_dtype(tmp_path):
    path, layers = write_output(tmp_path / "half.h5", compression="gzip", dtype="float16")
    got = collect(featdump.FeatureDataset(path, ["map", "vector"], batch_size=32, dtype=torch.float32))
    assert got["map"].dtype == np.float32
    np.testing.assert_array_equal(got["map"], layers["map"][got["row"]].astype(np.float32))
    stored = collect(featdump.FeatureDataset(path, "vector", batch_size=32))
    assert stored["vector"].dtype == np.float16


def test_an_unfinished_output_serves_its_committed_rows_when_named_so(tmp_path):
    path, layers = write_output(tmp_path / "out.h5", finish=False)
    with pytest.raises(FeatdumpError, match=r"is not finished .* to train on the 203 rows it has committed, give"):
        featdump.FeatureDataset(path)
    got = collect(featdump.FeatureDataset(tmp_path / "out.h5.partial", "vector", batch_size=64))
    assert sorted(got["row"]) == list(range(ROWS))
    np.testing.assert_array_equal(got["vector"], layers["vector"][got["row"]])


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_merged_view_and_a_list_of_shards_read_as_one_output(tmp_path, monkeypatch):
    write_images(tmp_path / "images", {"a": 5, "b": 6}, size=(40, 32))
    for shard in ("0/2", "1/2"):
        featdump.extract(tmp_path / "images", tmp_path / "out.h5", model="resnet18", weights="none",
                         layers="avgpool,layer4", shard=shard)
    merge(tmp_path / "out.h5", copy=False)
    shards = sorted(tmp_path.glob("out.shard-*.h5"))
    expected = featdump.load(tmp_path / "out.h5", "layer4")
    for source in (tmp_path / "out.h5", shards):
        got = collect(featdump.FeatureDataset(source, "layer4", batch_size=4))
        assert sorted(got["row"]) == list(range(11))
        np.testing.assert_array_equal(got["layer4"], expected.features[got["row"]])
        np.testing.assert_array_equal(got["label"], np.asarray(expected.labels)[got["row"]])
    monkeypatch.setattr(_Files, "MAX_OPEN", 1)  # more shards than files it may hold open (10,000 under ulimit 1024)
    opened = []
    monkeypatch.setattr(dataset_module, "open_to_read", lambda path: opened.append(open_to_read(path)) or opened[-1])
    rows = []
    for batch in featdump.FeatureDataset(tmp_path / "out.h5", "layer4", batch_size=4):
        assert sum(bool(held.id.valid) for held in opened) <= 1  # the other shard closed before this one opened
        rows += batch["row"].tolist()
    assert sorted(rows) == list(range(11)) and len(opened) == 2
    np.testing.assert_array_equal(got["layer4"], expected.features[got["row"]])


def test_bad_input_is_one_featdump_error(output, tmp_path):
    path, _ = output
    with h5py.File(tmp_path / "other.h5", "w") as h5file:
        h5file["x"] = np.zeros(3)
    other_classes, _ = write_output(tmp_path / "classes.h5", classes=("x", "y", "z"))
    other_layers, _ = write_output(tmp_path / "layers.h5", only=("vector", "sequence"))
    for arguments, message in (
        (dict(path=path, layers="nope"), "holds no layer 'nope'"),
        (dict(path=tmp_path / "other.h5"), "not one featdump wrote"),
        (dict(path=tmp_path / "missing.h5"), "No file"),
        (dict(path=path, layers="vector", tokens="all"), "it has no tokens"),
        (dict(path=path, layers="map,sequence", tokens="all"), "different numbers of tokens per image"),
        (dict(path=path, tokens="some"), "tokens='some'"),
        (dict(path=path, rank=2, world=2), "rank=2 of world=2"),
        (dict(path=path, batch_size=0), "batch_size=0"),
        (dict(path=path, dtype="float32"), "dtype='float32': give a torch dtype"),
        (dict(path=path, seed=-1), "seed=-1"),
        (dict(path=path, seed="0"), "seed='0'"),
        (dict(path=[path, other_classes]), re.escape("not a part of the first file's job (classes ['x', 'y', 'z']")),
        (dict(path=[path, other_layers]), re.escape("not a part of the first file's job (no layer 'map')")),
    ):
        with pytest.raises(FeatdumpError, match=message) as raised:
            featdump.FeatureDataset(**arguments)
        assert "\n" not in str(raised.value)


def test_numpy_integers_are_counts(output):
    path, _ = output
    dataset = featdump.FeatureDataset(path, "vector", batch_size=np.int64(16), seed=np.int32(3), rank=np.int64(0),
                                      world=np.int64(1), start_batch=np.int64(2), dtype=torch.float64)
    batches = list(dataset)
    assert len(batches) == len(dataset) == 13 - 2 and batches[0]["features"]["vector"].dtype == torch.float64


def test_rank_and_world_default_to_torch_distributed_s(output, tmp_path):
    """Initialised (gloo, one process, a file store): rank 0 of 1; uninitialised: the same without it."""
    import torch.distributed as distributed

    path, _ = output
    distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dataset = featdump.FeatureDataset(path, "vector", batch_size=64)
        assert (dataset.rank, dataset.world) == (0, 1) and len(dataset) == -(-ROWS // 64)
    finally:
        distributed.destroy_process_group()


def test_a_layer_shorter_than_the_file_s_rows_is_refused(tmp_path):
    path, _ = write_output(tmp_path / "short.h5")
    with h5py.File(path, "r+") as h5file:
        h5file["features/vector"].resize(100, axis=0)  # damaged: fewer rows than the counters commit
    with pytest.raises(FeatdumpError, match="layer 'vector' holds 100 rows where the file has committed 203"):
        featdump.FeatureDataset(path, "map,vector")


FRESH_READER = """
import sys
import featdump
rows = sum(len(batch["row"]) for batch in featdump.FeatureDataset(sys.argv[1], "vector", batch_size=64))
print(rows, featdump.load(sys.argv[1], "vector").features.shape[0])
"""


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_zstd_layer_reads_in_a_process_that_never_wrote_one(tmp_path):
    """hdf5plugin's filters are registered by whoever opens an output, not only by a writer."""
    pytest.importorskip("hdf5plugin")
    path, _ = write_output(tmp_path / "zstd.h5", compression="zstd")
    result = subprocess.run([sys.executable, "-c", FRESH_READER, str(path)], capture_output=True, text=True,
                            env=featdump_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(ROWS), str(ROWS)]


def test_featdump_s_readers_share_a_file_in_one_process(output):
    """While a FeatureDataset iterates in this process (no workers), load, probe, rdm and info read the same file."""
    path, layers = output
    batches = iter(featdump.FeatureDataset(path, "vector", batch_size=16))
    first = next(batches)  # the file is open in this process now
    loaded = featdump.load(path, "vector")
    np.testing.assert_array_equal(loaded.features, layers["vector"])
    probed = featdump.probe(path, "vector", folds=3, device="cpu")["vector"]
    assert probed.predicted.shape == (ROWS, 3)
    assert run_featdump("info", path).returncode == 0
    rest = list(batches)
    assert sum(len(batch["row"]) for batch in [first, *rest]) == ROWS
    with h5py.File(path, "r"):  # a script's own handle, h5py's default flags: featdump's readers still read
        np.testing.assert_array_equal(featdump.load(path, "vector").features, layers["vector"])
        assert len(list(featdump.FeatureDataset(path, "vector", batch_size=64))) == 4
