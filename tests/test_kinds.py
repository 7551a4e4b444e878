"""The lists of kinds (inputs, models) are generated from the registries: the docs' tables name featdump's own
readers and sources (another package's plugin never changes them: tests/test_plugins.py), the help texts and the
message for an input no reader claims name every registered one, plugins included."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from featdump.errors import NoImages
from featdump.faces import kinds
from featdump.faces.cli import main
from featdump.inputs.readers import Asked, read_images, readers
from featdump.locations import Location
from featdump.sources.registry import sources

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("what, page", [("inputs", "inputs.md"), ("models", "models.md")])
def test_the_docs_hold_the_tables_the_registries_generate(what, page):
    assert kinds.generated(what) in (DOCS / page).read_text(), f"run: python -m featdump.faces.kinds {what}"


def test_every_reader_and_source_is_in_its_table_and_help():
    inputs, models = kinds.input_table(), kinds.model_table()
    assert all(reader.kind in inputs for reader in readers() if kinds.own(reader))
    assert "a .zip of images" in inputs  # featdump's own, registered as a plugin is
    assert all(source.kind in models for source in sources() if kinds.own(source)) and "hub:ORG/REPO:ENTRY" in models
    helped = " ".join(CliRunner().invoke(main, ["extract", "--help"], terminal_width=10_000).output.split())
    assert all(" ".join(reader.kind.split()) in helped for reader in readers())
    assert all(" ".join(source.kind.split()) in helped for source in sources())


def test_an_input_no_reader_claims_is_told_every_reader_in_one_short_line(tmp_path):
    with pytest.raises(NoImages) as refused:
        read_images(Location.of(str(tmp_path / "nothing")), Asked())
    said = str(refused.value)
    assert all(reader.name in said for reader in readers()) and "featdump extract --help" in said
    assert len(said) - len(str(tmp_path)) < 200 and "\n" not in said, said
