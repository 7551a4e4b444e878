"""Inputs: images in, batches of model inputs out. `find_images` lists a job's images in order from a folder
(`folder`), a list file (`listfile`) or tar shards (`tars`) as one `ImageList` (`imagelist`: paths, labels,
where each image's bytes lie); `decode` opens an image, `preprocess` splits the model's preprocessing into the
pixels made in the loader's workers and the normalisation on the device; `loader` batches them in source order
in forked workers (`workers` chooses how many) and ends them whatever happens; `gpu_decode` finishes a batch
whose JPEGs are left to nvjpeg."""

from __future__ import annotations

from pathlib import Path

from featdump.errors import NoImages
from featdump.inputs.folder import IMAGE_EXTENSIONS, read_folder
from featdump.inputs.imagelist import Encoded, ImageList
from featdump.inputs.listfile import read_image_list
from featdump.inputs.tars import TAR_SUFFIX, check_not_compressed, check_tar_names, named_tars, read_tars

__all__ = ["IMAGE_EXTENSIONS", "Encoded", "ImageList", "find_images"]


def find_images(source: Path, named: str = "IMAGES") -> ImageList:
    """The images of SOURCE: a folder walked recursively (following symlinks once), a .txt/.csv list file of
    images or of tars, a .tar file, or a brace pattern or glob of tars; NoImages if there are none, its
    message naming the argument or option SOURCE came from (NAMED: IMAGES, --pca-fit)."""
    try:
        return _find_images(Path(source), named)
    except NoImages as error:
        if named == "IMAGES" or str(error).startswith(named):
            raise
        raise NoImages(f"{named} {str(source)!r}: {error}") from error


def _find_images(source: Path, named: str) -> ImageList:
    tars = named_tars(source)
    if tars is not None:
        return read_tars(tars)
    if source.is_file():
        check_not_compressed(source)
        listed = read_image_list(source, named)
        if any(path.lower().endswith(TAR_SUFFIX) for path in listed.paths):
            tars = [listed.root / path for path in listed.paths]
            return read_tars(check_tar_names(tars, f"the list {str(source)!r}"))
        return listed
    if not source.is_dir():
        raise NoImages(f"{named} {str(source)!r} does not exist (give a folder, a list file, a .tar, or a quoted "
                       "pattern of .tar files).")
    return read_folder(source)
