"""Options: what one extract option is (type, default, allowed values, help) and how a value is checked.

Each option is declared once, as a field of `Settings` made with `option(...)`; the Click options, the
config file keys and the API keywords are all derived from those declarations, and every value from any
of them passes the same `Option.check`, so a bad value gives the same one-line error everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from featdump.errors import BadOption
from featdump.locations import Location

_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


@dataclass(frozen=True)
class Option:
    """One extract option, as the CLI, config files and the API all see it."""

    name: str  # the Settings field, the API keyword and the config key: "batch_size"
    kind: type  # str, int, float, bool, or tuple (a list of layer names)
    help: str | Callable[[], str]  # a callable: generated when shown (a list read from a registry)
    choices: tuple[str, ...] = ()  # the allowed values of a str option
    minimum: float | None = None  # the smallest allowed number
    optional: bool = False  # None is allowed (and is the default)
    short: str | None = None  # the CLI's one-letter spelling: "-b"
    metavar: str | None = None
    syntax: Callable[[str], object] | None = None  # raises BadOption for a malformed str value (or list item)
    items: str = 'layer names, e.g. ["layer3", "avgpool"]'  # what a tuple option's items are, for messages
    required: bool = False
    default: object = None  # the field's default (None for a required option)
    table: Callable[[dict], list] | None = None  # a tuple option's items from a config file's table

    @property
    def flag(self) -> str:
        """The command-line spelling: --batch-size."""
        return "--" + self.name.replace("_", "-")

    def check(self, value):
        """VALUE checked (and normalised: layer lists to tuples, integer floats to floats); BadOption otherwise."""
        if value is None and (self.optional or self.required):
            if self.required:
                raise BadOption(f"'{self.name}' is required. On the command line: {self.flag}.")
            return None
        if self.kind is tuple:
            return self._check_items(value)
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.kind) or (self.kind is not bool and isinstance(value, bool)):
            raise self.bad(f"must be {_KINDS[self.kind]}", value)
        if self.choices and value not in self.choices:
            raise self.bad(f"must be one of {', '.join(self.choices)}", value)
        if self.minimum is not None and value < self.minimum:
            raise self.bad(f"must be at least {self.minimum:g}", value)
        if self.syntax is not None:
            self.syntax(value)
        return value

    def from_text(self, text: str):
        """A value typed as text (the command line, an environment variable) converted to the option's kind,
        then checked."""
        if not isinstance(text, str) or self.kind in (str, bool, tuple):
            return self.check(text)
        try:
            value = self.kind(text.strip())
        except ValueError:
            raise self.bad(f"must be {_KINDS[self.kind]}", text) from None
        return self.check(value)

    def _check_items(self, value) -> tuple[str, ...]:
        """A list option (--layers, --reduce): a str or list of str, items also comma-separated."""
        if isinstance(value, dict) and self.table is not None:
            value = self.table(value)
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) for item in items):
            raise self.bad(f"must be a list of {self.items}", value)
        names = tuple(part.strip() for item in items for part in item.split(",") if part.strip())
        if not names and self.required:
            raise self.bad(f"must be a list of {self.items} (see `featdump list-layers MODEL`)", ",".join(items))
        for name in names if self.syntax is not None else ():
            try:
                self.syntax(name)
            except ValueError as problem:  # an item's syntax says what is wrong with it
                raise self.bad(str(problem), name) from None
        return names

    def bad(self, problem: str, value) -> BadOption:
        return BadOption(f"'{self.name}' {problem}, not {value!r}. On the command line: {self.flag}.")


def option(default=None, help: str = "", changes=None, **declaration):  # noqa: A002 - the name Click and argparse use
    """A Settings field that is an extract option: DEFAULT, HELP, what a change of it CHANGES (`job.dependencies`'
    marks; () for nothing) and Option's other fields by keyword."""
    kind = declaration.pop("kind", None) or type(default)
    metadata = {"option": (kind, help, declaration), **marked_as(changes)}
    if declaration.get("required"):
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def options_of(settings_class) -> dict[str, Option]:
    """Every option SETTINGS_CLASS declares, by name, in declaration order."""
    found = {}
    for field in dataclasses.fields(settings_class):
        if "option" not in field.metadata:
            continue
        kind, help_text, declaration = field.metadata["option"]
        default = None if field.default is dataclasses.MISSING else field.default
        found[field.name] = Option(field.name, kind, help_text, default=default, **declaration)
    return found


def as_path(value, name: str) -> Path:
    """IMAGES and OUTPUT: a str or Path."""
    if not isinstance(value, (str, Path)) or not str(value):
        raise BadOption(f"'{name}' must be a path, not {value!r}.")
    return Path(value)


def as_location(value, name: str) -> Path | str:
    """IMAGES or OUTPUT: a path, or a URL (s3://, gs://, http(s)://, hf://) kept as text."""
    as_path(value, name)  # a str or Path, not empty
    return Location.of(value).native


def marked_as(changes) -> dict:
    """A field's metadata saying what a change of it CHANGES (a mark, or a tuple of them); none when not said."""
    return {} if changes is None else {"changes": frozenset((changes,) if isinstance(changes, str) else changes)}
