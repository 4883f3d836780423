"""What every SQL warehouse shares: `SqlWarehouse` (the adapter contract built on a package's
client and capabilities), the statements of a commit and of a stream insert, the load-marker
table, and stage naming and clean-up. Branches on capabilities, never on a destination's name."""
