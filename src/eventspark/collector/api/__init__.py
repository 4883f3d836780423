"""The HTTP API's handlers, one module per area; `eventspark.collector.routes` joins their tables.

Every module exports `ROUTES: dict[path, dict[method, Handler]]`. Handlers take the process's
`Collector` (`eventspark.collector.core`) and a `Request`; nothing here imports the ASGI app.
With `server.workers > 1` each worker process has its own `Collector`, while the node's
background services (batch uploader, stream workers) run in the parent process: a handler that
needs them goes through files under `log.path` or the coordination store, never an object.
"""
