"""Locations: where a file or folder the user named lives, decided once from what they typed. A text that starts
with a protocol (`s3://`, `gs://`, `http(s)://`, `hf://`: any fsspec protocol) is a URL an object store or web
server answers; anything else, a `file://` URL included, is a path on this machine. Every other module takes a
`Location` and asks it, never the text. (The protocol is read here rather than by fsspec's `url_to_fs`, which
would build the file system, and would read featdump's `::`-joined tar URLs as one of its chained URLs.)"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


@dataclass(frozen=True)
class Location:
    """A file or folder: TEXT as typed, and PROTOCOL, the URL's (None: a path on this machine)."""

    text: str
    protocol: str | None = None

    @classmethod
    def of(cls, where: str | os.PathLike | Location) -> Location:
        """The Location of WHERE (a Path is always local; a str is a URL when it starts with a protocol)."""
        if isinstance(where, Location):
            return where
        if isinstance(where, str):
            found = _URL.match(where)
            if found is not None and found[1].lower() != "file":
                return cls(where, found[1].lower())
        return cls(os.fspath(where))

    @property
    def remote(self) -> bool:
        """At a URL, read through its protocol's file system."""
        return self.protocol is not None

    @property
    def file_protocol(self) -> str:
        """The fsspec protocol of the file system that reads it: the URL's, `file` on this machine."""
        return self.protocol or "file"

    def at(self, path: str) -> Location:
        """The Location of PATH, as this Location's file system names its files (`b/k` of s3 is `s3://b/k`)."""
        return Location(f"{self.protocol}://{path}", self.protocol) if self.remote else Location(path)

    @property
    def refused_with_its_bucket(self) -> bool:
        """Whether a refusal of it (401, 403) is its bucket's, whose credentials answer for every object there: not
        at an http(s) URL, a web server's refusal of one URL says nothing of the others."""
        return self.protocol not in ("http", "https")

    @property
    def takes_uploads(self) -> bool:
        """Whether objects can be written at it: a store's URL; not a plain web server's (http, https)."""
        return self.remote and self.protocol not in ("http", "https")

    @property
    def path(self) -> Path:
        """The local path (a `file://` URL's too); ValueError at a URL."""
        if self.remote:
            raise ValueError(f"{self.text} is a URL, not a path on this machine")
        return Path(self.text[len("file://"):] if self.text.lower().startswith("file://") else self.text)

    @property
    def native(self) -> Path | str:
        """What the modules below take: a Path on this machine, the URL's text elsewhere."""
        return self.text if self.remote else self.path

    @property
    def absolute(self) -> str:
        """The URL, or the path resolved: what a file records as where its images came from."""
        return self.text if self.remote else str(self.path.resolve())

    @property
    def plain(self) -> str:
        """What its file system is given: the URL, or the path made absolute (`~` expanded, not resolved)."""
        return self.text if self.remote else str(self.path.expanduser().absolute())

    @property
    def file_here(self) -> Path | None:
        """The file on this machine it names; None when there is none (nothing there, a folder, or a URL)."""
        return self.path if not self.remote and self.path.is_file() else None

    @property
    def folder_here(self) -> Path | None:
        """The folder on this machine it names; None when there is none (nothing there, a file, or a URL)."""
        return self.path if not self.remote and self.path.is_dir() else None

    @property
    def bare(self) -> str:
        """The URL without its protocol (`s3://b/k` -> `b/k`); a path's text."""
        return self.text.split("://", 1)[1] if self.remote else self.text

    @property
    def bucket(self) -> Location:
        """The URL's bucket (or host): `s3://b/k/x.png` -> `s3://b`; a path is its own."""
        return Location(f"{self.protocol}://{self.bare.split('/', 1)[0]}", self.protocol) if self.remote else self

    @property
    def name(self) -> str:
        return posixpath.basename(self.text.rstrip("/")) if self.remote else self.path.name

    @property
    def suffix(self) -> str:
        return posixpath.splitext(self.name)[1]

    @property
    def parent(self) -> Location:
        """The folder (or store prefix) holding this one."""
        return Location(self.text.rstrip("/").rsplit("/", 1)[0], self.protocol) if self.remote \
            else Location(str(self.path.parent))

    def join(self, relative: str) -> Location:
        """RELATIVE under this folder, its `.` and `..` resolved as a path's are at a URL (`s3://b/lists` +
        `../images/x.png` is `s3://b/images/x.png`); a RELATIVE that is itself a URL stays as it is."""
        inner = Location.of(relative)
        if inner.remote:
            return inner
        if not self.remote:
            return Location(str(self.path / relative))
        joined = self.text.rstrip("/") + "/" + relative
        if not {".", ".."} & set(relative.split("/")):
            return Location(joined, self.protocol)
        scheme, rest = joined.split("://", 1)
        host, _, key = rest.partition("/")
        return Location(f"{scheme}://{host}/{posixpath.normpath(key).lstrip('/')}", self.protocol)

    def __str__(self) -> str:
        return self.text

