"""`python -m featdump` runs the command-line interface."""

from featdump.faces.cli import main

main(prog_name="featdump")
