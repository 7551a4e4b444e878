"""Readers: one per kind of input, each saying whether it claims the Location the user named and listing its
images as an `ImageList`. `find_images` asks them in order (`READERS`); a new kind of input is one more reader.
A local path and a URL are not two dispatches: each reader claims what it reads, wherever it lies. This is the
inputs' one module that tells a path on this machine from a URL (`ListedURLs`: a list's rows, each read where it
lies); the modules each reader calls read one kind, or read both through `stores.filesystem`."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from featdump.errors import FeatdumpError, NoImages, ReaderFailed, UsageProblem
from featdump.inputs.arrays import is_array_file, listed_rows, read_array, read_array_row
from featdump.inputs.asked import (
    ARRAY,
    IMAGE_COLUMN,
    IMAGE_ROOT,
    LABEL_COLUMN,
    SPLIT,
    TABLE_OPTIONS,
    Asked,
    ReaderOption,
)
from featdump.inputs.folder import IMAGE_EXTENSIONS, read_folder
from featdump.inputs.imagelist import Encoded, Files, ImageList
from featdump.inputs.listfile import LIST_SUFFIXES, check_list_name, list_entries
from featdump.inputs.objects import check_access, only_image, read_object, read_prefix, video_where_it_lies
from featdump.inputs.remote_tars import PATTERN_SEPARATOR, read_remote_tars
from featdump.inputs.stores import Patience, fetch_all, fetch_as_ready
from featdump.inputs.table_names import folder_of_tables, names_tables, prefix_of_tables
from featdump.inputs.tables import read_table_row, read_tables
from featdump.inputs.tar_names import TAR_SUFFIX, check_not_compressed, check_tar_names, expand_braces, named_tars
from featdump.inputs.tars import read_stored, read_tars
from featdump.inputs.video import is_video_file, is_video_name
from featdump.locations import Location


class Reader:
    """One kind of input: whether it claims a Location (readers are asked by PRIORITY, lowest first: a list file
    claims any local file, a prefix any URL, so they come late), its rows, and a row's bytes read back for `show`.
    A reader outside featdump registers through the entry point group `featdump.readers` (a Reader class; its NAME,
    for --reader, the entry point's unless it states one). It declares the OPTIONS it takes (`ReaderOption`), and
    reads their values with `asked.option(self, NAME)`; an option it does not declare is refused before it reads."""

    name = ""  # what --reader calls it
    priority = 50
    kind = "an input"  # what it reads, as the help, the docs and a message list it
    example = "IMAGES"  # an IMAGES argument it claims, for the docs
    options: tuple[ReaderOption, ...] = ()

    def claims(self, where: Location, asked: Asked) -> bool:
        raise NotImplementedError

    def read(self, where: Location, asked: Asked) -> ImageList:
        raise NotImplementedError

    def read_back(self, root: str, relative: str) -> bytes | None:
        """The encoded image of row path RELATIVE of a job that read ROOT, where this kind made it; else None."""
        return None


class Tables(Reader):
    """Parquet tables of encoded images: a file, a folder or prefix of them, a pattern (`tables`)."""

    name = "parquet"
    options = (ARRAY, IMAGE_COLUMN, LABEL_COLUMN, SPLIT, IMAGE_ROOT)
    priority = 10
    kind = ("Parquet tables of encoded images: a .parquet file, a folder of them or a dataset's `data/`, "
            'hf://datasets/ORG/NAME (`--split`)')
    example = "hf://datasets/ORG/NAME"

    def claims(self, where, asked):
        if names_tables(where.text):
            return True
        if where.remote:
            return prefix_of_tables(where.text, asked.patience or Patience())
        return folder_of_tables(where.path)

    def read(self, where, asked):
        return read_tables(where.text, asked.image_column, asked.label_column, asked.split,
                           asked.option(self, "image_root"))


class Tars(Reader):
    """A .tar, a brace pattern or glob of tars, here or at URLs joined with ::."""

    name = "tar"
    options = (ARRAY,)
    priority = 20
    kind = "tar shards in the webdataset layout: a .tar, a quoted brace pattern or glob, tar URLs joined with ::"
    example = "'shards/{00000..00099}.tar'"

    def claims(self, where, asked):
        return (named_tar_urls(where.text) if where.remote else named_tars(where.path)) is not None

    def read(self, where, asked):
        if where.remote:
            return read_remote_tars(named_tar_urls(where.text), asked.patience)
        return read_tars(named_tars(where.path))


def named_tar_urls(text: str) -> list[str] | None:
    """The tar URLs TEXT names (a URL, brace patterns, several joined with ::), in order; None when it names no
    .tar (a prefix or a list)."""
    urls = [url for pattern in text.split(PATTERN_SEPARATOR) for url in expand_braces(pattern.strip())]
    tars = [url for url in urls if url.lower().endswith(TAR_SUFFIX)]
    if not tars:
        return None
    others = [url for url in urls if url not in tars or not Location.of(url).remote]
    if others:
        raise NoImages(f"The pattern {text!r} names {others[0]!r}, which is not a .tar URL: join only tar URLs "
                       f"with {PATTERN_SEPARATOR}.")
    return tars


class Arrays(Reader):
    """A file of image arrays (HDF5, NetCDF-4, .npy, .npz), its ARRAY (`arrays`)."""

    name = "array"
    options = (ARRAY,)
    priority = 30
    kind = "a file of image arrays: HDF5, NetCDF-4, .npy, .npz (`--array`), a row per index"
    example = "nsd_stimuli.hdf5"

    def claims(self, where, asked):
        return not where.remote and is_array_file(where.path)

    def read(self, where, asked):
        return read_array(where.path, asked.array)


class OneVideo(Reader):
    """One video file: its clips are the rows."""

    name = "video"
    priority = 40
    kind = "a video file, its clips the rows"
    example = "film.mp4"

    def claims(self, where, asked):
        return not where.remote and where.path.is_file() and is_video_file(where.path)

    def read(self, where, asked):
        return ImageList(where.path.parent, (where.path.name,), (-1,), ())


class ListFile(Reader):
    """A .txt or .csv list of images (or of tars), here or at a URL; any other local file is refused by it."""

    name = "list"
    priority = 50
    kind = "a list file: .txt (a path a line) or .csv (`path`, `label`) of images, tars or an array's rows"
    example = "images.txt"

    def claims(self, where, asked):
        return where.text.lower().endswith(LIST_SUFFIXES) if where.remote else where.path.is_file()

    def read(self, where, asked):
        if not where.remote:
            check_not_compressed(where.path)
        check_list_name(str(where.native), asked.named)
        listed = _listed(where, asked.patience or Patience())
        rows = listed_rows(listed)  # rows of a file of arrays, FILE/ARRAY/INDEX
        if rows is not None:
            return rows
        if not any(path.lower().endswith(TAR_SUFFIX) for path in listed.paths):
            return listed
        root = Location.of(listed.root)
        tars = [root.join(path) for path in listed.paths]
        if any(tar.remote for tar in tars):
            return read_remote_tars([tar.text for tar in tars], asked.patience)
        return read_tars(check_tar_names([tar.path for tar in tars], f"the list {where.text!r}"))


class OneObject(Reader):
    """One image at a URL."""

    name = "object"
    priority = 60
    kind = "one image at a URL"
    example = "s3://bucket/cat.jpg"

    def claims(self, where, asked):
        return where.remote and PurePosixPath(where.text).suffix.lower() in IMAGE_EXTENSIONS

    def read(self, where, asked):
        """The single image at the URL, read as a list naming it alone (relative to its folder, as a prefix's keys
        are)."""
        patience = asked.patience or Patience()
        check_access([where.text], patience)
        return ImageList(where.parent.text, (where.name,), (-1,), (), ListedURLs(patience))


class Prefix(Reader):
    """A store prefix, read as a folder."""

    name = "prefix"
    priority = 70
    kind = "a store prefix, read as a folder"
    example = "s3://bucket/images/"

    def claims(self, where, asked):
        return where.remote

    def read(self, where, asked):
        return read_prefix(where.text, asked.patience)


class Folder(Reader):
    """A folder walked recursively (following symlinks once)."""

    name = "folder"
    priority = 80
    kind = "a folder, walked recursively (first-level class folders give labels)"
    example = "./images"

    def claims(self, where, asked):
        return where.path.is_dir()

    def read(self, where, asked):
        return read_folder(where.path, fresh=asked.fresh)


def _listed(where: Location, patience: Patience) -> ImageList:
    """The images the list file at WHERE names, in its order, relative to its folder (a missing file is a skipped
    image later). Entries may be URLs, and the list itself may be one: their stores' access is checked before any
    work."""
    if where.remote:
        found = fetch_all([where.text], patience)[0]
        if isinstance(found, BaseException):
            raise NoImages(f"The list {where.text!r} cannot be read ({found}).")
        handle = io.StringIO(found.decode("utf-8", "surrogateescape"), newline="")
    else:
        handle = open(where.path, newline="", encoding="utf-8", errors="surrogateescape")
    with handle:
        paths, labels = list_entries(handle, str(where.native))
    urls = [path for path in paths if Location.of(path).remote]
    if not where.remote and not urls:
        return ImageList(where.path.parent, paths, labels, ())
    root = where.parent
    check_access(urls or [root.join(paths[0]).text], patience)
    return ImageList(root.native, paths, labels, (), ListedURLs(patience))


@dataclass(frozen=True)
class ListedURLs(Files):
    """The images of a list file that names URLs (and paths: relative to the list's folder, itself perhaps a
    URL), each read where it lies. A URL is named and identified by itself: there is no stat per URL (-1 for its
    size and time)."""

    patience: Patience = field(default_factory=Patience)

    def open(self, root, relative: str, position: int) -> Encoded:
        return only_image(self.open_as_ready(root, [relative], [position]))

    def open_as_ready(self, root, relatives: Sequence[str],
                      positions: Sequence[int]) -> Iterator[tuple[int, Encoded | Exception]]:
        located = [Location.of(root).join(relative) for relative in relatives]
        by_protocol: dict[str, list[int]] = {}
        for index, where in enumerate(located):
            if where.remote:
                by_protocol.setdefault(where.protocol, []).append(index)
            else:
                try:
                    yield index, Files.open(self, root, relatives[index], positions[index])
                except OSError as error:  # a missing or unreadable file: a recorded skip
                    yield index, error
        for indices in by_protocol.values():
            yield from self._fetched(located, relatives, indices)

    def _fetched(self, located: list[Location], relatives: Sequence[str],
                 indices: list[int]) -> Iterator[tuple[int, Encoded | Exception]]:
        """The rows INDICES (URLs of one store): a video read where it lies, an image fetched with the others."""
        for index in [i for i in indices if is_video_name(located[i].text)]:
            yield index, video_where_it_lies(located[index].text, relatives[index], (-1, -1), self.patience)
        indices = [i for i in indices if not is_video_name(located[i].text)]
        for at, found in fetch_as_ready([located[i].text for i in indices], self.patience):
            index = indices[at]
            yield index, found if isinstance(found, BaseException) else Encoded(relatives[index], (-1, -1),
                                                                                data=found)

    def stat(self, root, relative: str, position: int) -> tuple[int, int] | None:
        if Location.of(root).join(relative).remote:
            return -1, -1  # named by its URL: present while the list names it
        return Files.stat(self, root, relative, position)

    def digest(self, root, paths: Sequence[str], labels: Sequence[int], sizes: bool) -> str:
        local = None if Location.of(root).remote else Path(root)
        return Files.digest(self, local, paths, labels, sizes and local is not None)

    def select(self, positions: Sequence[int]) -> ListedURLs:
        return self


BUILT_IN: tuple[Reader, ...] = (Tables(), Tars(), Arrays(), OneVideo(), ListFile(), OneObject(), Prefix(), Folder())
READERS_GROUP = "featdump.readers"
READERS: tuple[Reader, ...] = ()  # every reader, by priority: the built-in ones and those of `featdump.readers`


def readers() -> tuple[Reader, ...]:
    """Every reader by priority: featdump's own and those registered through the entry point group
    `featdump.readers` (each a Reader class; featdump's zip archives come that way too), loaded once."""
    global READERS
    if not READERS:
        from featdump import plugins as plugin_loading

        plugins = plugin_loading.load(READERS_GROUP, _named_plugin)
        READERS = tuple(sorted([*BUILT_IN, *plugins], key=lambda reader: reader.priority))
    return READERS


def _named_plugin(name: str, kind) -> Reader:
    """Entry point NAME's reader, made; named NAME for --reader unless its class states a name."""
    reader = kind()
    if not reader.name:
        reader.name = name
    return reader


def reader_names() -> str:
    """The names --reader takes, in the order the readers are asked."""
    return ", ".join(reader.name for reader in readers() if reader.name)


def input_kinds() -> str:
    """Every kind of input the readers read, in the order they are asked, as one phrase (help texts, messages)."""
    return "; or ".join(reader.kind for reader in reversed(readers()))


def read_images(where: Location, asked: Asked) -> ImageList:
    """The images at WHERE, listed by the first reader that claims it; NoImages when none does (naming the reader
    plugins that failed to load, if any did)."""
    from featdump import plugins

    reader = None
    try:
        reader = reader_for(where, asked)
        return reader.read(where, asked)
    except NoImages as error:
        raise plugins.noting_left_out(READERS_GROUP, error) from error.__cause__
    except (FeatdumpError, OSError):
        raise
    except Exception as error:  # a reader's own failure (a plugin's parse of a junk input): one line naming it
        message = " ".join(str(error).split()) or "no message"
        named = "A" if reader is None else f"The {reader.name or type(reader).__name__}"
        raise ReaderFailed(f"{named} reader could not list {asked.named} "
                           f"{where.text!r}: {type(error).__name__}: {message}. Check that input, or the package "
                           "that reads it.") from error


def reader_for(where: Location, asked: Asked) -> Reader:
    """The reader --reader names, or the first that claims WHERE, the options ASKED applying to it; NoImages when
    none does (or the one named does not)."""
    if asked.reader is not None:
        reader = _named_reader(asked.reader)
        if not reader.claims(where, asked):
            raise NoImages(f"--reader {asked.reader} does not read {asked.named} {where.text!r}: it reads "
                           f"{reader.kind}.")
    else:
        reader = next((reader for reader in readers() if reader.claims(where, asked)), None)
    _check_options_apply(reader, where, asked)
    if reader is None:
        raise NoImages(f"{asked.named} {where.text!r} does not exist (the readers: {reader_names()}; "
                       "`featdump extract --help` says what each reads).")
    return reader


def _named_reader(name: str) -> Reader:
    from featdump import plugins

    named = {reader.name: reader for reader in readers() if reader.name}
    if name not in named:
        raise plugins.noting_left_out(READERS_GROUP, UsageProblem(
            f"--reader {name}: no reader of that name; the readers: {', '.join(sorted(named))}."))
    return named[name]


def check_here(where: Location, asked: Asked) -> None:
    """`reader_for`'s refusal of WHERE, where it lies on this machine: nothing is listed (a URL's store is asked once,
    by the reader that reads it)."""
    from featdump import plugins

    if not where.remote:
        try:
            reader_for(where, asked)
        except NoImages as error:
            raise plugins.noting_left_out(READERS_GROUP, error) from error.__cause__


def _check_options_apply(reader: Reader | None, where: Location, asked: Asked) -> None:
    """UsageProblem when an option is set that the reader of WHERE does not declare (a local file's array: a tar's
    and a URL's are not looked for), or a --reader-option is no NAME=VALUE or no value of its type."""
    declared = {option.name: option for option in (reader.options if reader is not None else ())}
    for text in asked.reader_options:
        if "=" not in text or not text.partition("=")[0].strip():
            raise UsageProblem(f"--reader-option {text!r}: give NAME=VALUE (an option the reader declares).")
    for name, value in asked.given().items():
        if name in declared:
            declared[name].value(value)  # its type checked before any listing
        elif name == "array" and where.remote:
            continue
        elif name in TABLE_OPTIONS:
            flags = "--image-root names the folder of Parquet tables' image paths" if name == "image_root" else \
                "--image-column, --label-column and --split name parts of Parquet tables"
            raise UsageProblem(f"{flags}; {asked.named} {where.text!r} is none.")
        elif name == "array":
            raise UsageProblem(f"--array {asked.array} names an array of a file of arrays (HDF5, NetCDF-4, .npy, "
                               f".npz); {asked.named} {where.text!r} is none.")
        else:
            takes = ", ".join(declared) or "none"
            raise UsageProblem(f"--reader-option {name}: the {reader.name if reader else 'no'} reader of "
                               f"{asked.named} {where.text!r} takes no such option (it takes {takes}).")


def stored_image(root: str, relative: str) -> bytes | None:
    """The encoded image of row path RELATIVE of a job that read ROOT: its object's bytes read back from the store,
    its member's bytes when the row came from a tar, its image when it came from an array or a table; None when it
    is none of these (or gone)."""
    if Location.of(root).join(relative).remote:
        found = read_object(root, relative) or read_stored(root, relative)
    else:
        found = read_stored(Path(root), relative) or read_array_row(root, relative) or read_table_row(root, relative)
    return found or next((data for data in (reader.read_back(root, relative) for reader in readers()) if data), None)
