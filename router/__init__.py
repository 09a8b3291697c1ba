"""The Serve ingress (``ingress.py``) and its two rooms: ``api/`` faces clients (OpenAI HTTP,
gRPC, errors, keys, admission), ``dispatch/`` places their engine requests on the worker pools
(placement, KV routing, disaggregation, migration). The rooms do not import each other; both
record the router's measurements (``metrics.py``, ``timing.py``)."""
