"""Moving a running request: a planned migration of a decode worker
(docs/INTEGRATIONS.md, "Moving a running request").

Source engine S decodes a request on node A (kvtierd A); destination
engine T will continue it on node B (kvtierd B, a peer of A). The
operator's migration:

  1. while S keeps decoding, B pulls the context that no longer changes:
     a kvtier.Client on B looks the request's keys up (what B's own tiers
     miss, B's peer tier finds on A) and pins what is found on A, so B's
     kvtierd reads it one-sided from A's host memory, verifies it and
     promotes it into B's host tier (peer.read_bytes on B);
  2. at the hand-off S stops (the request is aborted on S) and the router
     sends T a plain request: the prompt followed by the tokens S generated,
     max_tokens less what was generated. T's connector looks that context up
     in B, loads the full blocks B holds (pulling from A, then, only what the
     pre-copy had not moved yet) and T computes the rest.

What the connector saves: by default the full kvtier blocks of the
*prompt*, in the step that computes them (_vllm_plan.plan_save counts
min(computed, len(prompt)) // block_tokens); blocks that decoding fills
are not saved. So by default the context that A holds and B can pull is
the prompt's full blocks, and T recomputes everything after them, the
generated tokens included. With the connector's `save_decode` on S, S
saves each block as decoding fills it, keyed as the chain of prompt +
output (what T's lookup of its context computes): B pulls those too while
S decodes, the stop-and-copy round moves what filled since the last round,
and T computes only the tokens after the last full block.

The tiny real model (tiny_model.py) is bit-exact by construction whatever
the chunking: S's and T's tokens and logits must equal, bit for bit, one
engine computing the whole request without interruption."""

import time

import pytest
import torch

import kvtier
from peer_pair import start_peer_pair, stats
from vllm_harness import (deterministic, model,  # noqa: F401 (fixtures)
                          BLOCK_TOKENS, computed_at_start, drain_commits, greedy_generate, kvtier_engine, prompt,
                          rank_keys, reference_engine, run_request)

PROMPT = prompt(90, 27)      # three kvtier blocks (8 tokens) and 3 more
PROMPT_BLOCKS = len(PROMPT) // BLOCK_TOKENS
BEFORE = 14                  # tokens S generates before the hand-off: a context of 41 tokens (5 full blocks)
AFTER = 6                    # tokens T generates after it
REQ = "r"


