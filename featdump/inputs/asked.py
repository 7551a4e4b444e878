"""What a job asks of its input beyond where it is (`Asked`), and the options a reader declares
(`ReaderOption`): the built-in flags' and a plugin's own (--reader-option NAME=VALUE), typed as declared."""

from __future__ import annotations

from dataclasses import dataclass

from featdump.errors import UsageProblem
from featdump.inputs.stores import Patience


@dataclass(frozen=True)
class ReaderOption:
    """An option a reader declares and receives (`Asked.option`): its NAME (`--reader-option NAME=VALUE`; a built-in
    one has a flag of its own, `--image-column`), its TYPE (str, int, float or bool) and its HELP."""

    name: str
    type: type = str
    help: str = ""

    def value(self, text: str):
        """TEXT as this option's TYPE; UsageProblem in one line where it is not one."""
        if self.type is bool and text.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return text.strip().lower() in ("1", "true", "yes", "on")
        try:
            if self.type is bool:
                raise ValueError(text)
            return self.type(text)
        except ValueError as error:
            wanted = {int: "a whole number", float: "a number", bool: "true or false"}.get(self.type, "text")
            raise UsageProblem(f"--reader-option {self.name}={text}: give {wanted} "
                               f"({self.help or 'as the reader states'}).") from error


ARRAY = ReaderOption("array", str, "the array of a file of arrays to read (--array)")
IMAGE_COLUMN = ReaderOption("image_column", str, "the column of encoded images (--image-column)")
LABEL_COLUMN = ReaderOption("label_column", str, "the column of integer labels (--label-column)")
SPLIT = ReaderOption("split", str, "the split of a Hugging Face layout (--split)")
IMAGE_ROOT = ReaderOption("image_root", str, "the folder rows' relative image paths lie under (--image-root)")
TABLE_OPTIONS = ("image_column", "label_column", "split", "image_root")


@dataclass(frozen=True)
class Asked:
    """What the job asks of its input beyond where it is: the argument or option it came from (NAMED: IMAGES,
    --pca-fit, for messages), the store's PATIENCE, a file of arrays' ARRAY, a table's columns, the READER asked
    for by name (None: the first that claims it) and the READER_OPTIONS given (NAME=VALUE, as typed)."""

    named: str = "IMAGES"
    patience: Patience | None = None
    array: str | None = None
    image_column: str | None = None
    label_column: str | None = None
    split: str | None = None  # a Hugging Face layout's split
    reader: str | None = None
    reader_options: tuple[str, ...] = ()
    image_root: str | None = None  # the folder a table's relative image paths lie under
    fresh: bool = False  # list anew, never from a listing kept by an earlier command (--update: files changed)

    def given(self) -> dict[str, str]:
        """Every reader option set, by name: the built-in flags' and each --reader-option's (as text)."""
        flags = {"array": self.array, "image_column": self.image_column, "label_column": self.label_column,
                 "split": self.split, "image_root": self.image_root}
        given = {name: value for name, value in flags.items() if value is not None}
        for text in self.reader_options:
            name, _, value = text.partition("=")
            given[name.strip()] = value
        return given

    def option(self, reader, name: str, default=None):
        """The value of READER's (a `readers.Reader`) declared option NAME as given (typed as it declares), else
        DEFAULT."""
        declared = {option.name: option for option in reader.options}
        text = self.given().get(name)
        return default if text is None or name not in declared else declared[name].value(text)
