"""kvtier: a hierarchical KV-cache service for LLM inference, from Python.

The extension ``kvtier._kvtier`` binds libkvtier_client (include/kvtier/client.h)::

    import kvtier
    ns = kvtier.Namespace(model_id="org/model", model_revision="abc123", kv_dtype="bf16",
                          block_tokens=16, layer_count=32, bytes_per_token_per_layer=4096)
    keys = kvtier.ChainHasher(ns).keys(token_ids)
    with kvtier.Client("/run/kvtier/kvtierd.sock", [ns]) as client:
        hit = client.lookup(0, keys)
        for view in client.pin(0, keys[:hit.prefix_blocks]):
            with view:
                arr = numpy.frombuffer(view.data, dtype=numpy.uint8)   # no copy

Errors are exceptions: ``kvtier.Error`` and one subclass per status code
(``NotFoundError``, ``NoSpaceError``, ...), each with ``.code`` (the stable
status name) and ``.message``. Batch calls return one ``kvtier.Status`` per
item instead. Every call that waits for the daemon releases the GIL.
See docs/INTEGRATIONS.md.
"""

# The package version, the same as the CMake project version (the build
# backend checks that).
__version__ = "0.1.0"

from kvtier._kvtier import *  # noqa: F401,F403
from kvtier._kvtier import (  # noqa: F401  (names the star import leaves out)
    Error, Status, Key, Namespace, ChainHasher, Tier, Client, BlockView, Reservation,
    LayerSave, LayerLoad, LookupResult, PendingLookup, PreloadPlan, ReadyEstimate, ReadyTierShare,
)

__all__ = [name for name in dir() if not name.startswith("_")]
