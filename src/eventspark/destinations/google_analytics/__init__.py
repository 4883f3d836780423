"""Google Analytics destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.google_analytics.capabilities import CAPABILITIES
from eventspark.destinations.google_analytics.configuration import GoogleAnalyticsDestination
from eventspark.destinations.google_analytics.dialect import DIALECT

DESTINATION = DestinationType(
    name="google_analytics",
    config=GoogleAnalyticsDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.google_analytics.load:build",
    probe="eventspark.destinations.http.probe:probe",
)
