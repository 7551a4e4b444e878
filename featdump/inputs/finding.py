"""Finding a job's images: the readers asked for IMAGES (or --pca-fit's), with the options that name a part of it;
at once, before a run imports torch, where IMAGES is on this machine and no reader reads it (`check_images`)."""

from __future__ import annotations

from pathlib import Path

from featdump.errors import NoImages
from featdump.inputs.imagelist import ImageList
from featdump.inputs.readers import Asked, check_here, read_images
from featdump.inputs.stores import Patience
from featdump.locations import Location


def find_images(source: Path | str, named: str = "IMAGES", patience: Patience | None = None,
                array: str | None = None, image_column: str | None = None,
                label_column: str | None = None, split: str | None = None, reader: str | None = None,
                reader_options: tuple[str, ...] = (), image_root: str | None = None, fresh: bool = False) -> ImageList:
    """The images of SOURCE: a folder walked recursively (following symlinks once), a .txt/.csv list file of
    images or of tars, a .tar file, or a brace pattern or glob of tars; or the same at a URL (a store prefix read
    as a folder, a list, tar URLs and their brace patterns joined with ::), read within PATIENCE; or a file of
    image arrays (HDF5, NetCDF-4, .npy, .npz: `arrays`), its ARRAY (None: its only one); or Parquet tables of
    encoded images (`tables`: a file, a folder or prefix, a pattern; IMAGE_COLUMN, LABEL_COLUMN, SPLIT); READER: the
    reader by name (None: the first that claims SOURCE), READER_OPTIONS its NAME=VALUE options; FRESH: a folder
    walked anew, never as an earlier command found it (`listings`). NoImages if there are none, its message naming
    the argument or option SOURCE came from (NAMED: IMAGES, --pca-fit)."""
    asked = Asked(named, patience or Patience(), array, image_column, label_column, split, reader,
                  tuple(reader_options), image_root, fresh)  # Patience: its store
    try:
        return read_images(Location.of(source), asked)
    except NoImages as error:
        if named == "IMAGES" or str(error).startswith(named):
            raise
        raise NoImages(f"{named} {str(source)!r}: {error}") from error


def check_images(source: Path | str, array: str | None = None, image_column: str | None = None,
                 label_column: str | None = None, split: str | None = None, reader: str | None = None,
                 reader_options: tuple[str, ...] = (), image_root: str | None = None) -> None:
    """NoImages (or a UsageProblem) at once where IMAGES SOURCE, on this machine, is nothing a reader reads or the
    options name a part it lacks; nothing is listed, and a URL is left to `find_images` (its store is asked once)."""
    check_here(Location.of(source), Asked("IMAGES", Patience(), array, image_column, label_column, split, reader,
                                          tuple(reader_options), image_root))

