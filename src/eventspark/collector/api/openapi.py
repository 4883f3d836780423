"""The OpenAPI document of the whole HTTP API: `GET /api/v1/openapi.json`.

Public (no token): it describes the API and holds no secret or configuration. The document is
data (`openapi_document.py`), serialised once per process on first request.
"""

from __future__ import annotations

from functools import cache

import orjson

from eventspark.collector.api.common import Routes
from eventspark.collector.api.openapi_document import build_document
from eventspark.collector.core import Collector
from eventspark.collector.http import JSON_TYPE, Request, Response

_HEADERS = [JSON_TYPE, (b"cache-control", b"no-cache")]


@cache
def document_bytes() -> bytes:
    return orjson.dumps(build_document())


async def openapi_json(app: Collector, request: Request) -> Response:
    return Response(200, document_bytes(), _HEADERS)


ROUTES: Routes = {
    "/api/v1/openapi.json": {"GET": openapi_json},
}
