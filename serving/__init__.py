"""What the router and the worker pools share: the config schema, wire messages, replica base."""
