"""Amplitude destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.amplitude.capabilities import CAPABILITIES
from eventspark.destinations.amplitude.configuration import AmplitudeDestination
from eventspark.destinations.amplitude.dialect import DIALECT
from eventspark.destinations.base import DestinationType

DESTINATION = DestinationType(
    name="amplitude",
    config=AmplitudeDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.amplitude.load:build",
    probe="eventspark.destinations.http.probe:probe",
)
