"""Facebook Conversions API destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.facebook.capabilities import CAPABILITIES
from eventspark.destinations.facebook.configuration import FacebookDestination
from eventspark.destinations.facebook.dialect import DIALECT

DESTINATION = DestinationType(
    name="facebook",
    config=FacebookDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.facebook.load:build",
    probe="eventspark.destinations.http.probe:probe",
)
