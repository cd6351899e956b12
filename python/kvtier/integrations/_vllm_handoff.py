"""Prefill/decode hand-off through kvtier, carried in vLLM's
``kv_transfer_params`` the way vLLM's P/D connectors carry theirs.

Read against vllm-project/vllm at commit 002a1057e9ae
(vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py:
NixlConnectorScheduler.get_num_new_matched_tokens, update_state_after_alloc,
request_finished) and tests/v1/kv_connector/nixl_integration/toy_proxy_server.py
at e009930196c9: the proxy sends the prompt to the prefill engine P with
``max_tokens: 1`` and ``kv_transfer_params: {"do_remote_decode": true,
"do_remote_prefill": false, ...}``; P's ``request_finished`` answers
``(delay_free, params)``, vLLM returns ``params`` in P's response, and the
proxy sends the same prompt to the decode engine D with those params as its
``kv_transfer_params``. D's ``get_num_new_matched_tokens`` answers
``(tokens, load_async)``; with load_async the request waits
(WAITING_FOR_REMOTE_KVS) until every worker reports it in
``get_finished``'s finished_recving, and P's delayed blocks are freed once
every worker reports the request in finished_sending.

kvtier moves no bytes between engines itself: P saves the prompt's blocks
into its kvtierd as any request does, and D's kvtierd, which lists P's in
``[peer] members``, finds them by an ordinary lookup of the same keys and
pulls them from P's host memory (tier REMOTE). The params only tell D that
a hand-off is due, how many blocks P saved (so D waits, briefly, for a
commit or a peer answer still in flight instead of recomputing) and enough
to check that both engines key the prompt alike.

P's params (all JSON):

    do_remote_prefill  True            vLLM's P/D flag for D
    do_remote_decode   False
    remote_engine_id   P's kv_transfer_config.engine_id
    remote_request_id  P's request id
    kvtier_version     HANDOFF_VERSION
    kvtier_peer        P's peer address (extra config ``peer``), or None
    kvtier_namespace   hex fingerprint of the namespace of rank 0 (group 0)
    kvtier_block_tokens  tokens per kvtier block
    kvtier_blocks      kvtier blocks of the prompt P saved (from block 0)
    kvtier_last_key    hex key of the last of them (rank 0, group 0)
"""

import logging

logger = logging.getLogger("kvtier.vllm")

HANDOFF_VERSION = 1
_FIELDS = ("kvtier_version", "kvtier_namespace", "kvtier_block_tokens", "kvtier_blocks", "kvtier_last_key")


def _params(request):
    params = getattr(request, "kv_transfer_params", None)
    return params if isinstance(params, dict) else None


def wants_remote_decode(request):
    """P's side: the proxy asked this request's KV to be handed to a decode
    engine (do_remote_decode)."""
    params = _params(request)
    return bool(params and params.get("do_remote_decode"))


class Handoff:
    """D's side: what P announced for one request."""

    def __init__(self, params):
        self.namespace = str(params["kvtier_namespace"])
        self.block_tokens = int(params["kvtier_block_tokens"])
        self.blocks = int(params["kvtier_blocks"])
        self.last_key = str(params["kvtier_last_key"]) if params.get("kvtier_last_key") else None
        self.peer = params.get("kvtier_peer")
        self.engine_id = params.get("remote_engine_id")
        self.request_id = params.get("remote_request_id")
        self.since = None       # time.monotonic() of the first lookup
        self.checked = False    # namespace and keys compared with D's own


def handoff_of(request):
    """The Handoff a decode request carries (P's params with do_remote_prefill
    and kvtier's fields), None for any other request. Params of another
    version or malformed ones are refused with a warning: the request is
    served as any other (an ordinary lookup, else a recompute)."""
    params = _params(request)
    if not params or not params.get("do_remote_prefill") or "kvtier_version" not in params:
        return None
    try:
        if int(params["kvtier_version"]) != HANDOFF_VERSION or any(f not in params for f in _FIELDS):
            raise ValueError(f"version {params.get('kvtier_version')!r} or fields missing")
        handoff = Handoff(params)
        if handoff.blocks < 0 or handoff.block_tokens <= 0:
            raise ValueError("negative block count or block size")
        return handoff
    except (TypeError, ValueError, KeyError) as e:
        logger.warning("kvtier: request %s carries kv_transfer_params kvtier cannot read (%s); served as any other",
                       getattr(request, "request_id", "?"), e)
        return None


def producer_params(request, engine_id, peer, namespace_hex, block_tokens, blocks, last_key_hex):
    """P's answer in request_finished (see the module's docstring)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine_id,
        "remote_request_id": request.request_id,
        "kvtier_version": HANDOFF_VERSION,
        "kvtier_peer": peer,
        "kvtier_namespace": namespace_hex,
        "kvtier_block_tokens": int(block_tokens),
        "kvtier_blocks": int(blocks),
        "kvtier_last_key": last_key_hex,
    }


def finished_normally(request):
    """Whether a finished request ran to its end (stopped or length-capped)
    rather than being aborted or failing: only then is a hand-off offered."""
    status = getattr(request, "status", None)
    name = getattr(status, "name", str(status))
    return name in ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")
