"""`featdump atlas`: the site of each unit's top images, written from an output, rewritten only where it changed, and
used in a real browser (headless Chromium driven by Selenium, from file://): the index finds a unit by search, its
page shows its top images in order with their values, the arrow key moves to the next unit, and the console holds
no error. Skipped, saying why, where no Chromium is installed (`.ci/run` installs it)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import featdump

from .helpers import run_featdump, write_images

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = os.environ.get("FEATDUMP_TEST_ARTIFACTS")  # where a screenshot is kept (else the test's folder)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """resnet18's layer1 (64 units, 56 x 56 maps) and avgpool over 12 images in two classes, one image then gone."""
    folder = tmp_path_factory.mktemp("atlas")
    write_images(folder / "images", {"cats": 6, "dogs": 6})
    assert run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer1,avgpool", folder / "images",
                        folder / "out.h5").returncode == 0
    (folder / "images" / "dogs" / "img_004.jpg").unlink()  # gone since: shown as missing, not a broken page
    made = run_featdump("atlas", folder / "out.h5", "-k", "4", "-o", folder / "site")
    assert made.returncode == 0, made.stderr
    return folder


def test_the_site_holds_each_unit_s_top_images_in_order_and_a_rerun_writes_nothing(site):
    ranked = featdump.top(site / "out.h5", k=4)
    page = (site / "site" / "units" / "layer1" / "7.html").read_text()
    shown = [int(part.split('"')[0]) for part in page.split('data-row="')[1:5]]
    assert shown == ranked["layer1"].rows[7].tolist()
    assert f"{ranked['layer1'].values[7, 0]:.4g}" in page and "class=\"box\"" in page  # where the maximum lies
    assert "Top images' classes: " in page
    spread = [int(part.split('"')[0]) for part in page.split('id="quantiles">')[1].split('data-row="')[1:]]
    assert spread == ranked["layer1"].quantile_rows[7].tolist() and "50%: " in page  # across its range
    bars = page.split('id="histogram">')[1].split("</div></")[0].count("<div ")
    assert bars == len(ranked["layer1"].histogram[7]) and "below " in page  # every image counted, tails too
    assert len(list((site / "site" / "units" / "avgpool").glob("*.html"))) == 512
    gone = featdump.load(site / "out.h5", "avgpool").paths.index("dogs/img_004.jpg")
    assert all(row != gone for _, row, _ in _pictures_shown(site / "site"))  # no picture drawn of a gone image
    unit = next(unit for unit in range(64) if gone in ranked["layer1"].rows[unit])
    missing = (site / "site" / "units" / "layer1" / f"{unit}.html").read_text()
    assert f'data-row="{gone}"><div class="pic missing">missing</div>' in missing
    again = run_featdump("atlas", site / "out.h5", "-k", "4", "-o", site / "site")
    assert again.returncode == 0 and "Wrote 0 files" in again.stderr, again.stderr


@pytest.mark.slow  # a browser's start and the index's pages: 5-8 s; the pages' content is the quick suite's above
@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Chromium and chromedriver (Debian: apt-get install "
                                                      "chromium chromium-driver; .ci/run installs them)")
