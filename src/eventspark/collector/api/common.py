"""What the handler modules share: the handler type and the common answers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from eventspark.collector.auth import check_admin, request_token
from eventspark.collector.core import Collector
from eventspark.collector.http import JSON_TYPE, HTTPError, Request, Response

Handler = Callable[[Collector, Request], Awaitable[Response]]
Routes = dict[str, dict[str, Handler]]

OK = b'{"status":"ok"}'
OK_RESPONSE = Response(200, OK, [JSON_TYPE])


def not_implemented(feature: str, admin: bool) -> Handler:
    """Endpoints of the EventNative API whose feature eventspark does not provide yet."""

    async def handler(app: Collector, request: Request) -> Response:
        if admin:
            check_admin(request, app.admin_token)
        else:
            app.tokens.require_server(request_token(request))
        raise HTTPError(501, f"{feature} is not implemented in this version of eventspark", request.path)

    return handler
