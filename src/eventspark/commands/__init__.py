"""The operator commands of the `eventspark` CLI, one module per area, each with `register(app)`."""
