"""Moving KV blocks between workers: NIXL (UCX) with leases, or Ray's object store as a fallback.

Import from the modules: the router reads ``handles`` and must not pull in the connectors (torch).
"""