def test_the_index_finds_a_unit_its_page_shows_its_top_images_and_a_key_moves_on_in_a_real_browser(site, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        browser.get((site / "site" / "index.html").as_uri())
        assert "576 units" in browser.find_element(By.ID, "page").text  # 64 + 512, paged by 100
        tiles = browser.find_elements(By.CSS_SELECTOR, "#units a.tile")
        assert len(tiles) == 100
        first = tiles[0].find_elements(By.TAG_NAME, "img")
        assert 1 <= len(first) <= 9
        WebDriverWait(browser, 10).until(lambda _: all(browser.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth", image) == 128 for image in first))
        ranked_all = featdump.top(site / "out.h5", k=4)
        by_top = [tile.find_element(By.CLASS_NAME, "caption").text for tile in tiles]
        live = [(name, unit) for name, ranking in ranked_all.items() for unit in range(len(ranking.rows))
                if ranking.values[unit, 0] != ranking.bottom_values[unit, 0]]
        expected = sorted(live, key=lambda item: -ranked_all[item[0]].values[item[1], 0])
        assert by_top[:20] == [f"{name} / unit {unit}" for name, unit in expected[:20]]  # highest top value first
        Select(browser.find_element(By.ID, "order")).select_by_value("share")
        shares = [tile.find_element(By.CLASS_NAME, "about").text for tile in
                  browser.find_elements(By.CSS_SELECTOR, "#units a.tile")]
        assert shares[0].endswith(("100% cats", "100% dogs")) and shares != by_top
        Select(browser.find_element(By.ID, "class")).select_by_visible_text("dogs")
        abouts = [tile.find_element(By.CLASS_NAME, "about").text for tile in
                  browser.find_elements(By.CSS_SELECTOR, "#units a.tile")]
        assert abouts and all(about.endswith(" dogs") for about in abouts)  # units mostly of dogs' images
        Select(browser.find_element(By.ID, "class")).select_by_visible_text("every class")
        Select(browser.find_element(By.ID, "layer")).select_by_value("layer1")
        assert "64 units" in browser.find_element(By.ID, "page").text
        browser.find_element(By.ID, "search").send_keys("layer1 12")
        links = browser.find_elements(By.CSS_SELECTOR, "#units a.tile")
        assert [link.find_element(By.CLASS_NAME, "caption").text for link in links] == ["layer1 / unit 12"]
        links[0].click()
        assert browser.title == "layer1 unit 12"
        ranked = featdump.top(site / "out.h5", k=4)["layer1"]
        cells = browser.find_elements(By.CSS_SELECTOR, "#top .cell")
        assert [int(cell.get_attribute("data-row")) for cell in cells] == ranked.rows[12].tolist()
        values = [float(cell.find_element(By.CLASS_NAME, "value").text) for cell in cells]
        assert values == sorted(values, reverse=True)
        np.testing.assert_allclose(values, ranked.values[12], rtol=1e-3)
        assert all(cell.find_element(By.CLASS_NAME, "class").text in ("cats", "dogs") for cell in cells)
        assert "maximum over its 56 x 56 positions" in browser.find_element(By.ID, "value").text
        images = browser.find_elements(By.CSS_SELECTOR, "#top img")
        assert images and all(browser.execute_script("return arguments[0].naturalWidth", image) == 128
                              for image in images)  # thumbnails load from file://
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_RIGHT)
        assert browser.title == "layer1 unit 13"
        browser.save_screenshot(str(tmp_path / "unit.png") if not ARTIFACTS else os.path.join(ARTIFACTS, "unit.png"))
        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        browser.quit()


def _solid_images(root, paths, seed):
    """A plain colour per image (its own, from SEED) at each of PATHS under ROOT: {path: colour}."""
    from PIL import Image

    colours = {}
    for index, path in enumerate(paths):
        colour = np.random.default_rng([seed, index]).integers(0, 256, 3)
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 30), tuple(int(c) for c in colour)).save(root / path, quality=95)
        colours[path] = colour
    return colours


def _pictures_shown(site_folder):
    """(page, row, thumbnail) of every picture the site's unit pages show."""
    import re

    for page in sorted((site_folder / "units").rglob("*.html")):
        for row, name in re.findall(r'data-row="(\d+)"><div class="pic"><img src="../../thumbs/([0-9a-f]+\.jpg)"',
                                    page.read_text()):
            yield page, int(row), site_folder / "thumbs" / name


