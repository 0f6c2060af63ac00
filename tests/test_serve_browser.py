"""`tiny-llm serve`'s chat page in a real headless browser: Debian's chromium and
chromedriver driven by selenium, against a live server running the default model.

One turn through the page must stream the same reply that the same request (its
messages, model, sampling settings and seed) gets from the API directly, report its speed,
and leave nothing severe in the browser's console."""

import base64
import json
import re
from pathlib import Path

import pytest

from serve_support import running_server

pytestmark = pytest.mark.xdist_group("serve-browser")

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1000,800")

PROMPT = "Name three colors."
# Page field id -> (typed value, request field, value in the request). Top-p, min-p and the
# repetition penalty stay empty, so the page leaves them out.
SETTINGS = {
    "temperature": ("0.8", "temperature", 0.8),
    "top-k": ("40", "top_k", 40),
    "max-tokens": ("8", "max_tokens", 8),
    "seed": ("1234", "seed", 1234),
}
REPLY_TIMEOUT = 120  # seconds; the default model prefills ~8 tokens/s and decodes ~6 tokens/s on a CPU


@pytest.fixture
def browser(tmp_path):
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            pytest.skip(f"{path} is missing: .ci/run installs Debian's browser "
                        "(apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs selenium")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    # The console (for errors) and the network log (for the request the page sends).
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _posted_bodies(driver, url: str) -> list[dict]:
    """The JSON bodies the page POSTed to `url`, from chromium's network log."""
    bodies = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") != "Network.requestWillBeSent":
            continue
        request = message["params"]["request"]
        if request.get("method") != "POST" or request.get("url") != url:
            continue
        data = request.get("postData")
        if data is None:
            data = b"".join(base64.b64decode(part.get("bytes", ""))
                            for part in request.get("postDataEntries", [])).decode()
        bodies.append(json.loads(data))
    return bodies


def test_chat_page_streams_the_apis_reply(browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with running_server() as server:
        browser.get(server.url + "/")
        # The model list arrives from /v1/models; the first model is picked.
        model = WebDriverWait(browser, 30).until(
            lambda d: d.execute_script("return document.getElementById('model').value"))
        assert browser.find_element(By.ID, "system").get_property("value") == ""  # no system prompt

        for field, (typed, _, _) in SETTINGS.items():
            element = browser.find_element(By.ID, field)
            element.clear()
            element.send_keys(typed)
        browser.find_element(By.ID, "prompt").send_keys(PROMPT)
        browser.find_element(By.ID, "send").click()

        done = ".message.assistant[data-done='true']"
        WebDriverWait(browser, REPLY_TIMEOUT, poll_frequency=0.2).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, done) or d.find_element(By.ID, "error").text)
        error = browser.find_element(By.ID, "error").text
        assert error == "", f"the page shows an error: {error}"
        reply = browser.find_element(By.CSS_SELECTOR, done)
        text = reply.get_property("textContent")
        assert text.strip(), "the assistant's reply is empty"
        user = browser.find_elements(By.CSS_SELECTOR, "#messages .message.user")
        assert [u.get_property("textContent") for u in user] == [PROMPT]
        status = browser.find_element(By.ID, "status").text
        assert "tok/s" in status, status

        # The page sent the conversation and the settings typed, streamed with usage.
        expected = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
                    **{name: value for _, name, value in SETTINGS.values()}}
        sent = _posted_bodies(browser, server.url + "/v1/chat/completions")
        assert sent == [{**expected, "stream": True, "stream_options": {"include_usage": True}}]

        # The same request without streaming: the same reply, token for token.
        response = server.post("/v1/chat/completions", expected)
        assert response.status_code == 200, response.text
        answer = response.json()
        choice = answer["choices"][0]
        assert text == choice["message"]["content"], (text, answer)
        assert reply.get_attribute("data-finish") == choice["finish_reason"]
        # The status line counts the usage's tokens and reports a speed.
        assert f"{answer['usage']['completion_tokens']} tokens" in status, (status, answer["usage"])
        assert re.search(r"\d+(\.\d+)? tok/s", status), status

        severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        assert severe == [], severe