@pytest.fixture
def nodes(make_daemon, monkeypatch, tmp_path):
    """kvtierd A (the source node) and B (the destination), peers of each
    other: one cluster secret, UCX over TCP on loopback."""
    return start_peer_pair(make_daemon, monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def reference(model):
    """One engine, no connector, no prefix cache: the request decoded without
    interruption. (tokens, logits rows: one per position computed, 0 .. end)"""
    engine = reference_engine(model)
    toks, logits = run_request(engine, PROMPT, BEFORE + AFTER, REQ)
    assert toks == greedy_generate(model, PROMPT, BEFORE + AFTER)
    return toks, torch.cat(logits)


class Source:
    """S on node A: decodes the request step by step; its connector saved
    the prompt's full blocks into A in the prefill step."""

    def __init__(self, model, daemon, **kw):
        self.engine = kvtier_engine(model, daemon, **kw)
        self.engine.add_request(PROMPT, BEFORE + AFTER, REQ)
        self.decode_until(1)  # the lookup (a miss), then the prefill: its full blocks saved, the first token
        drain_commits(self.engine)  # A has committed them
        self.namespace = rank_keys(self.engine, PROMPT)[1][0]

    @property
    def tokens(self):
        return list(self.engine.outputs[REQ])

    def decode_until(self, n):
        while len(self.tokens) < n:
            self.engine.step()

    def context(self):
        """What the router sends T: the prompt and every token generated so far."""
        return PROMPT + self.tokens

    def keys(self):
        """kvtier keys of the context's full blocks, as the connectors key them."""
        return rank_keys(self.engine, self.context())[0][0]

    def stop(self):
        """The hand-off: S stops the request (the router aborts it) and goes."""
        self.engine.abort(REQ)
        self.engine.shutdown()
        return torch.cat(self.engine.logits[REQ])


def pull(daemon, namespace, keys, limit=None):
    """One round of the background copy, on B: look the context up, pin what
    only A holds (at most `limit` blocks), so B's kvtierd reads it from A,
    verifies it and promotes it into its host tier. Returns the blocks pulled."""
    with kvtier.Client(daemon.socket_path, [namespace], client_name="migration") as c:
        hit = c.lookup(0, keys)
        remote = [k for k, tier in zip(keys[:hit.prefix_blocks], hit.tiers) if tier == kvtier.Tier.REMOTE]
        remote = remote[:limit]
        for view in c.pin(0, remote):
            assert view.ok, view
            with view:
                pass
        return len(remote)


def tiers_on(daemon, namespace, keys):
    with kvtier.Client(daemon.socket_path, [namespace], client_name="test") as c:
        return list(c.lookup(0, keys).tiers)


def kv_outputs(engine):
    return [h.model_runner_output.kv_connector_output for h in engine.history
            if h.model_runner_output.kv_connector_output is not None]


def loaded_blocks(engine):
    total = 0
    for out in kv_outputs(engine):
        data = out.kv_connector_stats.data if out.kv_connector_stats is not None else {}
        total += data.get("load_blocks", 0)
    return total


def continue_on(model, daemon, context, **kw):
    """The hand-off's second half: T on B gets the context as a plain request."""
    t = kvtier_engine(model, daemon, **kw)
    toks, logits = run_request(t, context, AFTER, REQ)
    t.shutdown()
    return t, toks, torch.cat(logits)


def assert_bit_exact(s_tokens, s_rows, t_tokens, t_rows, reference, t_first_position):
    r_toks, r_rows = reference
    assert s_tokens + t_tokens == r_toks
    assert torch.equal(s_rows, r_rows[:len(s_rows)])             # S: positions 0 .. its last
    assert torch.equal(t_rows, r_rows[t_first_position:])        # T: from what it computed on


def test_a_decoding_request_moves_to_another_node_bit_exact(model, nodes, reference):
    a, b = nodes
    s = Source(model, a)
    ns, block_bytes = s.namespace, s.namespace.block_bytes
    assert stats(b, ns).get("engine.blocks", 0) == 0  # B holds nothing of it: every byte must come from A

    # Background copy while S decodes: each round pulls what A holds and B does not yet.
    rounds = []
    while len(s.tokens) < BEFORE:
        rounds.append(pull(b, ns, s.keys()))
        s.decode_until(min(BEFORE, len(s.tokens) + 4))
    assert len(s.tokens) == BEFORE
    # The first round moved the prompt's blocks; A never had more (decode-time blocks are not saved).
    assert rounds[0] == PROMPT_BLOCKS and sum(rounds[1:]) == 0
    keys = s.keys()
    assert len(keys) == (len(PROMPT) + BEFORE) // BLOCK_TOKENS == 5
    assert tiers_on(b, ns, keys) == [kvtier.Tier.HOST] * PROMPT_BLOCKS  # in B's host tier now
    before_stop = stats(b, ns)
    assert before_stop["peer.read_bytes"] == PROMPT_BLOCKS * block_bytes
    assert before_stop.get("peer.corrupt", 0) == 0

    # The hand-off: S stops; the stop-and-copy round finds nothing left to move; T continues.
    context = s.context()
    s_rows = s.stop()
    assert pull(b, ns, keys) == 0
    t, t_tokens, t_rows = continue_on(model, b, context)

    assert computed_at_start(t, REQ) == PROMPT_BLOCKS * BLOCK_TOKENS  # the prefix loaded, not recomputed
    assert loaded_blocks(t) == PROMPT_BLOCKS
    assert not any(o.invalid_block_ids for o in kv_outputs(t))
    assert t.scheduler_connector.disabled_reason is None
    assert stats(b, ns)["peer.read_bytes"] == before_stop["peer.read_bytes"]  # nothing pulled in the pause
    assert_bit_exact(s.tokens[:BEFORE], s_rows, t_tokens, t_rows, reference, PROMPT_BLOCKS * BLOCK_TOKENS)
    # T saved what it computed: B now holds the whole context's full blocks (the decode-time ones too).
    assert tiers_on(b, ns, keys) == [kvtier.Tier.HOST] * len(keys)


def test_with_save_decode_the_blocks_decoding_fills_move_while_s_decodes(model, nodes, reference):
    a, b = nodes
    s = Source(model, a, save_decode=True)
    ns, block_bytes = s.namespace, s.namespace.block_bytes
    assert stats(b, ns).get("engine.blocks", 0) == 0

    # Background copy while S decodes: each round pulls the full blocks A holds and B does not yet.
    rounds = []
    while len(s.tokens) < BEFORE:
        drain_commits(s.engine)  # this step's saves are committed on A
        rounds.append(pull(b, ns, s.keys()))
        s.decode_until(min(BEFORE, len(s.tokens) + 4))
    assert rounds[0] == PROMPT_BLOCKS
    assert sum(rounds[1:]) >= 1  # blocks filled by decoding moved while S went on
    drain_commits(s.engine)
    keys = s.keys()
    assert len(keys) == (len(PROMPT) + BEFORE) // BLOCK_TOKENS == 5
    assert tiers_on(a, ns, keys) == [kvtier.Tier.HOST] * len(keys)  # S saved every full block of its context

    # The hand-off: S stops; the stop-and-copy round moves what filled since the last round; T continues.
    context = s.context()
    s_rows = s.stop()
    left = pull(b, ns, keys)
    assert sum(rounds) + left == len(keys)
    assert tiers_on(b, ns, keys) == [kvtier.Tier.HOST] * len(keys)
    read = stats(b, ns)["peer.read_bytes"]
    assert read == len(keys) * block_bytes
    t, t_tokens, t_rows = continue_on(model, b, context)

    assert computed_at_start(t, REQ) == len(keys) * BLOCK_TOKENS  # the generated tokens' blocks loaded too
    assert loaded_blocks(t) == len(keys)
    assert not any(o.invalid_block_ids for o in kv_outputs(t))
    assert stats(b, ns)["peer.read_bytes"] == read  # all of it was on B already
    assert_bit_exact(s.tokens[:BEFORE], s_rows, t_tokens, t_rows, reference, len(keys) * BLOCK_TOKENS)


@pytest.mark.parametrize("precopied", [0, 2])
def test_the_hand_off_pulls_only_what_the_pre_copy_left(model, nodes, reference, precopied):
    """A pre-copy that moved `precopied` of the prompt's blocks (none, or a
    round cut short): T's own lookup at the hand-off finds the rest on A
    through B's peer tier and its load pulls exactly that."""
    a, b = nodes
    s = Source(model, a)
    ns, block_bytes = s.namespace, s.namespace.block_bytes
    if precopied:
        assert pull(b, ns, s.keys(), limit=precopied) == precopied
    s.decode_until(BEFORE)
    context = s.context()
    s_rows = s.stop()
    read = stats(b, ns).get("peer.read_bytes", 0)
    assert read == precopied * block_bytes

    t, t_tokens, t_rows = continue_on(model, b, context)

    assert computed_at_start(t, REQ) == PROMPT_BLOCKS * BLOCK_TOKENS
    assert loaded_blocks(t) == PROMPT_BLOCKS
    assert stats(b, ns)["peer.read_bytes"] - read == (PROMPT_BLOCKS - precopied) * block_bytes
    assert_bit_exact(s.tokens[:BEFORE], s_rows, t_tokens, t_rows, reference, PROMPT_BLOCKS * BLOCK_TOKENS)


def kill(daemon):
    """The source node's kvtierd dies (SIGKILL: no goodbye to its peers)."""
    daemon.proc.kill()
    daemon.proc.wait(10)


def assert_b_warned_a_is_gone(a, b):
    """The one warning of such a migration: B's kvtierd logs that A's
    connection failed (the connector says nothing: to T it was a miss, or a
    failed load vLLM recomputes)."""
    line = f"peer {a.peer_address}: connection failed"
    deadline = time.monotonic() + 10
    while line not in b.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert line in b.log.read_text()


@pytest.mark.parametrize("precopied", [0, 1])
def test_a_source_node_that_died_before_the_hand_off_falls_back_to_recompute(model, nodes, reference, precopied):
    """A's kvtierd dies while S decodes: T loads what the pre-copy had moved
    to B and recomputes the rest, bit-exact; no engine or daemon fails."""
    a, b = nodes
    s = Source(model, a)
    ns = s.namespace
    if precopied:
        assert pull(b, ns, s.keys(), limit=precopied) == precopied
    s.decode_until(BEFORE)
    kill(a)
    context = s.context()
    s_rows = s.stop()

    t, t_tokens, t_rows = continue_on(model, b, context)

    assert computed_at_start(t, REQ) == precopied * BLOCK_TOKENS
    assert loaded_blocks(t) == precopied
    assert t.scheduler_connector.disabled_reason is None
    assert_bit_exact(s.tokens[:BEFORE], s_rows, t_tokens, t_rows, reference, precopied * BLOCK_TOKENS)
    assert b.proc.poll() is None  # B's kvtierd is still serving
    assert stats(b, ns).get("peer.connected", 0) == 0  # and knows A is gone
    assert_b_warned_a_is_gone(a, b)


def test_a_source_node_that_dies_during_the_hand_off_load_is_recomputed(model, nodes, reference):
    """The pre-copy moved block 0; T's lookup found blocks 1-2 on A; A dies
    between T's plan and its load: the load reports their engine blocks
    failed, and vLLM (kv_load_failure_policy "recompute") computes T's
    request from block 1, bit-exact."""
    a, b = nodes
    s = Source(model, a)
    ns = s.namespace
    assert pull(b, ns, s.keys(), limit=1) == 1
    s.decode_until(BEFORE)
    context = s.context()
    s_rows = s.stop()
    t = kvtier_engine(model, b)
    t.add_request(context, AFTER, REQ)
    for _ in range(100):
        so = t.schedule()
        planned = any(load.req_id == REQ for load in so.kv_connector_metadata.loads)
        if planned:  # between the scheduler's plan and the workers' load
            kill(a)
        t.update_from_output(so, t.execute_model(so))
        if planned:
            break
    else:
        pytest.fail("T never planned the load")
    t.run_until_done()
    t.shutdown()

    assert computed_at_start(t, REQ) == PROMPT_BLOCKS * BLOCK_TOKENS  # promised at allocation ...
    failed = [o.invalid_block_ids for o in kv_outputs(t) if o.invalid_block_ids]
    # ... but blocks 1-2 failed: their engine blocks (4 tokens each) reported invalid
    assert len(failed) == 1 and len(failed[0]) == 2 * (BLOCK_TOKENS // 4)
    assert t.scheduler_connector.disabled_reason is None
    t_rows = torch.cat(t.logits[REQ])
    assert_bit_exact(s.tokens[:BEFORE], s_rows, list(t.outputs[REQ]), t_rows, reference, BLOCK_TOKENS)
    assert b.proc.poll() is None
    assert_b_warned_a_is_gone(a, b)
