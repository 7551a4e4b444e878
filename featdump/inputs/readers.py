"""Readers: one per kind of input, each saying whether it claims the Location the user named and listing its
images as an `ImageList`. `find_images` asks them in order (`READERS`); a new kind of input is one more reader.
A local path and a URL are not two dispatches: each reader claims what it reads, wherever it lies."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from featdump.errors import NoImages, UsageProblem
from featdump.inputs.arrays import is_array_file, read_array, read_array_row
from featdump.inputs.folder import IMAGE_EXTENSIONS, read_folder
from featdump.inputs.imagelist import ImageList
from featdump.inputs.listfile import LIST_SUFFIXES, one_object, read_image_list
from featdump.inputs.objects import read_object, read_prefix
from featdump.inputs.remote_tars import named_remote_tars, read_remote_tars
from featdump.inputs.stores import Patience
from featdump.inputs.tables import names_tables, read_table_row, read_tables
from featdump.inputs.tar_names import TAR_SUFFIX, check_not_compressed, check_tar_names, named_tars
from featdump.inputs.tars import read_stored, read_tars
from featdump.inputs.video import is_video_file
from featdump.locations import Location


@dataclass(frozen=True)
class Asked:
    """What the job asks of its input beyond where it is: the argument or option it came from (NAMED: IMAGES,
    --pca-fit, for messages), the store's PATIENCE, a file of arrays' ARRAY, a table's columns."""

    named: str = "IMAGES"
    patience: Patience | None = None
    array: str | None = None
    image_column: str | None = None
    label_column: str | None = None


class Reader:
    """One kind of input."""

    def claims(self, where: Location, asked: Asked) -> bool:
        raise NotImplementedError

    def read(self, where: Location, asked: Asked) -> ImageList:
        raise NotImplementedError


class Tables(Reader):
    """Parquet tables of encoded images: a file, a folder or prefix of them, a pattern (`tables`)."""

    def claims(self, where, asked):
        return names_tables(where.text, asked.patience)

    def read(self, where, asked):
        return read_tables(where.text, asked.image_column, asked.label_column)


class Tars(Reader):
    """A .tar, a brace pattern or glob of tars, here or at URLs joined with ::."""

    def claims(self, where, asked):
        return (named_remote_tars(where.text) if where.remote else named_tars(where.path)) is not None

    def read(self, where, asked):
        if where.remote:
            return read_remote_tars(named_remote_tars(where.text), asked.patience)
        return read_tars(named_tars(where.path))


class Arrays(Reader):
    """A file of image arrays (HDF5, NetCDF-4, .npy, .npz), its ARRAY (`arrays`)."""

    def claims(self, where, asked):
        return not where.remote and is_array_file(where.path)

    def read(self, where, asked):
        return read_array(where.path, asked.array)


class OneVideo(Reader):
    """One video file: its clips are the rows."""

    def claims(self, where, asked):
        return not where.remote and where.path.is_file() and is_video_file(where.path)

    def read(self, where, asked):
        return ImageList(where.path.parent, (where.path.name,), (-1,), ())


class ListFile(Reader):
    """A .txt or .csv list of images (or of tars), here or at a URL; any other local file is refused by it."""

    def claims(self, where, asked):
        return where.text.lower().endswith(LIST_SUFFIXES) if where.remote else where.path.is_file()

    def read(self, where, asked):
        if not where.remote:
            check_not_compressed(where.path)
        listed = read_image_list(where.native, asked.named, asked.patience)
        if not any(path.lower().endswith(TAR_SUFFIX) for path in listed.paths):
            return listed
        root = Location.of(listed.root)
        tars = [root.join(path) for path in listed.paths]
        if any(tar.remote for tar in tars):
            return read_remote_tars([tar.text for tar in tars], asked.patience)
        return read_tars(check_tar_names([tar.path for tar in tars], f"the list {where.text!r}"))


class OneObject(Reader):
    """One image at a URL."""

    def claims(self, where, asked):
        return where.remote and PurePosixPath(where.text).suffix.lower() in IMAGE_EXTENSIONS

    def read(self, where, asked):
        return one_object(where.text, asked.patience)


class Prefix(Reader):
    """A store prefix, read as a folder."""

    def claims(self, where, asked):
        return where.remote

    def read(self, where, asked):
        return read_prefix(where.text, asked.patience)


class Folder(Reader):
    """A folder walked recursively (following symlinks once)."""

    def claims(self, where, asked):
        return where.path.is_dir()

    def read(self, where, asked):
        return read_folder(where.path)


READERS: tuple[Reader, ...] = (Tables(), Tars(), Arrays(), OneVideo(), ListFile(), OneObject(), Prefix(), Folder())


def read_images(where: Location, asked: Asked) -> ImageList:
    """The images at WHERE, listed by the first reader that claims it; NoImages when none does."""
    reader = next((reader for reader in READERS if reader.claims(where, asked)), None)
    _check_options_apply(reader, where, asked)
    if reader is None:
        raise NoImages(f"{asked.named} {where.text!r} does not exist (give a folder, a list file, a .tar, or a quoted "
                       "pattern of .tar files; or their URL; or an HDF5, .npy or .npz file of image arrays).")
    return reader.read(where, asked)


def _check_options_apply(reader: Reader | None, where: Location, asked: Asked) -> None:
    """UsageProblem when an option names a part of an input of another kind (a local file's array: a tar's and a
    URL's are not looked for)."""
    if (asked.image_column is not None or asked.label_column is not None) and not isinstance(reader, Tables):
        raise UsageProblem(f"--image-column and --label-column name columns of Parquet tables; {asked.named} "
                           f"{where.text!r} is none.")
    if asked.array is not None and not where.remote and not isinstance(reader, (Tables, Tars, Arrays)):
        raise UsageProblem(f"--array {asked.array} names an array of a file of arrays (HDF5, NetCDF-4, .npy, .npz); "
                           f"{asked.named} {where.text!r} is none.")


def stored_image(root: str, relative: str) -> bytes | None:
    """The encoded image of row path RELATIVE of a job that read ROOT: its object's bytes read back from the store,
    its member's bytes when the row came from a tar, its image when it came from an array or a table; None when it
    is none of these (or gone)."""
    if Location.of(root).join(relative).remote:
        return read_object(root, relative) or read_stored(root, relative)
    return read_stored(Path(root), relative) or read_array_row(root, relative) or read_table_row(root, relative)
