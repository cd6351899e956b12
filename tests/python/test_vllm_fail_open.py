"""The kvtier vLLM connector never crashes the engine: every unsupported
model kind or KV form, a daemon that is down, and a failure inside a hook
give one warning naming the reason, and the engine serves the right tokens
without the cache. It reconnects when kvtierd comes up later."""

import dataclasses
import logging
import time

import pytest

from kvtier.integrations.vllm import KvtierConnector
from mini_vllm import (KVCacheGroupSpec, KVConnectorRole, MambaSpec, MiniEngine, SlidingWindowSpec,
                       make_kv_cache_config, make_vllm_config)
from mini_vllm.kv_cache_interface import KVQuantMode
from vllm_harness import (deterministic, model,  # noqa: F401 (fixtures)
                          computed_at_start, drain_commits, greedy_generate, kvtier_engine, prompt, rank_keys,
                          quiet_client, run_request)

WARNING = "serving without the cache"


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and WARNING in r.getMessage()]


def _replace_spec(kv_config, **changes):
    group = kv_config.kv_cache_groups[0]
    group.kv_cache_spec = dataclasses.replace(group.kv_cache_spec, **changes)


def with_a_mamba_group(cfg, kv_config):
    spec = kv_config.kv_cache_groups[0].kv_cache_spec
    state = MambaSpec(block_size=spec.block_size, shapes=((4, 4),), dtypes=(spec.dtype,))
    kv_config.kv_cache_groups.append(KVCacheGroupSpec(["model.layers.9.mixer"], state))


def groups_of_two_block_sizes(cfg, kv_config):
    spec = kv_config.kv_cache_groups[0].kv_cache_spec
    window = SlidingWindowSpec(block_size=spec.block_size * 2, num_kv_heads=spec.num_kv_heads,
                               head_size=spec.head_size, dtype=spec.dtype, sliding_window=8)
    kv_config.kv_cache_groups.append(KVCacheGroupSpec(["model.layers.9.self_attn.attn"], window))


def per_token_head_scales(cfg, kv_config):
    _replace_spec(kv_config, kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD)


def decode_context_parallel(cfg, kv_config):
    cfg.parallel_config.decode_context_parallel_size = 2


def no_revision(cfg, kv_config):
    cfg.model_config.revision = None


def compressed_states(cfg, kv_config):
    _replace_spec(kv_config, tokens_per_state=2)


def mamba_only(cfg, kv_config):
    group = kv_config.kv_cache_groups[0]
    group.kv_cache_spec = MambaSpec(block_size=group.kv_cache_spec.block_size, shapes=((4, 4),),
                                    dtypes=(group.kv_cache_spec.dtype,))


UNSUPPORTED = {
    "hybrid model with a Mamba group": (with_a_mamba_group, "recurrent state"),
    "groups of two block sizes": (groups_of_two_block_sizes, "block sizes"),
    "KV quantized with per-token-head scales": (per_token_head_scales, "quantization mode 2"),
    "decode context parallelism": (decode_context_parallel, "decode_context_parallel_size"),
    "no model revision": (no_revision, "model revision"),
    "compressed states": (compressed_states, "tokens per stored state"),
    "a Mamba-only cache": (mamba_only, "MambaSpec"),
}


def _connectors(model, daemon, change):
    cfg = make_vllm_config(model, kv_connector="KvtierConnector", kv_connector_module_path="kvtier.integrations.vllm",
                           kv_connector_extra_config=dict(socket_path=daemon.socket_path, block_tokens=8),
                           kv_load_failure_policy="recompute")
    kv_config = make_kv_cache_config(model, 32)
    change(cfg, kv_config)
    return (KvtierConnector(cfg, KVConnectorRole.SCHEDULER, kv_config),
            KvtierConnector(cfg, KVConnectorRole.WORKER, kv_config), cfg, kv_config)


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_an_unsupported_case_warns_once_and_every_hook_answers(model, daemon, caplog, case):
    change, reason = UNSUPPORTED[case]
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    scheduler, worker, _, _ = _connectors(model, daemon, change)
    assert reason in scheduler.disabled_reason and reason in worker.disabled_reason
    assert len(warnings_of(caplog)) == 2  # one per connector instance

    engine = MiniEngine(model, make_vllm_config(model, kv_connector=None), make_kv_cache_config(model, 32))
    request = engine.make_request(prompt(1, 20), 2, "r1")
    assert scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
    scheduler.update_state_after_alloc(request, None, 0)
    meta = scheduler.build_connector_meta(engine.schedule())
    assert not meta.loads and not meta.saves
    assert scheduler.request_finished(request, []) == (False, None)
    assert list(scheduler.take_events()) == []
    worker.register_kv_caches(engine.kv_caches)
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    for name in engine.kv_caches:
        worker.wait_for_layer_load(name)
        worker.save_kv_layer(name, engine.kv_caches[name], None)
    worker.wait_for_save()
    assert worker.get_finished({"r1"}) == (None, None)
    assert worker.get_block_ids_with_load_errors() == set()
    assert len(warnings_of(caplog)) == 2


