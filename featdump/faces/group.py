"""The CLI's group (`featdump`): its options, how a command's error reaches the user (one line, its exit code),
and the Click options derived from each extract option's one declaration, for `faces.cli` and
`faces.analysis_commands` to hang their commands on."""

from __future__ import annotations

import logging
import sys

import click

from featdump.errors import FeatdumpError, NoImages
from featdump.faces import sayings
from featdump.faces.terminal import setup_logging
from featdump.job.options import Option
from featdump.job.settings import OPTIONS
from featdump.version import __version__

_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _Group(click.Group):
    """Turns featdump's errors, and Click's usage errors, into one-line messages with their exit codes, never a
    traceback or a usage block."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:  # `featdump nosuch`, a bad global option
            if isinstance(error, _NO_ARGS_IS_HELP):  # plain `featdump`: the help, as Click shows it
                raise
            fail(_usage_line(error, "featdump --help"), 2)

    def invoke(self, ctx: click.Context):
        given = list(ctx.args)  # the subcommand's arguments (Click empties ctx.args as it invokes)
        try:
            return super().invoke(ctx)
        except click.UsageError as error:  # a subcommand's: missing argument, bad path, unknown option
            name = ctx.invoked_subcommand
            fail(_usage_line(error, f"featdump {name} --help" if name else "featdump --help")
                  + sayings.spaced_layers(given), 2)
        except FeatdumpError as error:
            fail(str(error) + (sayings.spaced_layers(given) if isinstance(error, NoImages) else ""), error.exit_code)
        except KeyboardInterrupt:
            fail("Interrupted before any batch was written.", 130)
        except BrokenPipeError:  # `featdump list-layers resnet50 | head`
            sys.stderr.close()
            ctx.exit(0)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as error:
            if ctx.find_root().params.get("verbose", 0) >= 2:
                raise
            fail(f"Internal error: {type(error).__name__}: {error} (rerun with -vv for the traceback).", 1)


def _usage_line(error: click.UsageError, help_command: str) -> str:
    """Click's message in one line, with where to look: `Error: Missing option '-m'. See `featdump extract --help`.`"""
    message = " ".join(error.format_message().split())
    return f"{message}{'' if message.endswith('.') else '.'} See `{help_command}`."


def fail(message: str, exit_code: int):
    exception = click.ClickException(message)
    exception.exit_code = exit_code
    raise exception


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "FEATDUMP"})
@click.version_option(__version__, prog_name="featdump")
@click.option("-v", "--verbose", count=True, help="More detail: -v stage timings and skipped images, -vv tracebacks.")
@click.option("-q", "--quiet", is_flag=True, help="Only errors and the final summary.")
def main(verbose: int, quiet: bool) -> None:
    """Dump intermediate activations of vision models (torchvision, timm, your own) over images into HDF5.

    \b
    featdump list-layers resnet18
    featdump extract --model resnet18 --layers layer3.0.downsample.1,avgpool ./images out.h5
    featdump info out.h5
    featdump show out.h5 --layer layer3.0.downsample.1 -o fmap.png

    Shell completion (bash): eval "$(_FEATDUMP_COMPLETE=bash_source featdump)"
    """
    setup_logging(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)


class _Checked(click.ParamType):
    """A Click type that checks a value with its option's own declaration (the API and config files use the same)."""

    def __init__(self, declared: Option):
        self.declared = declared
        self.name = {int: "integer", float: "float"}.get(declared.kind, "text")

    def convert(self, value, param, ctx):
        # A BadOption raised here reaches the user as the same one line the API and config files give.
        return self.declared.from_text(value) if isinstance(value, str) else self.declared.check(value)


class _GeneratedHelp(click.Option):
    """An option whose help is generated when shown (a list of kinds read from a registry, which loads them)."""

    def __init__(self, *args, generated, **kwargs):
        super().__init__(*args, **kwargs)
        self.generated = generated

    def get_help_record(self, ctx):
        self.help = self.generated()
        return super().get_help_record(ctx)


class KindsOfInput(click.Command):
    """A command whose help lists the kinds of input the readers read where it says INPUT_KINDS."""

    def format_help_text(self, ctx, formatter):
        from featdump.inputs.readers import input_kinds

        self.help = self.help.replace("INPUT_KINDS", input_kinds())
        super().format_help_text(ctx, formatter)


def click_option(name: str):
    """The Click option of the extract option NAME, derived from its one declaration in Settings."""
    declared = OPTIONS[name]
    spellings = [*([declared.short] if declared.short else []), declared.flag]
    keywords = {"generated": declared.help, "cls": _GeneratedHelp} if callable(declared.help) else \
        {"help": declared.help}
    if declared.kind is bool:
        if declared.default:  # on by default: --space-check/--no-space-check
            spellings = [f"{declared.flag}/--no-{declared.flag[2:]}"]
        return click.option(*spellings, name, is_flag=True, default=declared.default, **keywords)
    if declared.kind is tuple:
        return click.option(*spellings, name, multiple=True, required=declared.required, metavar=declared.metavar,
                            **keywords)
    metavar = declared.metavar or ("[" + "|".join(declared.choices) + "]" if declared.choices else None)
    return click.option(*spellings, name, type=_Checked(declared), required=declared.required, metavar=metavar,
                        default=declared.default, show_default=declared.default is not None, **keywords)


def extract_options(command):
    """Every extract option, in declaration order."""
    for name in reversed(OPTIONS):
        command = click_option(name)(command)
    return command


