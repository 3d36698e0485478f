#!/usr/bin/env python3
"""Drives `oxgen serve`'s chat page in headless Chromium (Debian's chromium and
chromium-driver, given to Selenium by path so that nothing is downloaded), offline.

Usage: python webui.py SERVER_URL MODEL_ID SCREENSHOT SERVER_PID
  SERVER_URL  e.g. http://127.0.0.1:8123; the server runs with --max-batch 1 --max-queue 1
  MODEL_ID    the id the server serves
  SCREENSHOT  where to save a screenshot of the page with an answer (PNG)
  SERVER_PID  the server's process id: the last check stops it to see the page say so

With $OXGEN_API_KEY set (the server's --api-key), the page must first say it needs the key,
then work once it is entered in its settings.

Checks, in order: the page loads with no console errors; a question streams the answer the
API gives for the same greedy request; it fits a phone's width in dark mode; a reload keeps
the conversation; JSON mode's text
parses; model text holding HTML stays text; Stop ends the stream and the server's KV comes
back; a 429 shows a message; no request left 127.0.0.1; a server that went away shows a
message. Prints `ok NAME` per check; exits 1 at the first failure.
"""

import json
import os
import signal
import sys
import time
import urllib.request
from http.client import HTTPConnection
from urllib.parse import urlparse

# Selenium's driver manager stays offline: the browser and its driver are given by path.
os.environ["SE_OFFLINE"] = "true"

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

if len(sys.argv) != 5:
    sys.exit(__doc__)
SERVER = sys.argv[1].rstrip("/")
MODEL = sys.argv[2]
SCREENSHOT = sys.argv[3]
PID = int(sys.argv[4])
KEY = os.environ.get("OXGEN_API_KEY", "")
AUTH = {"Authorization": f"Bearer {KEY}"} if KEY else {}


def api(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(SERVER + path, data=data)
    request.add_header("Content-Type", "application/json")
    for k, v in AUTH.items():
        request.add_header(k, v)
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)


