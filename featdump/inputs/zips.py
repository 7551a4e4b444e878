"""Zip archives: images kept in a .zip (COCO's val2017.zip, THINGS and many stimulus sets ship so), here or at a URL,
read member by member at its offset and never unpacked. One module is the whole input kind: its claim, its listing,
its reading, its reading back for `show`; it registers itself through the entry point `featdump.readers` (as a
third-party reader would).

Rows are the archive's image members in the archive's order, named ARCHIVE/MEMBER (`stimuli.zip/cats/001.jpg`),
labelled by their first folder inside the archive where every member has one (as a folder's are); a member stored
or deflated (ZIP64 too) is read with one ranged read of its local header and one of its bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

import numpy as np

from featdump.errors import NoImages, UsageProblem
from featdump.inputs.folder import IMAGE_EXTENSIONS, class_labels
from featdump.inputs.imagelist import Encoded, ImageList, Storage, hash_lines
from featdump.inputs.readers import Reader
from featdump.inputs.stores import filesystem, store_path
from featdump.locations import Location

ZIP_SUFFIX = ".zip"
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # the fixed 30 bytes before a member's name, extra field and data
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}


class Zips(Reader):
    """A .zip of images, here or at a URL."""

    name = "zip"
    priority = 25  # after tables and tars, before a list file (which claims any local file)
    kind = "a .zip of images, here or at a URL, read member by member (labels from its first folders)"
    example = "stimuli.zip"

    def claims(self, where, asked):
        here = where.file_here
        return where.text.lower().endswith(ZIP_SUFFIX) and (here is None or here.is_file())

    def read(self, where, asked):
        return read_zip(where)

    def read_back(self, root, relative):
        return read_zip_member(root, relative)


@dataclass(frozen=True)
class Archive:
    """The archive as the job listed it: its name (relative to the root), size and version (mtime or ETag)."""

    name: str
    size: int
    version: str


def read_zip(where: Location) -> ImageList:
    """The image members of the archive at WHERE, a row each."""
    fs, path = filesystem(where.text), store_path(where.text)
    try:
        with fs.open(path, "rb") as handle, zipfile.ZipFile(handle) as archive:
            members = [info for info in archive.infolist() if not info.is_dir()
                       and PurePosixPath(info.filename).suffix.lower() in IMAGE_EXTENSIONS]
            info = fs.info(path)
    except zipfile.BadZipFile as error:
        raise NoImages(f"IMAGES {where.text!r} is not a zip archive that can be read ({error}).") from error
    unsupported = sorted({info.compress_type for info in members} - set(_METHODS))
    if unsupported:
        raise UsageProblem(f"IMAGES {where.text!r} holds members compressed with method {unsupported[0]}; featdump "
                           "reads stored and deflated members (as zip, Python and most tools write them).")
    if not members:
        raise NoImages(f"IMAGES {where.text!r} holds no image ({', '.join(sorted(IMAGE_EXTENSIONS))}).")
    labels, classes = class_labels([info.filename for info in members])
    storage = ZipMembers(Archive(where.name, int(info.get("size") or 0),
                                 str(info.get("mtime") or info.get("ETag") or info.get("LastModified") or "")),
                         np.asarray([info.header_offset for info in members], dtype=np.int64),
                         np.asarray([info.compress_size for info in members], dtype=np.int64),
                         np.asarray([info.file_size for info in members], dtype=np.int64),
                         np.asarray([info.compress_type for info in members], dtype=np.int8),
                         np.asarray([info.CRC for info in members], dtype=np.int64))
    return ImageList(where.parent.native, tuple(f"{where.name}/{info.filename}" for info in members), labels,
                     classes, storage)


@dataclass(frozen=True)
class ZipMembers(Storage):
    """Where each image of an archive lies: the offset of its local header, its compressed and plain sizes, its
    method (stored or deflated) and its CRC-32, which with its size identifies it (a rewritten archive's unchanged
    members stay unchanged: --update reads only what is new)."""

    archive: Archive
    header: np.ndarray
    packed: np.ndarray
    size: np.ndarray
    method: np.ndarray
    crc: np.ndarray

    def open(self, root, relative: str, position: int) -> Encoded:
        location = str(Location.of(root).join(self.archive.name))
        data = read_member(location, int(self.header[position]), int(self.packed[position]),
                           int(self.method[position]))
        if len(data) != int(self.size[position]) or zlib.crc32(data) != int(self.crc[position]):
            raise OSError(f"{self.archive.name}: the member {relative} does not read as its directory states (its "
                          "size or CRC-32 differs: was the archive changed since the job listed it?)")
        return Encoded(relative, self.stat(root, relative, position), data=data)

    def stat(self, root, relative: str, position: int) -> tuple[int, int]:
        return int(self.size[position]), int(self.crc[position])  # as listed

    def select(self, positions: Sequence[int]) -> ZipMembers:
        chosen = np.asarray(positions, dtype=np.int64)
        return dataclasses.replace(self, header=self.header[chosen], packed=self.packed[chosen],
                                   size=self.size[chosen], method=self.method[chosen], crc=self.crc[chosen])

    def digest(self, root, paths: Sequence[str], labels: Sequence[int], sizes: bool) -> str:
        """A hash of the member paths and labels (and the archive's name, size and version)."""
        digest = hashlib.sha256(b"zip\n")
        hash_lines(digest, (f"{relative}\0{label}\n" for relative, label in zip(paths, labels)))
        if sizes:
            for size, crc in zip(self.size.tolist(), self.crc.tolist()):
                digest.update(f"{size}\0{crc}\n".encode())
        return digest.hexdigest()


def read_member(location: str, header: int, packed: int, method: int) -> bytes:
    """The plain bytes of the member whose local header lies at HEADER in the archive at LOCATION: the header read
    for the lengths of its name and extra field, then its PACKED bytes, inflated when deflated."""
    fs, path = filesystem(location), store_path(location)
    fixed = fs.cat_file(path, start=header, end=header + _LOCAL_HEADER.size)
    if len(fixed) != _LOCAL_HEADER.size or fixed[:4] != b"PK\x03\x04":
        raise OSError(f"{location}: no member's header at offset {header} (was the archive changed?)")
    name_length, extra_length = _LOCAL_HEADER.unpack(fixed)[-2:]
    start = header + _LOCAL_HEADER.size + name_length + extra_length
    data = fs.cat_file(path, start=start, end=start + packed)
    return zlib.decompressobj(-zlib.MAX_WBITS).decompress(data) if method == zipfile.ZIP_DEFLATED else data


def read_zip_member(root, relative: str) -> bytes | None:
    """The bytes of row path RELATIVE (ARCHIVE.zip/MEMBER) from its archive under ROOT, or None."""
    marker = relative.lower().find(ZIP_SUFFIX + "/")
    if marker < 0:
        return None
    location = str(Location.of(root).join(relative[:marker + len(ZIP_SUFFIX)]))
    try:
        with filesystem(location).open(store_path(location), "rb") as handle, zipfile.ZipFile(handle) as archive:
            return archive.read(relative[marker + len(ZIP_SUFFIX) + 1:])
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
