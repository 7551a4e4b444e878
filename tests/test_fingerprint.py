"""The fingerprint, alone: what it records, what a merge and a shard leave out, and the differences it names."""

from __future__ import annotations

from featdump.output import fingerprint as fingerprints


class Listing:
    def digest(self) -> str:
        return "d1"

    def __len__(self) -> int:
        return 7


def test_a_fingerprint_holds_the_settings_as_resolved_and_the_listing():
    made = fingerprints.build({"model": "resnet18", "layers": ["avgpool"]}, {}, "Compose()", {"source": "tv"},
                              Listing(), {"shard": "0/2"})
    assert made == {"model": "resnet18", "layers": ["avgpool"], "layouts": {}, "preprocessing": "Compose()",
                    "model_source": {"source": "tv"}, "images": "d1", "image_count": 7, "shard": "0/2"}
    assert fingerprints.of_merged(made) == {key: value for key, value in made.items()
                                            if key not in ("shard", "images", "image_count")}


def test_the_differences_are_named_in_words_and_layers_compare_as_a_set():
    before = {"model": "resnet18", "layers": ["a", "b"], "images": "x", "image_count": 9}
    now = {"model": "resnet34", "layers": ["b", "a"], "images": "y", "image_count": 10}
    assert fingerprints.describe_differences(before, now) == [
        "the image set changed: 9 images when started, 10 now, or files were replaced",
        'model: "resnet18" when started, "resnet34" now']
    assert fingerprints.listing_changed({"all_images": "p"}, {"all_images": "q"})
    assert not fingerprints.listing_changed({"all_images": "p"}, {"all_images": "p"})
