"""Places: an output here or in a store (a real SeaweedFS server on loopback) answers the same questions the same
way: whether it is finished and as what, whether it can be written, where a run writes it, what a store holds."""

from __future__ import annotations

from pathlib import Path

import pytest

import featdump
from featdump.errors import ShardProblem, StoreRefused, UsageProblem
from featdump.inputs.stores import Patience
from featdump.locations import Location
from featdump.output import remote
from featdump.output.places import Here, InStore, place_of

from .helpers import write_images

PATIENCE = Patience(seconds=5)


def test_a_url_is_in_a_store_and_anything_else_is_here(tmp_path):
    assert isinstance(place_of("s3://bucket/run/out.h5"), InStore)
    assert isinstance(place_of(tmp_path / "out.h5"), Here)
    assert isinstance(place_of(f"file://{tmp_path}/out.h5"), Here)
    assert place_of(f"file://{tmp_path}/out.h5").path == tmp_path / "out.h5"
    assert place_of(Location.of("gs://b/out.h5")).url == "gs://b/out.h5"


def test_an_output_here_is_written_where_it_lies_and_its_folder_must_exist(tmp_path):
    here = place_of(tmp_path / "out.h5")
    assert here.scratch_twin(tmp_path / "scratch") is None and here.stored() is None
    assert here.finished(PATIENCE) is None  # no file yet
    here.check_writable(PATIENCE)
    with pytest.raises(UsageProblem, match="Output folder .*missing.* does not exist; create it first"):
        place_of(tmp_path / "missing" / "out.h5").check_writable(PATIENCE)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished output of 6 images (a random resnet18's avgpool)."""
    root = tmp_path_factory.mktemp("places")
    write_images(root / "images", {"a": 3, "b": 3}, size=(40, 32))
    featdump.extract(root / "images", root / "out.h5", model="resnet18", weights="none", layers="avgpool")
    return root / "out.h5"


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_finished_output_is_read_alike_here_and_in_a_store(finished, store_env, tmp_path, monkeypatch):
    client = store_env.client()
    if not client.exists("places"):
        client.mkdir("places")
    url = "s3://places/run/out.h5"
    in_store = place_of(url)
    assert in_store.finished(PATIENCE) is None  # the store shows an object once it is finished
    with pytest.raises(ShardProblem, match="No shards of 's3://places/run/out.h5' found"):
        in_store.stored()  # nothing there: neither the output nor a shard of it (`info` says so in one line)
    in_store.check_writable(PATIENCE)
    assert in_store.scratch_twin(tmp_path / "scratch").parent.is_relative_to(tmp_path / "scratch")
    remote.upload(finished, url, PATIENCE)
    here, there = place_of(finished).finished(PATIENCE), in_store.finished(PATIENCE)
    assert here is not None and there is not None
    assert (there.fingerprint, there.complete, there.committed.rows) == (here.fingerprint, True, 6)
    assert there.size == here.size == finished.stat().st_size
    stored = in_store.stored()
    assert (stored["state"], stored["rows"], stored["layers"]) == ("in store", 6, ["avgpool"])
    for key, value in store_env.writer_env.items():  # a user who may write objects but not make buckets
        monkeypatch.setenv(key, value)
    place_of("s3://places/other/out.h5").check_writable(PATIENCE)
    with pytest.raises(StoreRefused, match="no-such-bucket-here"):
        place_of("s3://no-such-bucket-here/out.h5").check_writable(PATIENCE)


def test_the_same_bucket_path_in_two_stores_has_two_scratch_twins(tmp_path, monkeypatch):
    """Two jobs on one node writing s3://runs/a/out.h5 to two stores (two endpoints) never share a partial file."""
    from featdump.output.remote import scratch_twin

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333")
    first = scratch_twin("s3://runs/a/out.h5", tmp_path)
    assert scratch_twin("s3://runs/a/out.h5", tmp_path) == first  # a retry finds its own again
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9333")
    second = scratch_twin("s3://runs/a/out.h5", tmp_path)
    assert second != first and second.name == first.name == "out.h5"