def test_an_unsupported_case_serves_the_right_tokens(model, daemon):
    cfg = make_vllm_config(model, kv_connector="KvtierConnector", kv_connector_module_path="kvtier.integrations.vllm",
                           kv_connector_extra_config=dict(socket_path=daemon.socket_path, block_tokens=8),
                           kv_load_failure_policy="fail")
    kv_config = make_kv_cache_config(model, 32)
    per_token_head_scales(cfg, kv_config)
    engine = MiniEngine(model, cfg, kv_config, KvtierConnector)
    p = prompt(2, 19)
    toks, _ = run_request(engine, p, 3, "r1")
    assert toks == greedy_generate(model, p, 3)
    assert engine.finish_reasons["r1"] != "error"


def test_a_kv_tensor_of_an_unknown_form_is_refused_at_registration(model, daemon, caplog):
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    _, worker, _, _ = _connectors(model, daemon, lambda cfg, kv: None)
    import torch
    worker.register_kv_caches({name: torch.zeros(32, 7) for name in model.attention_layer_names})
    assert "none of the forms" in worker.disabled_reason
    assert len(warnings_of(caplog)) == 1


def test_a_failing_hook_after_a_promised_load_recomputes(model, daemon, caplog):
    """A hit was promised to vLLM, then the worker's load raised: the
    promised blocks come back as load errors, vLLM recomputes them, and the
    tokens are right."""
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    shared = prompt(3, 18)
    a = kvtier_engine(model, daemon)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon)
    worker = b.worker_connectors[0]._worker

    def broken(meta):
        raise RuntimeError("injected")
    worker.start_load_kv = broken
    p2 = shared + [2, 3]
    toks, _ = run_request(b, p2, 2, "r2")
    assert toks == greedy_generate(model, p2, 2)
    assert "start_load_kv failed" in b.worker_connectors[0].disabled_reason
    assert len(warnings_of(caplog)) == 1
    a.shutdown()
    b.shutdown()


def test_a_daemon_down_at_start_is_reached_later(model, make_daemon, caplog):
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    daemon = make_daemon()
    daemon.stop()  # vLLM starts before kvtierd
    a = kvtier_engine(model, daemon, reconnect_interval=0.05)
    p = prompt(4, 19)
    toks, _ = run_request(a, p, 1, "r1")
    assert toks == greedy_generate(model, p, 1)
    assert any("not reachable" in m for m in (r.getMessage() for r in caplog.records))
    daemon.start()
    time.sleep(0.1)
    run_request(a, p, 1, "r2")  # saves now reach the daemon
    drain_commits(a)
    keys, namespaces = rank_keys(a, p)
    with quiet_client(daemon, namespaces) as c:
        assert c.lookup(0, keys[0]).prefix_blocks == 2
    b = kvtier_engine(model, daemon)
    run_request(b, p + [5], 1, "r3")
    assert computed_at_start(b, "r3") == 16
    a.shutdown()
    b.shutdown()


def test_the_fail_policy_is_warned_about_at_start(model, daemon, caplog):
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    kvtier_engine(model, daemon, policy="fail").shutdown()
    assert any("kv_load_failure_policy" in r.getMessage() for r in caplog.records)
    caplog.clear()
    kvtier_engine(model, daemon, policy="recompute").shutdown()
    assert not any("kv_load_failure_policy" in r.getMessage() for r in caplog.records)


def test_a_copy_that_raises_on_the_loader_thread_recomputes(model, daemon, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    from kvtier.integrations import _vllm_worker
    shared = prompt(6, 18)
    a = kvtier_engine(model, daemon)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon)

    def broken(self, layer, tensor):
        raise RuntimeError("copy failed")
    monkeypatch.setattr(_vllm_worker._ActiveLoad, "layer", broken)
    p2 = shared + [2, 3]
    toks, _ = run_request(b, p2, 2, "r2")
    assert toks == greedy_generate(model, p2, 2)
    assert "copy failed" in b.worker_connectors[0].disabled_reason
    a.shutdown()
    b.shutdown()


def test_a_hung_daemon_holds_a_reconnect_for_a_fraction_of_a_second(model, make_daemon):
    """vLLM starts while kvtierd is down, then kvtierd comes back hung
    (stopped): the retries on the scheduler's and the forward's threads
    wait at most RETRY_CONNECT_S each, not connect_timeout."""
    from kvtier.integrations import vllm as connector_module
    daemon = make_daemon()
    daemon.stop()
    a = kvtier_engine(model, daemon, reconnect_interval=0.0, connect_timeout=5.0)
    daemon.start()
    daemon.pause()
    try:
        started = time.monotonic()
        p = prompt(7, 19)
        toks, _ = run_request(a, p, 1, "r1")
        elapsed = time.monotonic() - started
    finally:
        daemon.resume()
    assert toks == greedy_generate(model, p, 1)
    steps = len(a.history)
    # one scheduler and one worker retry per step at most, each bounded
    assert elapsed < 2 * steps * connector_module.RETRY_CONNECT_S + 2.0
    a.shutdown()
