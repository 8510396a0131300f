"""The chat page at GET / (minivllm/server/static/chat.html) in a real headless Chromium, against the
real server (SmolLM2-135M on the CPU).

The greedy answer the page shows must equal the same request's answer through the API, not streamed:
that proves the page sends the whole conversation and joins the streamed deltas right. Stop must
abort the request in the engine; a refused request must show the server's error message.

Skipped where Chromium or chromedriver is missing. Selenium is given the driver's path, so Selenium
Manager never downloads one. A screenshot goes to MINIVLLM_SCREENSHOT if set, or to
figures/13_chat_page.png when MINIVLLM_SMOKE=0 (never in CI, which must not overwrite the figure).
"""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest
from server_utils import running_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
MODEL = "smollm2-135m"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                       reason="needs Chromium and chromedriver on the PATH (apt-get install chromium chromium-driver)"),
]

# Lengths of the last assistant bubble's text, recorded by the page itself at every DOM change.
RECORD_LENGTHS = """
window.lengthsSeen = [];
new MutationObserver(() => {
  const bubbles = document.querySelectorAll("#messages .assistant");
  if (bubbles.length) window.lengthsSeen.push(bubbles[bubbles.length - 1].textContent.length);
}).observe(document.getElementById("messages"), {childList: true, subtree: true, characterData: true});
"""


def screenshot_path() -> Path | None:
    if os.environ.get("MINIVLLM_SCREENSHOT"):
        return Path(os.environ["MINIVLLM_SCREENSHOT"])
    if os.environ.get("MINIVLLM_SMOKE") == "0":
        return Path(__file__).resolve().parent.parent / "figures" / "13_chat_page.png"
    return None


@pytest.fixture(scope="module")
def server():
    with running_server(MODEL, "--max-model-len", "512", "--num-kv-blocks", "64") as base_url:
        yield base_url


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def page(server, browser):
    """The page freshly loaded, its model known (state idle)."""
    browser.get(server + "/")
    wait_for(browser, lambda: state(browser) == "idle", "the page never learned the model's name")
    return browser


def wait_for(driver, condition, message, timeout=60):
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda _: condition(), message)


def state(driver) -> str:
    return driver.execute_script("return document.body.dataset.state")


def text_of(driver, element_id: str) -> str:
    return driver.execute_script("return document.getElementById(arguments[0]).textContent", element_id)


def assistant_texts(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#messages .assistant')].map(b => b.textContent)")


def set_input(driver, element_id: str, value) -> None:
    box = driver.find_element("id", element_id)
    box.clear()
    box.send_keys(str(value))
    assert driver.execute_script("return document.getElementById(arguments[0]).value", element_id) == str(value)


def ask(driver, question: str, press_enter: bool = False) -> None:
    from selenium.webdriver.common.keys import Keys
    driver.find_element("id", "prompt").send_keys(question)
    if press_enter:
        driver.find_element("id", "prompt").send_keys(Keys.ENTER)
    else:
        driver.find_element("id", "send").click()
    # The state turned "streaming" inside the click's handler, before it awaited anything: waiting
    # for "idle" from here on waits for the answer's end.


def api_answer(base_url: str, messages: list[dict], max_tokens: int) -> str:
    r = httpx.post(base_url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def metric(base_url: str, name: str) -> float:
    text = httpx.get(base_url + "/metrics").text
    return float(re.search(rf"^minivllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))


def test_streamed_answers_equal_the_api_and_the_panel_shows_the_engine(page, server):
    assert text_of(page, "model").startswith(MODEL)
    set_input(page, "temperature", 0)
    set_input(page, "max-tokens", 24)
    page.execute_script(RECORD_LENGTHS)

    question = "What is the capital of France?"
    ask(page, question)
    wait_for(page, lambda: state(page) == "idle", "the answer never finished")
    [answer] = assistant_texts(page)
    assert answer and answer == api_answer(server, [{"role": "user", "content": question}], 24)
    lengths = {n for n in page.execute_script("return window.lengthsSeen") if n}
    assert len(lengths) > 1, f"the answer appeared at once, not streamed: lengths seen {lengths}"

    # The second question goes with the whole conversation; a longer answer for the screenshot.
    follow_up = "Tell me three facts about that city."
    set_input(page, "max-tokens", 60)
    ask(page, follow_up, press_enter=True)
    shot = screenshot_path()
    if shot is not None:  # mid-answer (well into its 3rd line), while the engine panel is busy
        def third_line_begun():
            lines = assistant_texts(page)[-1].split("\n")
            return state(page) == "idle" or (len(lines) >= 3 and len(lines[-1]) >= 20)
        wait_for(page, third_line_begun, "the answer never reached a 3rd line")
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.save_screenshot(str(shot))
    wait_for(page, lambda: state(page) == "idle", "the second answer never finished")
    conversation = [{"role": "user", "content": question}, {"role": "assistant", "content": answer},
                    {"role": "user", "content": follow_up}]
    assert assistant_texts(page)[-1] == api_answer(server, conversation, 60)

    assert re.fullmatch(r"\d+", text_of(page, "running")), text_of(page, "running")
    assert re.fullmatch(r"\d+", text_of(page, "waiting")), text_of(page, "waiting")
    assert re.fullmatch(r"\d+\.\d %", text_of(page, "kv-usage")), text_of(page, "kv-usage")
    assert re.fullmatch(r"-?\d+\.\d", text_of(page, "tok-s")), text_of(page, "tok-s")
    assert re.fullmatch(r"\d+ ms", text_of(page, "ttft")), text_of(page, "ttft")
    assert float(text_of(page, "answer-tok-s")) > 0
    assert int(text_of(page, "answer-tokens")) >= 2


def test_stop_aborts_the_request_in_the_engine(page, server):
    set_input(page, "temperature", 0)
    set_input(page, "max-tokens", 400)
    ask(page, "Write a long story about a dragon who learns to fly.")
    wait_for(page, lambda: len(assistant_texts(page)[-1]) >= 20, "no text streamed")
    assert state(page) == "streaming"
    page.find_element("id", "stop").click()
    wait_for(page, lambda: state(page) == "idle", "Stop did not end the answer", timeout=5)
    assert "stopped" in page.find_element("css selector", "#messages .assistant").get_attribute("class")

    deadline = time.monotonic() + 5  # 400 tokens would take the CPU far longer than this
    while metric(server, "num_requests_running") != 0:
        assert time.monotonic() < deadline, "the server kept generating after Stop"
        time.sleep(0.1)
    wait_for(page, lambda: text_of(page, "running") == "0", "the panel never showed the engine idle", timeout=5)


def test_a_refused_request_shows_the_servers_error(page):
    set_input(page, "max-tokens", 0)
    ask(page, "Hello?")
    wait_for(page, lambda: state(page) == "idle", "the request never ended")
    error = page.find_element("css selector", "#messages .error").get_attribute("textContent")
    assert error.startswith("400: ") and "max_tokens" in error, error
