"""`eventspark tracking-script fetch`: installs the web build of `@jitsu/sdk-js` that `serve` offers
at `/s/lib.js` (`eventspark.sdk`; `make run` does it through `scripts/bootstrap.sh`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from eventspark.commands.common import err, out
from eventspark.sdk import SDK_INTEGRITY, SDK_PACKAGE, SDK_TARBALL, SDK_VERSION, FetchError, fetch_sdk, sdk_root

tracking_script = typer.Typer(help="The tracking script served at /s/lib.js and /t/inline.js.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `eventspark` command."""
    app.add_typer(tracking_script, name="tracking-script")


@tracking_script.command()
def fetch(
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Where to unpack it (default: $EVENTSPARK_SDK_DIR or <venv>/share/eventspark/sdk)."),
    ] = None,
    url: Annotated[
        str, typer.Option("--url", help="The tarball's URL, e.g. on a registry mirror; its checksum must still match.")
    ] = SDK_TARBALL,
    timeout: Annotated[float, typer.Option("--timeout", min=1, max=600, help="Seconds for the download.")] = 30,
) -> None:
    """Downloads the pinned @jitsu/sdk-js from the npm registry, verifies its sha512 against the value
    pinned in eventspark and unpacks its web build (lib.js). Exits 1 when that fails."""
    root = directory or sdk_root()
    try:
        target = fetch_sdk(root, url, SDK_INTEGRITY, timeout)
    except FetchError as exc:
        err.print(f"[bold red]cannot fetch {SDK_PACKAGE} {SDK_VERSION}[/]: {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=1) from None
    out.print(escape(f"{SDK_PACKAGE} {SDK_VERSION}: {target}"), highlight=False)
    if directory is not None:
        out.print(escape(f"serve finds it there with EVENTSPARK_SDK_DIR={root}"), highlight=False)
