"""Config files: a TOML table of extract options (keys are the option names with underscores).

    model = "resnet50"
    layers = ["layer3", "layer4", "avgpool"]
    batch_size = 256

Precedence, lowest first: the file, then FEATDUMP_EXTRACT_* environment variables, then the command line.
The keys and the checks of their values are the options' own (`featdump.job.settings`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from featdump.errors import BadOption, ConfigProblem
from featdump.job.settings import OPTIONS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9/3.10
    import tomli as tomllib


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
    options = {}
    for key, value in table.items():
        if key not in OPTIONS:
            raise ConfigProblem(f"{path}: {key!r} is not an extract option. "
                                f"Allowed keys: {', '.join(sorted(OPTIONS))}.")
        try:
            options[key] = OPTIONS[key].check(value)
        except BadOption as error:
            raise ConfigProblem(f"{path}: {error}") from error
    return options
