"""Headless Chromium (Debian's package, scripts/chromium.sh) driven by Selenium through /usr/bin/chromedriver."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "chromium.sh"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
]


def install_chromium() -> None:
    """Installs Debian's chromium and chromium-driver when missing; fails with the script's message."""
    done = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{INSTALL_SCRIPT} failed:\n{done.stderr}")


def start_chromium(profile: Path) -> webdriver.Chrome:
    """A fresh headless browser with its own profile directory.

    The driver's path is given, so Selenium Manager never looks for (or downloads) one.
    """
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(profile.parent / "chromedriver.log"))
    return webdriver.Chrome(options=options, service=service)


# Fixtures of every browser test (tests/ui, tests/static): a plugin of tests/conftest.py.


@pytest.fixture(scope="session")
def chromium_installed() -> None:
    install_chromium()


@pytest.fixture
def browser(chromium_installed: None, tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """A fresh headless Chromium (own profile: no sessionStorage from another test)."""
    driver = start_chromium(tmp_path / "chromium-profile")
    try:
        yield driver
    finally:
        driver.quit()
