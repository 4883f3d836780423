"""Webhook destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.webhook.capabilities import CAPABILITIES
from eventspark.destinations.webhook.configuration import WebhookDestination
from eventspark.destinations.webhook.dialect import DIALECT

DESTINATION = DestinationType(
    name="webhook",
    config=WebhookDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.webhook.load:build",
    probe="eventspark.destinations.http.probe:probe",
)
