"""The exceptions featdump raises; only the CLI turns them into messages and exit codes."""

from __future__ import annotations


class FeatdumpError(Exception):
    """Base class of every error featdump reports to its user."""

    exit_code = 1


class UsageProblem(FeatdumpError):
    """The user asked for something that cannot be done as asked (exit code 2)."""

    exit_code = 2


class BadOption(UsageProblem):
    """An option's value is of the wrong type or not one of those allowed (CLI, config file and API alike)."""


class ConfigProblem(UsageProblem):
    """A config file that cannot be read, or a key or value it should not have."""


class ShardProblem(UsageProblem):
    """A shard is missing, unfinished, or was made differently from the others."""


class UnknownModel(UsageProblem):
    """No torchvision classification model has this name."""


class UnsupportedModel(UsageProblem):
    """The model exists but is not one featdump can read activations from as it is."""


class ModelFailed(UnsupportedModel):
    """The model raised on a dry forward of inputs of the preprocessing's size."""


class InvalidWeights(UsageProblem):
    """The --weights value is neither DEFAULT, none, a weights name nor a readable checkpoint."""


class WeightsUnavailable(FeatdumpError):
    """Pretrained weights could not be downloaded or read."""


class UnknownLayer(UsageProblem):
    """A layer selector names no module of the model, or a call that never happens."""


class NotPerImage(UsageProblem):
    """A layer's output has no dimension that follows the batch: there is no row per image to store."""


class AmbiguousLayer(UsageProblem):
    """A module runs several times per forward and the selector did not say which call."""


class NoImages(UsageProblem):
    """The image folder is missing or holds no image."""


class ReaderFailed(UsageProblem):
    """A reader raised something other than a row's unreadable bytes while reading a batch (a corrupt database, a
    plugin's bug): the run stops, naming the reader and the input; the rows before the batch stay committed."""


class StoreRefused(UsageProblem):
    """An object store refused access (credentials, permissions) or has no such bucket: no retry will help."""


class StoreUnavailable(FeatdumpError):
    """An object store or web server stayed away past the patience; the partial output resumes when it is back
    (exit code 75, EX_TEMPFAIL: a scheduler may requeue the job)."""

    exit_code = 75


class StoreNeverAnswered(FeatdumpError):
    """An object store never answered this process within the patience: its address or credentials, most likely
    (a node without the store's variables), which the same command on the same node will not mend; not retried
    by Ray (exit code 75, as the store staying away)."""

    exit_code = 75


class NothingRead(FeatdumpError):
    """Every image a run tried was skipped: the output was written, but holds no row from this run."""


class OutputExists(UsageProblem):
    """The output file exists and --overwrite was not given."""


class ResumeMismatch(UsageProblem):
    """A partial output was made with a different configuration or image set."""


class NotAnOutput(UsageProblem):
    """The file to describe is missing or is not a featdump output."""


class MergedViewBroken(FeatdumpError):
    """A merged view's shard files are missing or changed: its rows cannot be read."""


class OutputLocked(FeatdumpError):
    """Another featdump process is writing the same output."""


class OutputWriteError(FeatdumpError):
    """The output could not be written (disk full, no permission, ...)."""


class NotEnoughSpace(FeatdumpError):
    """The expected output is larger than the free disk space."""


class DeviceFailure(FeatdumpError):
    """The GPU itself failed (out of memory, a CUDA error): not an image's fault; the run stops, resumable."""


class RowsUntrusted(FeatdumpError):
    """A batch's rows cannot be stored as the run is configured: the run stops before writing them, and its message
    names the configuration that can (WAY_OUT: the words after "Run again", such as "with --dtype float32")."""

    def __init__(self, problem: str, way_out: str):
        super().__init__(f"{problem} Run again {way_out}.")
        self.problem, self.way_out = problem, way_out

    def explain(self, committed_rows: int, partial: str) -> RowsUntrusted:
        """This error, its message saying what the way out does with an output holding COMMITTED_ROWS in PARTIAL:
        nothing committed starts over by itself; committed rows need --overwrite (no other configuration resumes
        them, and this one stops again at the same batch)."""
        if committed_rows:
            self.args = (f"{self.problem} Run again {self.way_out}, and --overwrite: the {committed_rows} rows "
                         f"committed in {partial} were made this way, and no other configuration can resume them.",)
        else:
            self.args = (f"{self.problem} Run again {self.way_out} (nothing was committed: it starts over).",)
        return self


class ProofFailed(RowsUntrusted):
    """A run's rows are farther from the reference path's (CPU, fp32, eager) than its configuration allows, or
    non-finite where those are finite: the run stops before writing them."""


class StorageOverflow(RowsUntrusted):
    """A finite value became inf in the cast to the storage dtype (float16): the run stops before writing it."""

    def __init__(self, problem: str, layer: str, largest: float):
        super().__init__(problem, "with --dtype float32")
        self.layer, self.largest = layer, largest


class StorageUnderflow(RowsUntrusted):
    """A row's values all lie below the storage dtype's smallest normal number (float16): the cast would store
    zeros or lose their digits; the run stops before writing it."""

    def __init__(self, problem: str, layer: str, largest: float):
        super().__init__(problem, "with --dtype float32")
        self.layer, self.largest = layer, largest


class MixedSizes(UsageProblem):
    """The preprocessing makes images of different sizes, which cannot be batched."""


class BadImage(FeatdumpError):
    """An image could not be decoded and --on-error fail was given."""


class RanksDidNotFinish(FeatdumpError):
    """Under torchrun, not every rank reached the merge in time."""


class Interrupted(FeatdumpError):
    """The run stopped on SIGINT or SIGTERM after committing what was done."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.exit_code = 128 + signal_number


class NotTraceable(Exception):
    """The model cannot be traced into a pruned graph (internal: the capture falls back to hooks)."""


class StopForward(Exception):
    """Raised inside a hook once every requested output is captured, to skip the rest of the model (internal)."""


def first_sentence(error: BaseException) -> str:
    """The first sentence of an error's message (torch's can run to many lines)."""
    text = str(getattr(error, "reason", None) or error).strip() or type(error).__name__
    first = text.splitlines()[0]
    return first.split(". ")[0].rstrip(".")
