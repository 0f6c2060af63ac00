#!/usr/bin/env python3
"""The README's picture of the chat page: `tiny-llm serve` on 127.0.0.1, one seeded turn typed
into the page in headless Chromium (selenium, as tests/test_serve_browser.py drives it), and a
screenshot of the window.

    python scripts/screenshot_chat.py [--out book/docs/img/chat.png] [--model default]
        [--prompt "..."] [--max-tokens 48] [--seed 7]

Needs Debian's chromium and chromium-driver (`apt-get install chromium chromium-driver`) and
the dev extra's selenium. The server and the browser are stopped when it ends.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WINDOW = (1000, 720)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, log: Path) -> subprocess.Popen:
    """`tiny-llm serve` on 127.0.0.1:`port`, once /health answers (its output goes to `log`)."""
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "tiny_llm", "serve", "--model", model, "--port", str(port)],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"screenshot_chat: the server exited ({process.returncode}); see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    raise SystemExit(f"screenshot_chat: the server did not answer within 180 s; see {log}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Screenshot tiny-llm serve's chat page after one turn.")
    parser.add_argument("--out", type=Path, default=ROOT / "book" / "docs" / "img" / "chat.png")
    parser.add_argument("--model", default="default")
    parser.add_argument("--prompt", default="Explain in two sentences why the sky is blue.")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", default="0.7")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            parser.error(f"{path} is missing: apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"tiny-llm-screenshot-{port}.log"
    server = start_server(args.model, port, log)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.getElementById('model').value"))
        for field, value in (("temperature", args.temperature), ("max-tokens", str(args.max_tokens)),
                             ("seed", str(args.seed))):
            element = driver.find_element(By.ID, field)
            element.clear()
            element.send_keys(value)
        driver.find_element(By.ID, "prompt").send_keys(args.prompt)
        driver.find_element(By.ID, "send").click()
        WebDriverWait(driver, 300, poll_frequency=0.2).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant[data-done='true']")
            or d.find_element(By.ID, "error").text)
        if error := driver.find_element(By.ID, "error").text:
            raise SystemExit(f"screenshot_chat: the page shows an error: {error}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out))
        reply = driver.find_element(By.CSS_SELECTOR, ".message.assistant").get_property("textContent")
        print(f"wrote {args.out} ({driver.find_element(By.ID, 'status').text}): {reply!r}")
    finally:
        driver.quit()
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
