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
    assert not (site / "site" / "thumbs" / f"{gone}.jpg").exists()
    unit = next(unit for unit in range(64) if gone in ranked["layer1"].rows[unit])
    missing = (site / "site" / "units" / "layer1" / f"{unit}.html").read_text()
    assert f'data-row="{gone}"><div class="pic missing">missing</div>' in missing
    again = run_featdump("atlas", site / "out.h5", "-k", "4", "-o", site / "site")
    assert again.returncode == 0 and "Wrote 0 files" in again.stderr, again.stderr


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Chromium and chromedriver (Debian: apt-get install "
                                                      "chromium chromium-driver; .ci/run installs them)")
def test_the_index_finds_a_unit_its_page_shows_its_top_images_and_a_key_moves_on_in_a_real_browser(site, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        browser.get((site / "site" / "index.html").as_uri())
        assert "576 units" in browser.find_element(By.ID, "page").text  # 64 + 512, paged by 100
        assert len(browser.find_elements(By.CSS_SELECTOR, "#units li")) == 100
        browser.find_element(By.ID, "search").send_keys("layer1 12")
        links = browser.find_elements(By.CSS_SELECTOR, "#units a")
        assert [link.text for link in links] == ["layer1 / unit 12"]
        links[0].click()
        assert browser.title == "layer1 unit 12"
        ranked = featdump.top(site / "out.h5", k=4)["layer1"]
        cells = browser.find_elements(By.CSS_SELECTOR, "#top .cell")
        assert [int(cell.get_attribute("data-row")) for cell in cells] == ranked.rows[12].tolist()
        values = [float(cell.find_element(By.CLASS_NAME, "value").text) for cell in cells]
        assert values == sorted(values, reverse=True)
        np.testing.assert_allclose(values, ranked.values[12], rtol=1e-3)
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
