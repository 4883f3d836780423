"""The HTTP family: destinations without tables that send events to an HTTP service (webhook,
Google Analytics, Amplitude, Facebook Conversions API), in stream mode.

In the spirit of Vector's HTTP sinks, what every service shares lives here and each service is a
short composition (`Service`: how events become requests), in its own package:

- `config.HttpBlock`: the keys every service's block has (`endpoint`, timeouts, concurrency,
  retries), secrets as `SecretStr`;
- `service.Service` and `service.HttpRequest`: a service turns each event into its own payload
  (or refuses it with a reason) and groups payloads into requests as its protocol allows
  (`batch_size`);
- `sender.Sender`: one request on the wire (standard library, a deadline per attempt), retried
  with exponential back-off on 429, 5xx and connection errors, respecting `Retry-After`;
- `sink.HttpSink`: the adapter the stream worker drives (`EventSender`): events in, requests out on
  a bounded pool of threads, one outcome per event (delivered, refused with the response's reason,
  or not decided yet: the worker keeps it queued and retries it). A service may read a refusal
  (`Service.refusal`: the bad events it names, or a refusal of the request itself); else a
  batched request refused with 400, 413 or 422 is split in halves down to single events, so one
  bad event never fails the others; other refusals (401, 403, 404...) fail every event of the
  request at once. A bug for one event (an exception other than `Refused`) fails that event.

Secrets (API keys, tokens, the webhook's whole URL query and headers) never reach a log line or
a failed record: every text that leaves the family goes through `Redactor`.
"""

from eventspark.destinations.http.capabilities import http_capabilities
from eventspark.destinations.http.config import HttpBlock
from eventspark.destinations.http.dialect import http_dialect
from eventspark.destinations.http.service import HttpRequest, Service

__all__ = ["HttpBlock", "HttpRequest", "Service", "http_capabilities", "http_dialect"]
