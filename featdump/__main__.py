"""`python -m featdump` runs the command-line interface."""

from featdump.cli import main

main(prog_name="featdump")
