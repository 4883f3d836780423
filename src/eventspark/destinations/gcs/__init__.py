"""Google Cloud Storage files destination: its entry in the registry."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.gcs.capabilities import CAPABILITIES
from eventspark.destinations.gcs.configuration import GcsDestination
from eventspark.destinations.gcs.dialect import DIALECT

DESTINATION = DestinationType(
    name="gcs",
    config=GcsDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.gcs.load:build",
    probe="eventspark.destinations.files.probe:probe",
    extra="gcs",
    driver="google.cloud.storage",
)
