"""What the README and docs name exists: every featdump.NAME resolves, every Python example compiles, every
featdump command line uses a real command and real options."""

from __future__ import annotations

import importlib
import re
import shlex

import click
import pytest

import featdump
from featdump.faces.cli import main

from .helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_NAME = re.compile(r"\bfeatdump((?:\.[A-Za-z_][A-Za-z_0-9]*)+)")
_BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)


def blocks(language: str):
    """(page, code) of every fenced block in LANGUAGE ('' also counts as shell) of every page."""
    for page in PAGES:
        for found, code in _BLOCK.findall(page.read_text()):
            if found == language or (language == "bash" and found == ""):
                yield page.name, code


def resolve(dotted: str):
    """featdump.A.B as Python finds it: attributes of the package, else a module and its attributes."""
    names = dotted.split(".")
    for split in range(len(names), 0, -1):
        try:
            found = importlib.import_module(".".join(names[:split]))
        except ImportError:
            continue
        for name in names[split:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def test_every_featdump_name_the_pages_mention_exists():
    mentioned = {f"featdump{match}" for page in PAGES for match in _NAME.findall(page.read_text())}
    mentioned = {name.rstrip(".") for name in mentioned if not name.endswith((".h5", ".log", ".py"))}
    groups = {name for name in mentioned if f'"{name}"' in (REPO / "pyproject.toml").read_text()}
    assert groups == {"featdump.readers", "featdump.sources"}  # entry point groups, named as pyproject.toml does
    mentioned -= groups
    assert "featdump.srp_matrix" in mentioned
    missing = []
    for name in sorted(mentioned):
        try:
            resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing, f"named in the docs but not importable: {missing}"
    assert set(featdump.__all__) <= set(dir(featdump)) | set(featdump._API)


@pytest.mark.parametrize("page, code", list(blocks("python")))
def test_every_python_example_compiles(page, code):
    compile(code, page, "exec")


def shell_commands():
    """Every `featdump ...` line of the pages' shell blocks, continuation lines joined, comments dropped."""
    for page, code in blocks("bash"):
        joined = code.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("featdump "):
                yield page, line


@pytest.mark.parametrize("page, line", list(shell_commands()))
def test_every_command_line_uses_real_commands_and_options(page, line):
    words = shlex.split(line)[1:]
    command: click.Command = main
    checked = []
    while isinstance(command, click.Group) and words:
        if words[0].startswith("-"):  # the group's own options (-q, -v) before the command
            checked.append((command, words.pop(0)))
            continue
        assert words[0] in command.commands, f"{page}: no command {words[0]!r} in {line!r}"
        command, words = command.commands[words[0]], words[1:]
    checked += [(command, word) for word in words]
    for command, word in checked:
        known = {spelling for parameter in command.params for spelling in (*parameter.opts,
                                                                           *parameter.secondary_opts)}
        known |= {"--help", "-h"}
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
            assert word.split("=")[0] in known, f"{page}: {command.name} has no option {word!r} ({line!r})"


def test_every_option_of_every_command_is_in_the_usage_page():
    usage = (REPO / "docs" / "usage.md").read_text()
    missing = [f"{name} {parameter.opts[-1]}" for name, command in main.commands.items()
               for parameter in command.params if isinstance(parameter, click.Option)
               and not any(re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", usage)
                           for flag in parameter.opts + parameter.secondary_opts if flag.startswith("--"))
               and any(flag.startswith("--") for flag in parameter.opts + parameter.secondary_opts)]
    assert not missing, f"options docs/usage.md does not name: {missing}"
