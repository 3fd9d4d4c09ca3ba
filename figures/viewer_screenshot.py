"""Make figures/viewer.png: `python -m minirl view` on a run, photographed by headless Chromium with a
token hovered (the screenshot in docs/usage.md, "Viewer").

    python -m minirl quickstart --smoke --out /tmp/q && python figures/viewer_screenshot.py /tmp/q

Needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver) and selenium
(pip install -e ".[test]"); nothing is downloaded. Writes RUN/viewer.html on the way. A few seconds.
"""

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from minirl.apps.viewer import write_page  # noqa: E402


def main(run: str, out: str, width: int = 1400, height: int = 1500) -> str:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and chromedriver):
        raise SystemExit(
            "no chromium/chromedriver on PATH: apt-get install chromium chromium-driver"
        )
    page = write_page(run)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        browser.get("file://" + os.path.abspath(page))
        WebDriverWait(browser, 10).until(
            lambda b: b.execute_script("return document.body.dataset.ready === '1'")
        )
        actions = browser.find_elements(By.CSS_SELECTOR, "td.completion .tok.a")
        hovered = next((t for t in actions[5:] if t.text.strip()), actions[0])
        ActionChains(browser).move_to_element(hovered).perform()
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        browser.save_screenshot(out)
    finally:
        browser.quit()
    print("wrote", out)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", help="a GRPO run folder or the quickstart's")
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "viewer.png")
    )
    args = parser.parse_args()
    main(args.run, args.out)
