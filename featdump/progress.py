"""Progress: what a long pass reports to (an extraction's batches, a read-out's or a ranking's slabs), beside the
other facts every package may import: the CLI gives a tqdm bar or log lines (`faces/terminal.py`), the library none."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """What a pass reports to: the CLI's tqdm bar or log lines."""

    def start(self, total: int, done: int, noun: str = "image") -> None: ...  # NOUN: what a row is (clip, image)

    def advance(self, images: int) -> None: ...

    def found(self, rows: int) -> None: ...  # rows found done (a shard finished before, a resumed part): not a rate

    def close(self) -> None: ...


class NoProgress:
    """A Progress that reports nowhere (the library's default)."""

    def start(self, total: int, done: int, noun: str = "image") -> None:
        pass

    def advance(self, images: int) -> None:
        pass

    def found(self, rows: int) -> None:
        pass

    def close(self) -> None:
        pass
