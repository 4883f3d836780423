"""Reading the live events page in a browser: rows, details, messages; waits poll with a deadline."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

T = TypeVar("T")


def wait_for(driver: webdriver.Chrome, found: Callable[[], T], timeout: float = 10, what: str = "") -> T:
    """The first truthy value of `found()`, polled every 50 ms; TimeoutException after `timeout` s."""
    return WebDriverWait(
        driver, timeout, poll_frequency=0.05, ignored_exceptions=[StaleElementReferenceException]
    ).until(lambda _: found(), what)


def event_row(driver: webdriver.Chrome, event_id: str, destination: str) -> WebElement | None:
    """The row of one event at one destination, if the page shows it (ids compared as text)."""
    for row in driver.find_elements(By.CSS_SELECTOR, "#event-rows tr.event"):
        if row.get_attribute("data-event-id") == event_id and row.get_attribute("data-destination") == destination:
            return row
    return None


def cells(row: WebElement) -> dict[str, str]:
    """The row's text by column class: time, token, destination, status, summary."""
    names = ("time", "token", "destination", "status", "summary")
    return {name: row.find_element(By.CSS_SELECTOR, f"td.{name}").text for name in names}


def expand(driver: webdriver.Chrome, event_id: str, destination: str) -> WebElement:
    """Opens an event's details and returns them (the row after the event's row)."""
    row = wait_for(driver, lambda: event_row(driver, event_id, destination), what=f"row of {event_id}")
    row.click()
    return wait_for(driver, lambda: _detail_of(driver, event_id, destination), what=f"details of {event_id}")


def _detail_of(driver: webdriver.Chrome, event_id: str, destination: str) -> WebElement | None:
    row = event_row(driver, event_id, destination)
    if row is None:
        return None
    following = row.find_elements(By.XPATH, "following-sibling::tr[1][contains(@class, 'detail')]")
    return following[0] if following else None


def stored_fields(detail: WebElement) -> dict[str, tuple[str, str]]:
    """The detail's stored record: field → (type, value)."""
    result = {}
    for line in detail.find_elements(By.CSS_SELECTOR, "section.stored table.fields tbody tr"):
        field, type_, value = (line.find_element(By.CSS_SELECTOR, f"td.{c}").text for c in ("field", "type", "value"))
        result[field] = (type_, value)
    return result


def message(driver: webdriver.Chrome) -> str:
    """The error box's text ('' while it is hidden)."""
    box = driver.find_element(By.ID, "message")
    return box.text if box.is_displayed() else ""


def injected_elements(driver: webdriver.Chrome) -> int:
    """Elements the page never creates itself: any of them means event data became markup."""
    count = driver.execute_script(
        "return document.querySelectorAll('img, iframe, object, embed, svg, math, script:not([src])').length"
        " + (window.__xss === undefined ? 0 : 1000);"
    )
    return int(count)
