"""Chooses a worker's KV transfer backend: NIXL where it imports, else Ray's object store."""

import logging
from collections.abc import Callable
from typing import Literal

import torch

from pdserve.kvtransfer import nixl_shim
from pdserve.kvtransfer.connector import KVConnector
from pdserve.kvtransfer.layout import KVLayout

logger = logging.getLogger(__name__)

Backend = Literal["auto", "nixl", "object_store"]


def make_connector(
    kv_cache: torch.Tensor,
    layout: KVLayout,
    free_blocks: Callable[[list[int]], None],
    backend: Backend = "auto",
    **kwargs,
) -> KVConnector:
    """A connector over ``kv_cache``; ``free_blocks`` returns blocks to the engine's pool."""
    if backend == "auto":
        backend = "nixl" if nixl_shim.nixl_available() else "object_store"
        if backend == "object_store":
            logger.warning(
                "NIXL is not importable (%s): KV blocks will move through Ray's object store "
                "(a copy in and a copy out on every transfer). Install nixl (nixl-cu12 on PyPI).",
                nixl_shim.IMPORT_ERROR,
            )
    if backend == "nixl":
        from pdserve.kvtransfer.nixl_connector import NixlConnector

        return NixlConnector(kv_cache, layout, free_blocks, **kwargs)
    if backend == "object_store":
        from pdserve.kvtransfer.object_store_connector import ObjectStoreConnector

        if nixl_shim.nixl_available():
            logger.warning("KV transfer over Ray's object store (the fallback), chosen explicitly")
        return ObjectStoreConnector(kv_cache, layout, free_blocks, **kwargs)
    raise ValueError(f"unknown KV transfer backend {backend!r}: use auto, nixl or object_store")
