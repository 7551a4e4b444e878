"""Inputs: images in, batches of model inputs out. `find_images` lists a job's images in order, asking the
`readers` (one per kind of input, each claiming the Locations it reads) in turn: a folder (`folder`), a list file
(`listfile`) or tar shards (`tars`), or the same where they live at a URL (`stores`: the fsspec file systems,
their faults and retries; `objects`: a store prefix or listed URLs; `remote_tars`), a file of image arrays
(`arrays`: HDF5, NetCDF-4, .npy, .npz) or Parquet tables of encoded images (`tables`); each gives one `ImageList`
(`imagelist`: paths, labels, where each image's bytes lie). `decode` opens an image, `preprocess` splits the
model's preprocessing into the pixels made in the loader's workers and the normalisation on the device; `loader`
batches them in source order in forked workers (`workers` chooses how many) and ends them whatever happens;
`gpu_decode` finishes a batch whose JPEGs are left to nvjpeg. Videos: `video` knows them by content, reads their
frame times and decodes a clip's frames by seeking; `clips` lists a job's videos as rows, one per clip, and decodes
a row for the loader."""

from __future__ import annotations

from pathlib import Path

from featdump.errors import NoImages
from featdump.inputs.folder import IMAGE_EXTENSIONS
from featdump.inputs.imagelist import Encoded, ImageList
from featdump.inputs.readers import Asked, read_images, stored_image
from featdump.inputs.stores import Patience
from featdump.locations import Location

__all__ = ["IMAGE_EXTENSIONS", "Encoded", "ImageList", "Patience", "find_images", "stored_image"]


def find_images(source: Path | str, named: str = "IMAGES", patience: Patience | None = None,
                array: str | None = None, image_column: str | None = None,
                label_column: str | None = None, split: str | None = None) -> ImageList:
    """The images of SOURCE: a folder walked recursively (following symlinks once), a .txt/.csv list file of
    images or of tars, a .tar file, or a brace pattern or glob of tars; or the same at a URL (a store prefix read
    as a folder, a list, tar URLs and their brace patterns joined with ::), read within PATIENCE; or a file of
    image arrays (HDF5, NetCDF-4, .npy, .npz: `arrays`), its ARRAY (None: its only one); or Parquet tables of
    encoded images (`tables`: a file, a folder or prefix, a pattern; IMAGE_COLUMN, LABEL_COLUMN, SPLIT). NoImages if
    there are none, its message naming the argument or option SOURCE came from (NAMED: IMAGES, --pca-fit)."""
    asked = Asked(named, patience or Patience(), array, image_column, label_column, split)  # Patience: its store
    try:
        return read_images(Location.of(source), asked)
    except NoImages as error:
        if named == "IMAGES" or str(error).startswith(named):
            raise
        raise NoImages(f"{named} {str(source)!r}: {error}") from error