def wait(what, condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("OXGEN_CHROMIUM", "/usr/bin/chromium")
    for arg in [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--no-first-run",
        "--window-size=1100,800",
    ]:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    service = Service(executable_path=os.environ.get("OXGEN_CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=options, service=service)


def setting(driver, field, value):
    """Sets a settings field as a person would leave it (its change event fires)."""
    driver.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('change'));",
        field,
        value,
    )


def ask(driver, text):
    box = driver.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def generating(driver):
    return driver.execute_script("return !document.getElementById('stop').hidden")


def last_message(driver):
    """The stored conversation's last message (what the page rendered from)."""
    return driver.execute_script(
        "const chats = JSON.parse(localStorage.getItem('oxgen.chats'));"
        "const m = chats[0].messages; return m[m.length - 1];"
    )


def answered(driver, timeout=120.0):
    wait("the answer", lambda: not generating(driver) and last_message(driver).get("stats"), timeout)
    return last_message(driver)


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def main():
    driver = browser()
    requested = []
    try:
        driver.get(SERVER + "/")
        if KEY:
            error = lambda: driver.find_element(By.ID, "error").text  # noqa: E731
            wait("the page to ask for the key", lambda: "API key" in error())
            driver.get_log("browser")  # the 401 it was answered
            setting(driver, "api-key", KEY)
        wait("the model line", lambda: MODEL in driver.find_element(By.ID, "model-info").text)
        errors = console_errors(driver)
        assert not errors, errors
        print("ok loads" + (" once given the API key" if KEY else ""), flush=True)

        setting(driver, "temperature", "0")
        setting(driver, "max_tokens", "24")
        question = "Tell me a short fact about the moon."
        ask(driver, question)
        wait("streaming", lambda: generating(driver) or last_message(driver).get("stats"))
        reply = answered(driver)
        want = api(
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": question}],
                "temperature": 0,
                "top_p": 1,
                "max_tokens": 24,
            },
        )["choices"][0]["message"]["content"]
        assert reply["content"] == want, (reply["content"], want)
        shown = driver.find_elements(By.CSS_SELECTOR, ".message.assistant .content")[-1].text
        assert want.split()[0] in shown, (shown, want)
        assert reply["stats"]["tokens"] > 0 and reply["stats"]["ttft"] is not None, reply
        driver.save_screenshot(SCREENSHOT)
        print("ok streams the API's answer", flush=True)

        # At phone width and in dark mode: nothing overflows sideways, the colours turn.
        driver.execute_cdp_cmd(
            "Emulation.setEmulatedMedia",
            {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
        )
        driver.set_window_size(390, 844)
        wide = driver.execute_script(
            "return document.documentElement.scrollWidth > window.innerWidth"
        )
        assert not wide, "the page overflows a phone's width"
        background = driver.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(17, 19, 24)", background
        driver.save_screenshot(SCREENSHOT.replace(".png", "-phone-dark.png"))
        driver.set_window_size(1100, 800)
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
        print("ok phone width and dark mode", flush=True)

        driver.refresh()
        wait("the page again", lambda: MODEL in driver.find_element(By.ID, "model-info").text)
        messages = driver.find_elements(By.CSS_SELECTOR, "#messages .message")
        assert len(messages) == 2 and question in messages[0].text, [m.text for m in messages]
        print("ok reload keeps the conversation", flush=True)

        setting(driver, "json-mode", "json_schema")
        schema = {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 12}, "legs": {"type": "integer"}},
            "required": ["name", "legs"],
            "additionalProperties": False,
        }
        setting(driver, "schema", json.dumps(schema))
        setting(driver, "max_tokens", "64")
        ask(driver, "Describe a cat as JSON.")
        parsed = json.loads(answered(driver)["content"])
        assert set(parsed) == {"name", "legs"}, parsed
        print("ok JSON mode parses", flush=True)

        markup = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2"><b>bold</b>'
        setting(driver, "schema", json.dumps({"enum": [markup]}))
        ask(driver, "Say something.")
        content = answered(driver)["content"]
        assert json.loads(content) == markup, content
        shown = driver.find_elements(By.CSS_SELECTOR, ".message.assistant .content")[-1]
        assert "<script>" in shown.text, shown.text
        assert not shown.find_elements(By.CSS_SELECTOR, "script, img, b"), "markup became HTML"
        assert driver.execute_script("return window.pwned") is None
        print("ok model text stays text", flush=True)

        setting(driver, "json-mode", "")
        setting(driver, "max_tokens", "2000")
        ask(driver, "Write a long story about a dragon.")
        wait("a few tokens", lambda: generating(driver) and len(last_message(driver)["content"]) > 20)
        driver.find_element(By.ID, "stop").click()
        stopped = answered(driver, timeout=30)
        assert stopped.get("stopped") and stopped["stats"]["tokens"] < 1000, stopped
        health = lambda: api("/health")["requests"]  # noqa: E731
        wait("the KV back", lambda: health() == {"queued": 0, "running": 0, "kv_sequences": 0}, 30)
        errors = console_errors(driver)
        assert not errors, errors
        print("ok stop frees the KV", flush=True)

        # Two long requests hold the one running slot and the one queue slot: the page's is
        # refused with 429, and says so.
        busy = []
        host = urlparse(SERVER)
        for _ in range(2):
            conn = HTTPConnection(host.hostname, host.port, timeout=120)
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": 3000,
                "ignore_eos": True,
                "stream": True,
            }
            headers = {"Content-Type": "application/json", **AUTH}
            conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
            busy.append(conn)
        wait("both busy", lambda: health()["running"] == 1 and health()["queued"] == 1, 30)
        ask(driver, "Are you busy?")
        refused = answered(driver, timeout=30)
        assert "429" in refused.get("error", ""), refused
        assert "429" in driver.find_element(By.ID, "error").text
        for conn in busy:
            conn.close()
        wait("idle", lambda: health() == {"queued": 0, "running": 0, "kv_sequences": 0}, 30)
        print("ok a 429 shows a message", flush=True)

        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                requested.append(message["params"]["request"]["url"])
        outside = [u for u in requested if not u.startswith(SERVER + "/")]
        assert requested and not outside, outside
        print(f"ok {len(requested)} requests, none left {SERVER}", flush=True)

        os.kill(PID, signal.SIGTERM)
        wait("the server gone", lambda: not server_up(), 30)
        ask(driver, "Hello?")
        gone = answered(driver, timeout=30)
        assert "could not reach the server" in gone.get("error", ""), gone
        assert driver.find_element(By.ID, "error").is_displayed()
        print("ok a server that went away shows a message", flush=True)
    finally:
        driver.quit()


def server_up():
    try:
        api("/health")
        return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
