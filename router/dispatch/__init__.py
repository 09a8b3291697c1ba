"""Placing engine requests on the worker pools: the Serve ``EngineClient``, replica placement and
the pools' request router, conditional disaggregation, the first token, migration."""