def test_two_outputs_whose_rows_differ_in_one_folder_show_each_row_s_own_picture_and_a_changed_image_as_such(
        tmp_path):
    """Two outputs whose row N is another image (the same paths under other folders, in another order) written
    into one site folder, one after the other: every picture the second's pages show is of its own row (its colour),
    the first's thumbnails are gone, the log says the folder held another output's atlas; an image rewritten since
    the output read it is shown as changed, not drawn."""
    from PIL import Image

    from featdump.faces.atlas import atlas
    from tests.makers.outputs import write_output

    paths = [f"{'ab'[row % 2]}/{row:04d}.jpg" for row in range(12)]
    colours = {}
    for name, seed in (("first", 1), ("second", 2)):
        colours[name] = _solid_images(tmp_path / name, paths, seed)
        values = np.random.default_rng(seed).standard_normal((12, 3)).astype(np.float32)
        write_output(tmp_path / f"{name}.h5", {"pooled": values}, root=str(tmp_path / name))
    atlas(tmp_path / "first.h5", tmp_path / "site", k=4)
    first_thumbs = set((tmp_path / "site" / "thumbs").iterdir())
    atlas(tmp_path / "second.h5", tmp_path / "site", k=4)
    shown = list(_pictures_shown(tmp_path / "site"))
    assert len(shown) == 3 * (4 + 4 + 5)  # every unit's top, bottom and quantile images
    for page, row, thumbnail in shown:
        drawn = np.asarray(Image.open(thumbnail).convert("RGB"), dtype=float).mean(axis=(0, 1))
        assert np.abs(drawn - colours["second"][paths[row]]).max() < 6, (page, row)
    assert not first_thumbs & set((tmp_path / "site" / "thumbs").iterdir())  # none of the first's kept
    (tmp_path / "second" / paths[0]).write_bytes((tmp_path / "first" / paths[0]).read_bytes())  # changed since
    atlas(tmp_path / "second.h5", tmp_path / "site", k=12)
    pages = [page.read_text() for page in (tmp_path / "site" / "units").rglob("*.html")]
    assert all('data-row="0"><div class="pic missing">changed since</div>' in page for page in pages)
    assert all(row != 0 for _, row, _ in _pictures_shown(tmp_path / "site"))


def test_top_and_atlas_serve_each_other_whatever_the_layers_and_k(tmp_path):
    """top of two layers with k 16, then atlas of one with k 8; top of one layer, then of three; top -k 9, then
    atlas's default 16: each succeeds, a ranking of more layers or a larger k serves the smaller ask without a pass
    (equal to a stable argsort's first k), a layer not ranked yet is added to the file, no message names an option
    the command lacks."""
    from click.testing import CliRunner

    from featdump.faces.cli import main
    from featdump.units import top as units
    from tests.makers.outputs import write_output

    rng = np.random.default_rng(4)
    layers = {name: rng.standard_normal((40, 6)).astype(np.float32) for name in ("l1", "l2", "l3")}
    write_output(tmp_path / "out.h5", layers)
    out, ranked_file, site = str(tmp_path / "out.h5"), tmp_path / "out.top.h5", str(tmp_path / "site")
    for commands in ([["top", out, "-l", "l1,l2", "-k", "16"], ["atlas", out, "-l", "l2", "-k", "8", "-o", site]],
                     [["top", out, "-l", "l3"], ["top", out, "-l", "l1,l2,l3"], ["top", out, "-l", "l2"]],
                     [["top", out, "-k", "9"], ["atlas", out, "-o", site]]):
        ranked_file.unlink(missing_ok=True)
        for command in commands:
            result = CliRunner().invoke(main, command)
            assert result.exit_code == 0 and "--overwrite" not in result.output, (command, result.output)
    with units.open_to_read(ranked_file) as h5file:
        assert sorted(h5file["top"]) == ["l1", "l2", "l3"]
    rows = np.arange(40)
    for name, values in layers.items():
        for k in (4, 16):
            ranking = featdump.top(out, name, k=k)[name]  # served by the file (k 16), no pass
            for unit in range(6):
                np.testing.assert_array_equal(ranking.rows[unit], np.lexsort((rows, -values[:, unit]))[:k])
                np.testing.assert_array_equal(ranking.bottom_rows[unit], np.lexsort((rows, values[:, unit]))[:k])


