"""Places: where an output lies, decided once from its Location. `Here`, a file on this machine, is written where
it lies; `InStore`, an object at a URL, is written on local scratch and uploaded when finished (`output.remote`).
Each answers the questions a run, an engine and `info` ask of an output the same way, so that no check is made
for one kind and skipped for the other: is it finished (and as what), can it be written, where is it written,
how are its shards merged, and what does a store hold of it."""

from __future__ import annotations

from pathlib import Path

from featdump.inputs.stores import Patience
from featdump.locations import Location
from featdump.output import remote
from featdump.output.layout import Output
from featdump.output.lock import check_folder
from featdump.output.merge import merge, merged_view
from featdump.output.remote import Held
from featdump.output.store_merge import merge_from_store, store_merge_problem, store_shards


class Here:
    """An output file on this machine."""

    def __init__(self, location: Location):
        self.location, self.path = location, location.path

    def finished(self, patience: Patience) -> Held | None:
        """What the finished (or stopped) output holds, from its attributes; None when there is no file."""
        if not self.path.exists():
            return None
        with Output.open(self.path) as output:
            return Held(output.fingerprint, output.complete, output.committed, self.path.stat().st_size)

    def check_writable(self, patience: Patience) -> None:
        """UsageProblem when the output's folder does not exist."""
        check_folder(self.path)

    def scratch_twin(self, scratch: Path | None) -> Path | None:
        """The local file a run writes before uploading it: none, the output is written where it lies."""
        return None

    def beside(self, name: str) -> Path:
        """The file NAME beside this output."""
        return self.path.with_name(name)

    def local_copy(self, scratch: Path | None = None) -> Path:
        """The output itself: it is here."""
        return self.path

    def merge(self, pattern: str | None, *, copy: bool | None, overwrite: bool, scratch: Path | None,
              patience: Patience | None) -> tuple[Path, bool]:
        """(the merged file, whether a view) of the output's shards, merged by `merge` (a view or a COPY)."""
        merged = merge(self.path, pattern, copy=copy, overwrite=overwrite)
        return merged, merged_view(merged)

    def stored(self) -> dict | None:
        """What a store holds of the output: nothing, it lies here."""
        return None


class InStore:
    """An output object at a URL."""

    def __init__(self, location: Location):
        self.location, self.url = location, location.text

    def finished(self, patience: Patience) -> Held | None:
        """What the finished output holds, read from the object's attributes (nothing downloaded); None when the
        store has no such object (a store shows an object only once it is finished)."""
        if not remote.finished_in_store(self.url, patience):
            return None
        return remote.held_in_store(self.url, patience)

    def check_writable(self, patience: Patience) -> None:
        """StoreRefused when the store will not take the output (its bucket missing, writing refused)."""
        remote.check_writable(self.url, patience)

    @property
    def takes_uploads(self) -> bool:
        """Whether objects can be written beside it: a store; not a plain web server (http, https)."""
        return self.location.takes_uploads

    def beside(self, name: str) -> str:
        """The URL of the object NAME beside this output in the store."""
        return str(self.location.parent.join(name))

    def local_copy(self, scratch: Path | None = None) -> Path:
        """The finished output downloaded to SCRATCH (kept there: a second read downloads nothing)."""
        return remote.download(self.url, remote.scratch_twin(self.url, scratch), Patience())

    def scratch_twin(self, scratch: Path | None) -> Path | None:
        """The local file a run writes under SCRATCH before uploading it."""
        return remote.scratch_twin(self.url, scratch)

    def merge(self, pattern: str | None, *, copy: bool | None, overwrite: bool, scratch: Path | None,
              patience: Patience | None) -> tuple[str, bool]:
        """(the URL, False) once the shards in the store are merged into a self-contained copy, made in SCRATCH."""
        return merge_from_store(self.url, pattern, scratch, patience), False

    def stored(self) -> dict | None:
        """What the store holds: the finished output (its counters), else its shards, each finished (uploaded) or
        not, as plain values."""
        patience = Patience()
        held = self.finished(patience)
        if held is not None:
            return {"state": "in store", "file": self.url, "rows": held.committed.rows,
                    "skipped": held.committed.skipped, "bytes": held.size, "model": held.fingerprint.get("model"),
                    "weights": held.fingerprint.get("weights"), "layers": held.fingerprint.get("layers", [])}
        count, urls, missing = store_shards(self.url, None, patience)
        shards = [{"index": index, "file": shard, "state": "not uploaded" if index in missing else "complete"}
                  for index, shard in enumerate(urls)]
        return {"state": "sharded in store", "file": self.url, "shards": shards, "finished": count - len(missing),
                "merge_problem": None if missing else store_merge_problem(self.url, None, patience)}


Place = Here | InStore


def place_of(output: str | Path | Location) -> Place:
    """Where OUTPUT lies: `InStore` at a URL, `Here` anywhere else."""
    location = Location.of(output)
    return InStore(location) if location.remote else Here(location)


def merge_at(output: str | Path, pattern: str | None = None, *, copy: bool | None = None, overwrite: bool = False,
             scratch: Path | None = None, patience: Patience | None = None) -> tuple[str | Path, bool]:
    """(where, whether a view) the shards of OUTPUT were merged into, wherever it lies."""
    return place_of(output).merge(pattern, copy=copy, overwrite=overwrite, scratch=scratch, patience=patience)
