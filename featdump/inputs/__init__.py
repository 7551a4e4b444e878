"""Inputs: images in, batches of model inputs out. `find_images` lists a job's images in order from a folder
(`folder`), a list file (`listfile`) or tar shards (`tars`), or from where they live at a URL (`stores`: the fsspec
file systems, their faults and retries; `objects`: a store prefix or listed URLs; `remote_tars`), as one `ImageList`
(`imagelist`: paths, labels, where each image's bytes lie), or from a file of image arrays (`arrays`: HDF5,
NetCDF-4, .npy, .npz) or Parquet tables of encoded images (`tables`); `decode` opens an image, `preprocess` splits
the model's preprocessing into the pixels made in the loader's workers and the normalisation on the device; `loader`
batches them in source order in forked workers (`workers` chooses how many) and ends them whatever happens;
`gpu_decode` finishes a batch whose JPEGs are left to nvjpeg. Videos: `video` knows them by content, reads their
frame times and decodes a clip's frames by seeking; `clips` lists a job's videos as rows, one per clip, and decodes
a row for the loader."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from featdump.errors import NoImages, UsageProblem
from featdump.inputs.arrays import is_array_file, read_array, read_array_row
from featdump.inputs.folder import IMAGE_EXTENSIONS, read_folder
from featdump.inputs.imagelist import Encoded, ImageList
from featdump.inputs.listfile import LIST_SUFFIXES, one_object, read_image_list
from featdump.inputs.objects import read_object, read_prefix
from featdump.inputs.remote_tars import named_remote_tars, read_remote_tars
from featdump.inputs.stores import Patience
from featdump.inputs.tables import names_tables, read_table_row, read_tables
from featdump.inputs.tars import TAR_SUFFIX, check_not_compressed, check_tar_names, named_tars, read_stored, read_tars
from featdump.inputs.video import is_video_file
from featdump.locations import Location

__all__ = ["IMAGE_EXTENSIONS", "Encoded", "ImageList", "Patience", "find_images", "is_url"]


def find_images(source: Path | str, named: str = "IMAGES", patience: Patience | None = None,
                array: str | None = None, image_column: str | None = None,
                label_column: str | None = None) -> ImageList:
    """The images of SOURCE: a folder walked recursively (following symlinks once), a .txt/.csv list file of
    images or of tars, a .tar file, or a brace pattern or glob of tars; or the same at a URL (a store prefix read
    as a folder, a list, tar URLs and their brace patterns joined with ::), read within PATIENCE; or a file of
    image arrays (HDF5, NetCDF-4, .npy, .npz: `arrays`), its ARRAY (None: its only one); or Parquet tables of
    encoded images (`tables`: a file, a folder or prefix, a pattern; IMAGE_COLUMN and LABEL_COLUMN). NoImages if
    there are none, its message naming the argument or option SOURCE came from (NAMED: IMAGES, --pca-fit)."""
    patience = patience or Patience()  # each call its own: a Patience records what its store did
    try:
        if names_tables(str(source), patience):
            return read_tables(str(source), image_column, label_column)
        if image_column is not None or label_column is not None:
            raise UsageProblem(f"--image-column and --label-column name columns of Parquet tables; {named} "
                               f"{str(source)!r} is none.")
        if Location.of(source).remote:
            return _find_remote_images(str(source), named, patience)
        return _find_images(Path(source), named, patience, array)
    except NoImages as error:
        if named == "IMAGES" or str(error).startswith(named):
            raise
        raise NoImages(f"{named} {str(source)!r}: {error}") from error


def stored_image(root: str, relative: str) -> bytes | None:
    """The encoded image of row path RELATIVE of a job that read ROOT: its object's bytes read back from the store,
    its member's bytes when the row came from a tar, its image when it came from an array or a table; None when it
    is none of these (or gone)."""
    if Location.of(root).join(relative).remote:
        return read_object(root, relative) or read_stored(root, relative)
    return read_stored(Path(root), relative) or read_array_row(root, relative) or read_table_row(root, relative)


def _find_remote_images(url: str, named: str, patience: Patience) -> ImageList:
    tars = named_remote_tars(url)
    if tars is not None:
        return read_remote_tars(tars, patience)
    if url.lower().endswith(LIST_SUFFIXES):
        return _listed_images(read_image_list(url, named, patience), url, patience)
    if PurePosixPath(url).suffix.lower() in IMAGE_EXTENSIONS:
        return one_object(url, patience)
    return read_prefix(url, patience)


def _find_images(source: Path, named: str, patience: Patience, array: str | None = None) -> ImageList:
    tars = named_tars(source)
    if tars is not None:
        return read_tars(tars)
    if is_array_file(source):
        return read_array(source, array)
    if array is not None:
        raise UsageProblem(f"--array {array} names an array of a file of arrays (HDF5, NetCDF-4, .npy, .npz); "
                           f"{named} {str(source)!r} is none.")
    if source.is_file() and is_video_file(source):
        return ImageList(source.parent, (source.name,), (-1,), ())  # one video: its clips are the rows
    if source.is_file():
        check_not_compressed(source)
        return _listed_images(read_image_list(source, named, patience), str(source), patience)
    if not source.is_dir():
        raise NoImages(f"{named} {str(source)!r} does not exist (give a folder, a list file, a .tar, or a quoted "
                       "pattern of .tar files; or their URL; or an HDF5, .npy or .npz file of image arrays).")
    return read_folder(source)


def _listed_images(listed: ImageList, source: str, patience: Patience) -> ImageList:
    """LISTED, or the tars it lists."""
    if not any(path.lower().endswith(TAR_SUFFIX) for path in listed.paths):
        return listed
    if any(Location.of(path).remote for path in listed.paths) or Location.of(str(listed.root)).remote:
        return read_remote_tars([str(Location.of(str(listed.root)).join(path)) for path in listed.paths], patience)
    tars = [listed.root / path for path in listed.paths]
    return read_tars(check_tar_names(tars, f"the list {source!r}"))
