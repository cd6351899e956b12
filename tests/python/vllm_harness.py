"""Shared set-up of the vLLM connector tests: the mini vLLM engine
(mini_vllm.py) with kvtier's KvtierConnector against a kvtierd child."""

import kvtier
from kvtier.integrations.vllm import KvtierConnector
from mini_vllm import MiniEngine, make_kv_cache_config, make_vllm_config, run_request  # noqa: F401
from model_fixtures import deterministic, model, prompt  # noqa: F401 (fixtures re-exported)
from tiny_model import greedy_generate  # noqa: F401

BLOCK_TOKENS = 8  # two engine blocks of 4 tokens per kvtier block


def kvtier_engine(model, daemon, num_workers=1, num_blocks=64, revision=None, connector=KvtierConnector,
                  prefix_caching=True, **extra):
    cfg = make_vllm_config(model, kv_connector="KvtierConnector", kv_connector_module_path="kvtier.integrations.vllm",
                           kv_connector_extra_config=dict(socket_path=daemon.socket_path, block_tokens=BLOCK_TOKENS,
                                                          **extra),
                           tensor_parallel_size=num_workers, enable_prefix_caching=prefix_caching, revision=revision)
    if revision == "":
        cfg.model_config.revision = None  # no revision anywhere
    return MiniEngine(model, cfg, make_kv_cache_config(model, num_blocks, num_workers), connector,
                      num_workers=num_workers)


def reference_engine(model, num_workers=1):
    """The engine's own computation: no connector, no prefix cache (a full prefill)."""
    return MiniEngine(model, make_vllm_config(model, kv_connector=None, enable_prefix_caching=False,
                                              tensor_parallel_size=num_workers),
                      make_kv_cache_config(model, 64, num_workers), num_workers=num_workers)


def first_step_of(engine, req_id):
    return next(h.scheduler_output for h in engine.history if req_id in h.scheduler_output.num_scheduled_tokens)


def computed_at_start(engine, req_id):
    so = first_step_of(engine, req_id)
    new = [r for r in so.scheduled_new_reqs if r.req_id == req_id]
    return new[0].num_computed_tokens if new else None


def rank_keys(engine, tokens):
    """kvtier keys of `tokens` in every rank's namespace, as the connector computes them."""
    c = engine.scheduler_connector
    return [h.keys(tokens) for h in c._hashers], c._namespaces


def quiet_client(daemon, namespaces):
    return kvtier.Client(daemon.socket_path, namespaces, client_name="test")


def drain_commits(engine):
    for w in engine.worker_connectors:
        w._committer.submit(lambda: None).result(10)
