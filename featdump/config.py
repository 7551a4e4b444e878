"""Config files: a TOML table of extract options (keys are the option names with underscores).

    model = "resnet50"
    layers = ["layer3", "layer4", "avgpool"]
    batch_size = 256

Precedence, lowest first: the file, then FEATDUMP_EXTRACT_* environment variables, then the command line.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from featdump.errors import UsageProblem
from featdump.settings import CHOICES, Settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9/3.10
    import tomli as tomllib

_NOT_OPTIONS = {"images", "output", "command", "space_check"}


class ConfigProblem(UsageProblem):
    """A config file that cannot be read, or a key or value it should not have."""


def option_types() -> dict[str, type]:
    """Every key a config file may set, with the type of its value."""
    types = {}
    for field in dataclasses.fields(Settings):
        if field.name in _NOT_OPTIONS:
            continue
        default = field.default
        if field.name == "layers":
            types[field.name] = tuple
        elif field.name == "num_workers":
            types[field.name] = int
        else:
            types[field.name] = str if default is None or default is dataclasses.MISSING else type(default)
    types["no_space_check"] = bool
    return types


def read_config(path: Path) -> dict:
    """The options in the TOML file PATH, checked: ConfigProblem naming the file, the key and what is allowed."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            table = tomllib.load(handle)
    except OSError as error:
        raise ConfigProblem(f"Cannot read config file {str(path)!r}: {error.strerror}.") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigProblem(f"{path}: not valid TOML ({error}).") from error
    types = option_types()
    options = {}
    for key, value in table.items():
        if key not in types:
            raise ConfigProblem(f"{path}: {key!r} is not an extract option. Allowed keys: {', '.join(sorted(types))}.")
        options[key] = _checked(path, key, value, types[key])
    return options


def _checked(path: Path, key: str, value, wanted: type):
    if wanted is tuple:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
            raise ConfigProblem(f"{path}: {key!r} must be a list of layer names, e.g. [\"layer3\", \"avgpool\"].")
        return value
    ok = isinstance(value, wanted) and not (wanted is int and isinstance(value, bool))
    if wanted is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise ConfigProblem(f"{path}: {key!r} must be {_kind(wanted)}, not {value!r}.")
    choices = CHOICES.get(key)
    if choices and value not in choices:
        raise ConfigProblem(f"{path}: {key!r} must be one of {', '.join(choices)}, not {value!r}.")
    return value


def _kind(wanted: type) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[wanted]
