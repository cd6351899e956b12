"""Shared set-up of the vLLM connector tests: the mini vLLM engine
(mini_vllm.py) with kvtier's KvtierConnector against a kvtierd child."""

import contextlib
import importlib
from dataclasses import dataclass

import kvtier
from kvtier.integrations.vllm import KvtierConnector
from mini_vllm import (MiniEngine, make_kv_cache_config, make_vllm_config, pp_stage_layer_names,  # noqa: F401
                       run_request)
from model_fixtures import deterministic, model, prompt  # noqa: F401 (fixtures re-exported)
from tiny_model import greedy_generate  # noqa: F401

BLOCK_TOKENS = 8  # two engine blocks of 4 tokens per kvtier block


def kvtier_engine(model, daemon, num_workers=1, num_blocks=64, revision=None, connector=KvtierConnector,
                  prefix_caching=True, policy="recompute", layout=None, kernel_block_size=None, kv_cache_format="views",
                  socket_path=None, hma=False, max_num_batched_tokens=2048, async_scheduling=False,
                  worker_runs_ahead=False, pipeline_parallel_size=1, kv_role="kv_both", **extra):
    """An engine with the kvtier connector, configured as docs/INTEGRATIONS.md's command line does
    (kv_load_failure_policy "recompute"); layout / kernel_block_size / kv_cache_format choose the KV
    tensors the workers get (current vLLM's views by default); hma turns vLLM's hybrid KV cache
    manager on (one KV cache group per layer type; the connector must then be SupportsHMA);
    async_scheduling is vLLM's --async-scheduling (worker_runs_ahead: see MiniEngine);
    pipeline_parallel_size splits the layers into stages (one KVCacheConfig per stage, views only);
    kv_role is vLLM's (kv_producer on a prefill engine, kv_consumer on a decode engine, kv_both)."""
    cfg = make_vllm_config(model, kv_connector="KvtierConnector", kv_connector_module_path="kvtier.integrations.vllm",
                           kv_role=kv_role,
                           kv_connector_extra_config=dict(socket_path=socket_path or daemon.socket_path,
                                                          block_tokens=BLOCK_TOKENS, **extra),
                           tensor_parallel_size=num_workers, enable_prefix_caching=prefix_caching, revision=revision,
                           kv_load_failure_policy=policy, kv_cache_layout=layout, kernel_block_size=kernel_block_size,
                           kv_cache_format=kv_cache_format, max_num_batched_tokens=max_num_batched_tokens,
                           async_scheduling=async_scheduling, pipeline_parallel_size=pipeline_parallel_size)
    if revision == "":
        cfg.model_config.revision = None  # no revision anywhere
    cfg.scheduler_config.disable_hybrid_kv_cache_manager = not hma  # hma: vLLM's default, needs SupportsHMA
    kv_config = make_kv_cache_config(model, num_blocks, num_workers, disable_hybrid_kv_cache_manager=not hma,
                                     **({"layout": layout} if layout else {}))
    if kv_cache_format != "views":  # older vLLM: KVCacheTensor(size, shared_by), no layer strides
        kv_config.kv_cache_tensors = [LegacyKVCacheTensor(t.size // len(t.layers), [n])
                                      for t in kv_config.kv_cache_tensors for n in t.layers]
    if pipeline_parallel_size > 1:  # each stage's workers: a config of their layers only
        assert kv_cache_format == "views", "pipeline parallelism with the views cache form only"
        kv_config = [make_kv_cache_config(model, num_blocks, num_workers, disable_hybrid_kv_cache_manager=not hma,
                                          layer_names=names, **({"layout": layout} if layout else {}))
                     for names in pp_stage_layer_names(model, pipeline_parallel_size)]
    return MiniEngine(model, cfg, kv_config, connector, num_workers=num_workers, worker_runs_ahead=worker_runs_ahead)


@dataclass
class LegacyKVCacheTensor:
    """vLLM's KVCacheTensor before #51718 (vllm/v1/kv_cache_interface.py @001cabc1)."""
    size: int
    shared_by: list


def reference_engine(model, num_workers=1, pipeline_parallel_size=1):
    """The engine's own computation: no connector, no prefix cache (a full prefill)."""
    kv_config = make_kv_cache_config(model, 64, num_workers)
    if pipeline_parallel_size > 1:
        kv_config = [make_kv_cache_config(model, 64, num_workers, layer_names=names)
                     for names in pp_stage_layer_names(model, pipeline_parallel_size)]
    return MiniEngine(model, make_vllm_config(model, kv_connector=None, enable_prefix_caching=False,
                                              tensor_parallel_size=num_workers,
                                              pipeline_parallel_size=pipeline_parallel_size),
                      kv_config, num_workers=num_workers)


def first_step_of(engine, req_id):
    return next(h.scheduler_output for h in engine.history if req_id in h.scheduler_output.num_scheduled_tokens)


def computed_at_start(engine, req_id):
    so = first_step_of(engine, req_id)
    new = [r for r in so.scheduled_new_reqs if r.req_id == req_id]
    return new[0].num_computed_tokens if new else None


def rank_keys(engine, tokens):
    """kvtier keys of `tokens` in every rank's namespace, as the connector computes them."""
    scope = engine.scheduler_connector._scheduler.base_scope
    return [h.keys(tokens) for h in scope.hashers], scope.namespaces


def quiet_client(daemon, namespaces):
    return kvtier.Client(daemon.socket_path, namespaces, client_name="test")


def drain_commits(engine):
    for w in engine.worker_connectors:
        w._worker.committer.submit(lambda: None).result(10)


@contextlib.contextmanager
def hma_connector():
    """KvtierConnector subclassing the harness's vLLM classes while the
    block runs, so that it is SupportsHMA as under a real vLLM (which
    refuses other connectors with the hybrid KV cache manager on)."""
    import mini_vllm as mv
    import kvtier.integrations.vllm as connector_module
    try:
        with mv.install_as_vllm():
            importlib.reload(connector_module)
            yield connector_module.KvtierConnector
    finally:
        importlib.reload(connector_module)
