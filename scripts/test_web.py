#!/usr/bin/env python3
"""The web page of `folio serve` in Debian's headless Chromium, driven by selenium.

    python3 scripts/test_web.py http://127.0.0.1:PORT target/web

Opens the page, checks the page map and the context tree render, sends a chat
message, waits for the streamed reply and its figures (TTFT, tok/s, cached tokens),
checks that the page map changed colour (pages held), forks the context from the
tree, then looks again at a phone-width window. Screenshots go to the folder given
(desktop.png, phone.png). Exits non-zero on the first failed check.
"""

import os
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

base, shots = sys.argv[1], sys.argv[2]
t0 = time.time()


def ok(msg):
    print(f"ok {time.time() - t0:6.2f}s  {msg}", flush=True)


def wait(cond, what, timeout=60.0):
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = cond()
            if v:
                return v
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-dev-shm-usage", "--window-size=1280,900"]:
    opts.add_argument(a)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
try:
    driver.get(base + "/")
    wait(lambda: "SmolLM2" in driver.find_element(By.ID, "model").text or "·" in driver.find_element(By.ID, "model").text,
         "the model's name")
    cells = wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#pool .cell"), "the page map")
    ok(f"page loaded: {len(cells)} page cells, model {driver.find_element(By.ID, 'model').text!r}")
    held_js = "return [...document.querySelectorAll('#pool .cell')].filter(c => !c.classList.contains('free')).length"
    before = driver.execute_script(held_js)

    box = driver.find_element(By.ID, "input")
    box.send_keys("Write two sentences about lighthouses.")
    box.send_keys(Keys.ENTER)
    bubble = wait(lambda: [b for b in driver.find_elements(By.CSS_SELECTOR, ".msg.assistant") if b.text.strip()],
                  "streamed reply text")[0]
    ok(f"reply streaming: {bubble.text[:40]!r}")
    stats = wait(lambda: driver.find_element(By.CSS_SELECTOR, ".msg.assistant .stats").text, "reply figures", 120)
    assert "TTFT" in stats and "from cache" in stats, stats
    ok(f"reply done, figures: {stats!r}")

    held = wait(lambda: driver.execute_script(held_js) > before, "page map cells changing colour")
    states = driver.execute_script(
        "return [...new Set([...document.querySelectorAll('#pool .cell')].map(c => c.className))].sort()")
    info = driver.execute_script(
        "return [...document.querySelectorAll('#pool .cell')].find(c => !c.classList.contains('free')).title")
    assert "held by ctx-" in info, info
    ok(f"page map changed: {driver.execute_script(held_js)} cells not free (was {before}), {states}; {info!r}")

    def click_fork():
        # Found and clicked in one try: the tree is redrawn when a context changes,
        # and a button from an earlier drawing is stale (the try is then repeated).
        node = driver.find_elements(By.CSS_SELECTOR, "#treebody .node")[0]
        [b for b in node.find_elements(By.TAG_NAME, "button") if b.text == "fork"][0].click()
        return True

    wait(click_fork, "the context tree's fork button")
    wait(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#treebody li li .node")) >= 1, "the fork drawn as a branch")
    ok("forked from the tree: the fork hangs under its parent")
    wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#pool .cell.shared"), "shared pages marked")
    ok(f"{len(driver.find_elements(By.CSS_SELECTOR, '#pool .cell.shared'))} shared pages marked")
    driver.save_screenshot(os.path.join(shots, "desktop.png"))

    driver.set_window_size(390, 844)
    time.sleep(0.5)
    width = driver.execute_script("return document.documentElement.scrollWidth")
    assert width <= 400, f"the page is {width}px wide on a 390px phone"
    driver.save_screenshot(os.path.join(shots, "phone.png"))
    ok(f"phone width: no horizontal overflow ({width}px); screenshots in {shots}")
except Exception:
    driver.save_screenshot(os.path.join(shots, "failed.png"))
    print("totals:", driver.find_element(By.ID, "totals").text, file=sys.stderr)
    raise
finally:
    driver.quit()
print(f"all web checks passed in {time.time() - t0:.1f}s")
