"""Fingerprint: what determines a file's rows and values, built, compared and described in this one place.

A run resumes (or updates, or merges with others) only a file whose stored fingerprint equals its own.
"""

from __future__ import annotations

import json
from pathlib import Path

from featdump.errors import ResumeMismatch
from featdump.output.layout import FORMAT, UPGRADED, text_of

SHARD_KEYS = ("shard", "images", "image_count")  # the keys in which the shards of one job differ
IMAGE_KEYS = ("images", "image_count")  # the keys an --update changes
UPDATE_IGNORES = (*IMAGE_KEYS, "shards", "all_images", "all_image_count")  # a merged copy's are updated too
UNORDERED = ("layers", "stored_layers")  # compared as sets: each layer's reduction, layout and fit are keyed by name


def build(settings: dict, layouts: dict[str, str], preprocessing: str, model_source: dict, images,
          extra: dict) -> dict:
    """The fingerprint of a run over IMAGES (an ImageList): the SETTINGS that change its values, as the run resolved
    them (`job.dependencies.fingerprinted`), its layers' batch LAYOUTS, the model's PREPROCESSING (its repr) and
    SOURCE, the listing's digest, and EXTRA (a shard's place in the whole job, a PCA fit's identity)."""
    return {**settings, "layouts": layouts, "preprocessing": preprocessing, "model_source": model_source,
            "images": images.digest(), "image_count": len(images), **extra}


LISTING_REMEDY = ("freeze the listing: write it once to a list file, and run every shard on that file with --overwrite "
                  "(docs/cluster.md)")


def listing_changed(before: dict, now: dict) -> bool:
    """Whether two shards' fingerprints differ in the job's listing of its images (not in what they computed)."""
    return before.get("all_images") != now.get("all_images")


def of_merged(shard_fingerprint: dict) -> dict:
    """What the merge of a job's shards records, from one shard's fingerprint (the job's, without the shard's
    place in it)."""
    return _without(shard_fingerprint, SHARD_KEYS)


def merged_held(fingerprint: dict) -> dict:
    """A merged output's FINGERPRINT as a job's is compared (the shard count aside: it does not change a row)."""
    return _without(fingerprint, ("shards",))


def stored(attrs) -> dict:
    """The fingerprint a file's attributes hold."""
    return json.loads(attrs.get("fingerprint", "{}"))


def store(attrs, fingerprint: dict) -> None:
    attrs["fingerprint"] = json.dumps(fingerprint, sort_keys=True)


def check(attrs, path: Path, fingerprint: dict, ignore: tuple[str, ...] = ()) -> None:
    """ResumeMismatch unless the file with ATTRS was written by this format with FINGERPRINT (IGNORE aside)."""
    if text_of(attrs.get("format")) not in (FORMAT, *UPGRADED):
        raise ResumeMismatch(
            f"{str(path)!r} was written by another featdump version (format {attrs.get('format')!r}, "
            f"this one writes {FORMAT!r}); pass --overwrite to start over."
        )
    differences = describe_differences(_without(stored(attrs), ignore), _without(fingerprint, ignore))
    if differences:
        raise ResumeMismatch(
            f"{str(path)!r} was started with a different configuration ({'; '.join(differences)}). "
            "Run the original command to resume it, or pass --overwrite to start over."
        )


def describe_differences(before_all: dict, now_all: dict) -> list[str]:
    """Human-readable differences between two fingerprints."""
    differences = []
    for key in sorted(set(before_all) | set(now_all)):
        before, now = before_all.get(key), now_all.get(key)
        if key in UNORDERED and isinstance(before, list) and isinstance(now, list):
            before, now = sorted(before), sorted(now)  # a set of layers, whatever order an older file kept
        if before == now:
            continue
        if key == "images":
            differences.append(
                f"the image set changed: {before_all.get('image_count')} images when started, "
                f"{now_all.get('image_count')} now, or files were replaced"
            )
        elif key == "all_images":
            differences.append(
                f"the job's listing of its images changed: {before_all.get('all_image_count')} images in one "
                f"listing, {now_all.get('all_image_count')} in the other (the folder or prefix gained or lost files "
                "while the job ran)"
            )
        elif key not in ("image_count", "all_image_count"):
            differences.append(f"{key}: {_short(before)} when started, {_short(now)} now")
    return differences


def only_the_images_differ(before: dict, now: dict) -> bool:
    """Whether two fingerprints differ in their images alone (the same command, over an input that grew or
    changed)."""
    images = ("images", "image_count", "all_images", "all_image_count")
    return _without(before, images) == _without(now, images) and before != now


def _without(fingerprint: dict, keys: tuple[str, ...]) -> dict:
    return {key: value for key, value in fingerprint.items() if key not in keys}


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
