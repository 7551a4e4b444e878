"""`python -m featdump` runs the command-line interface."""

from featdump.faces.cli import console

console()
