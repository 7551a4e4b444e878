"""Locations: what the user typed, read once as a path on this machine or a URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from featdump.locations import Location


@pytest.mark.parametrize("typed, protocol", [
    ("s3://bucket/run/out.h5", "s3"), ("GS://bucket/x", "gs"), ("https://host/a.jpg", "https"),
    ("hf://datasets/org/name/train-00000-of-00002.parquet", "hf"),
    ("s3://b/a.tar::s3://b/c.tar", "s3"),  # featdump's own joining of tar URLs
    ("images/cat.png", None), ("/data/out.h5", None), ("file:///data/out.h5", None), ("c:/data", None),
])
def test_a_text_is_a_url_only_when_it_starts_with_a_protocol_other_than_file(typed, protocol):
    assert Location.of(typed).protocol == protocol
    assert Location.of(typed).remote is (protocol is not None)


def test_a_path_object_is_always_local_even_when_its_text_looks_like_a_url():
    assert not Location.of(Path("s3:/bucket")).remote
    assert Location.of(Path("out.h5")).path == Path("out.h5")


def test_a_file_url_is_its_path_and_a_url_has_none():
    assert Location.of("file:///data/out.h5").path == Path("/data/out.h5")
    with pytest.raises(ValueError, match="is a URL"):
        _ = Location.of("s3://b/out.h5").path


def test_join_resolves_dots_at_a_url_and_keeps_a_url_that_is_already_one():
    lists = Location.of("s3://b/lists/")
    assert str(lists.join("../images/x.png")) == "s3://b/images/x.png"
    assert str(lists.join("a/b.png")) == "s3://b/lists/a/b.png"
    assert str(lists.join("gs://other/y.png")) == "gs://other/y.png"
    assert lists.join("a/b.png").protocol == "s3"
    assert Location.of("/data").join("a/b.png").path == Path("/data/a/b.png")


def test_parent_name_suffix_native_and_absolute(tmp_path, monkeypatch):
    url = Location.of("s3://b/run/out.h5")
    assert (str(url.parent), url.name, url.suffix, url.native, url.absolute) == (
        "s3://b/run", "out.h5", ".h5", "s3://b/run/out.h5", "s3://b/run/out.h5")
    monkeypatch.chdir(tmp_path)
    local = Location.of("run/out.h5")
    assert (local.parent.path, local.name, local.suffix, local.native) == (Path("run"), "out.h5", ".h5",
                                                                           Path("run/out.h5"))
    assert local.absolute == str(tmp_path / "run" / "out.h5")


def test_a_refusal_is_its_bucket_s_except_on_the_web():
    assert not Location.of("https://h/x").refused_with_its_bucket and not Location.of("http://h/x").refused_with_its_bucket
    assert Location.of("s3://b/x").refused_with_its_bucket and Location.of("gs://b/x").refused_with_its_bucket


def test_a_location_is_made_once_and_given_back_as_it_is():
    made = Location.of("s3://b/x")
    assert Location.of(made) is made and made == Location.of("s3://b/x")


def test_the_bare_path_and_the_bucket_of_a_url():
    url = Location.of("s3://b/run/out.h5")
    assert url.bare == "b/run/out.h5" and str(url.bucket) == "s3://b" and url.bucket.protocol == "s3"
    assert Location.of("/data/x").bare == "/data/x" and Location.of("/data/x").bucket == Location.of("/data/x")