def test_a_ranking_of_another_score_is_refused_naming_an_option_the_command_has(tmp_path):
    from click.testing import CliRunner

    from featdump.faces.cli import main
    from tests.makers.outputs import write_output

    write_output(tmp_path / "out.h5", {"pooled": np.random.default_rng(1).standard_normal((20, 3))})
    assert CliRunner().invoke(main, ["top", str(tmp_path / "out.h5"), "--score", "mean"]).exit_code == 0
    refused = CliRunner().invoke(main, ["atlas", str(tmp_path / "out.h5"), "-o", str(tmp_path / "site")])
    assert refused.exit_code != 0 and "score differ" in refused.output and "--overwrite" in refused.output
    again = CliRunner().invoke(main, ["atlas", str(tmp_path / "out.h5"), "-o", str(tmp_path / "site"),
                                      "--overwrite"])
    assert again.exit_code == 0, again.output


def test_the_index_data_marks_dead_units_and_names_each_unit_s_main_class_and_top_pictures(tmp_path):
    """atlas.js: a unit whose every value is equal is dead; each tile points at its first top images' thumbnails
    (named once) and the class most of its top images are of, with their share."""
    import json

    from featdump.faces.atlas import atlas
    from tests.makers.outputs import write_output

    paths = [f"{'ab'[row % 2]}/{row:04d}.jpg" for row in range(10)]
    _solid_images(tmp_path / "images", paths, 3)
    values = np.zeros((10, 3), dtype=np.float32)
    values[:, 0] = np.arange(10) % 2 * 10 + np.arange(10)  # class b's rows highest
    values[:, 2] = np.arange(10)
    write_output(tmp_path / "out.h5", {"pooled": values}, root=str(tmp_path / "images"))
    atlas(tmp_path / "out.h5", tmp_path / "site", k=4)
    data = json.loads((tmp_path / "site" / "atlas.js").read_text().removeprefix("window.ATLAS = ").rstrip(";\n"))
    assert [unit["dead"] for unit in data["units"]] == [0, 1, 0]
    assert data["classes"] == ["a", "b"] and (data["units"][0]["cls"], data["units"][0]["share"]) == (1, 1.0)
    page = tmp_path / "site" / "units" / "pooled" / "0.html"
    top_pictures = [thumb.name for shown, _, thumb in _pictures_shown(tmp_path / "site") if shown == page][:4]
    assert [data["thumbs"][index] for index in data["units"][0]["pics"]] == top_pictures
    assert all((tmp_path / "site" / "thumbs" / name).exists() for name in data["thumbs"])


def test_a_token_layer_s_maximum_is_boxed_on_its_patch_and_tied_lowest_images_are_said_to_be_ties(tmp_path):
    """A ViT-like layer of 1 + 4 x 4 tokens: the top image's box lies on the patch of its maximum's token (none for
    the class token); a unit that is 0 for most images says that at least that share ties at its lowest value, and
    that the images shown are the first in file order; the histogram's axes are named."""
    from featdump.faces.atlas import atlas
    from tests.makers.outputs import write_output

    paths = [f"{'ab'[row % 2]}/{row:04d}.jpg" for row in range(20)]
    _solid_images(tmp_path / "images", paths, 5)
    tokens = np.zeros((20, 17, 2), dtype=np.float32)
    tokens[:, 6, 0] = np.arange(20)  # unit 0's maximum on token 6: patch 5 of the 4 x 4 grid (row 1, column 1)
    tokens[15:, 0, 1] = np.arange(1, 6)  # unit 1: 0 for 15 of 20 images, its maximum on the class token
    write_output(tmp_path / "out.h5", {"tokens": tokens}, root=str(tmp_path / "images"))
    atlas(tmp_path / "out.h5", tmp_path / "site", k=3)
    page = (tmp_path / "site" / "units" / "tokens" / "0.html").read_text()
    top_cell = page.split('id="top">')[1].split('class="cell"')[1]
    assert 'class="box" style="left:25.00%;top:25.00%;width:25.00%;height:25.00%"' in top_cell
    assert "maximum over its 17 tokens" in page and 'id="axes">x: the unit' in page
    zeros = (tmp_path / "site" / "units" / "tokens" / "1.html").read_text()
    highest = zeros.split('id="top">')[1].split("<h2>")[0]
    assert highest.count('class="cell"') == 3 and 'class="box"' not in highest  # the class token: no patch
    assert "at least 75% of the images have the lowest value, 0: those shown are the first" in zeros
