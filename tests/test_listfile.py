"""List files: a .txt or .csv list read into its paths and labels, in its order; a bad list is one line."""

from __future__ import annotations

import io

import pytest

from featdump.errors import NoImages
from featdump.inputs.listfile import check_list_name, list_entries


def test_a_txt_list_skips_blank_and_comment_lines_and_keeps_its_order():
    text = "# made by hand\nb/2.png\n\n a/1.png\r\n#c/3.png\n"
    assert list_entries(io.StringIO(text), "list.txt") == (("b/2.png", " a/1.png"), (-1, -1))


def test_a_csv_list_has_a_path_column_and_optional_integer_labels():
    text = "path,label,note\nx.png,3,a\ny.png,,b\nz.png,-1,c\n,5,empty\n"
    assert list_entries(io.StringIO(text, newline=""), "list.csv") == (("x.png", "y.png", "z.png"), (3, -1, -1))


@pytest.mark.parametrize("name,text,message", [
    ("list.csv", "file,label\nx.png,1\n", r"needs a 'path' column \(it has: file, label\)"),
    ("list.csv", "path,label\nx.png,cat\n", r"line 2: label 'cat' is not an integer"),
    ("list.txt", "# nothing\n\n", r"The list 'list.txt' names no image"),
])
def test_a_bad_list_is_one_line_naming_what_is_wrong(name, text, message):
    with pytest.raises(NoImages, match=message):
        list_entries(io.StringIO(text, newline=""), name)


def test_only_txt_and_csv_files_are_lists():
    check_list_name("images/LIST.TXT")
    with pytest.raises(NoImages, match="'notes.md' is a file: --pca-fit must be a folder, a .txt list or a .csv"):
        check_list_name("notes.md", "--pca-fit")
