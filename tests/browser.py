"""A real headless Chromium (Debian's `chromium`, installed by scripts/setup_chromium.sh), driven over the
DevTools protocol: open a page, wait until a JavaScript condition holds, read values, take a screenshot.

The MLflow UI renders its charts after fetching data, so a one-shot `chromium --screenshot` may catch an
empty page; waiting on a condition in the page is what a person's eyes do. The protocol is spoken with
aiohttp's websocket client (a dependency of Ray's dashboard), so no browser-automation package is needed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium")
SKIP_FILE = Path("/tmp/bertdist-chromium-unavailable")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
    "--remote-debugging-port=0",
]


def unavailable_reason() -> str | None:
    if CHROMIUM:
        return None
    return (
        SKIP_FILE.read_text().strip()
        if SKIP_FILE.is_file()
        else "chromium is not installed (scripts/setup_chromium.sh)"
    )


def render(url: str, ready_js: str, read_js: str, screenshot: Path | None = None, timeout_s: float = 120.0) -> Any:
    """Open `url`, wait until `ready_js` is true, return the value of `read_js` (and save a PNG if asked)."""
    with tempfile.TemporaryDirectory(prefix="bertdist-chromium-", ignore_cleanup_errors=True) as profile:
        browser = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            endpoint = _devtools_endpoint(browser, time.monotonic() + 60)
            return asyncio.run(_drive(endpoint, url, ready_js, read_js, screenshot, timeout_s))
        finally:
            os.killpg(browser.pid, signal.SIGKILL)  # the browser and its renderer processes
            browser.wait()


def _devtools_endpoint(browser: subprocess.Popen, deadline: float) -> str:
    while time.monotonic() < deadline:
        line = browser.stderr.readline()
        if not line and browser.poll() is not None:
            raise RuntimeError(f"chromium exited with {browser.returncode} before opening DevTools")
        match = re.search(r"DevTools listening on (ws://\S+)", line)
        if match:
            return match.group(1)
    raise TimeoutError("chromium did not open DevTools within 60 s")


async def _drive(
    endpoint: str, url: str, ready_js: str, read_js: str, screenshot: Path | None, timeout_s: float
) -> Any:
    import aiohttp

    http = endpoint.split("/devtools/")[0].replace("ws://", "http://")
    async with aiohttp.ClientSession() as session:
        async with session.put(f"{http}/json/new?about:blank") as response:
            page = json.loads(await response.text())["webSocketDebuggerUrl"]
        async with session.ws_connect(page, max_msg_size=0) as ws:
            ids = iter(range(1, 1 << 30))

            async def call(method: str, **params: Any) -> dict:
                message_id = next(ids)
                await ws.send_str(json.dumps({"id": message_id, "method": method, "params": params}))
                async for message in ws:
                    data = json.loads(message.data)
                    if data.get("id") == message_id:
                        if "error" in data:
                            raise RuntimeError(f"{method}: {data['error']}")
                        return data["result"]
                raise RuntimeError("DevTools connection closed")

            async def evaluate(expression: str) -> Any:
                result = await call("Runtime.evaluate", expression=expression, returnByValue=True)
                return result["result"].get("value")

            await call("Page.enable")
            await call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout_s
            while not await evaluate(ready_js):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url}: {ready_js} not true within {timeout_s:.0f} s")
                await asyncio.sleep(0.5)
            await asyncio.sleep(1.0)  # let the last chart finish drawing
            value = await evaluate(read_js)
            if screenshot is not None:
                shot = await call("Page.captureScreenshot", format="png")
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            return value
