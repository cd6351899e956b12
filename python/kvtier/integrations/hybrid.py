"""Prefix reuse for hybrid models: attention layers (full or sliding-window)
plus recurrent layers (Mamba-style) whose state at a block boundary cannot
be recovered from any later state.

Two namespaces share the model's identity and chain inputs but differ in
``object_kind`` (docs/KEYS.md): ``"kv"`` holds each block's attention KV,
``"recurrent_state"`` holds the recurrent layers' state *after* a block, under
that block's key. A prefix of n blocks is usable only when

- the state after block n was stored, and
- the KV blocks the attention layers still read at position n are stored:
  all n blocks for full attention, only those inside the window for a
  sliding window (``window_tokens``).

So a hit is never reported from the KV chain alone: HybridPrefix.lookup
answers the largest such n, which may be shorter than the KV prefix.
"""

import kvtier


def state_namespace(kv_namespace: kvtier.Namespace) -> kvtier.Namespace:
    """The namespace of the recurrent states that go with `kv_namespace`."""
    fields = {name: getattr(kv_namespace, name) for name in (
        "model_id", "model_revision", "kv_dtype", "block_tokens", "layer_count", "bytes_per_token_per_layer",
        "kv_layout", "adapter_id", "adapter_revision", "tp_rank", "tp_size", "pp_rank", "pp_size",
        "kv_format_version")}
    return kvtier.Namespace(**fields, object_kind="recurrent_state")


class HybridPrefix:
    """Saves and finds usable prefixes of one hybrid model over a Client that
    registered the KV namespace as `kv_ns` and state_namespace() of it as
    `state_ns`. `window_tokens`: the sliding window of the attention layers
    (None: full attention, every block is read)."""

    def __init__(self, client, kv_ns, state_ns, kv_namespace, window_tokens=None):
        self._client = client
        self._kv_ns, self._state_ns = kv_ns, state_ns
        self._block_tokens = kv_namespace.block_tokens
        self._kv_hasher = kvtier.ChainHasher(kv_namespace)
        self._state_hasher = kvtier.ChainHasher(state_namespace(kv_namespace))
        self._window = window_tokens

    def keys(self, tokens, cache_salt=None):
        """(KV keys, state keys) of every whole block of `tokens`."""
        return (self._kv_hasher.keys(tokens, cache_salt=cache_salt),
                self._state_hasher.keys(tokens, cache_salt=cache_salt))

    def blocks_read_at(self, n):
        """Indices of the KV blocks the attention layers read when resuming
        after block n."""
        if n == 0:
            return range(0)
        if self._window is None:
            return range(n)
        end = n * self._block_tokens
        return range(max(0, end - self._window + 1) // self._block_tokens, n)

    def save(self, tokens, kv_blocks, states, cache_salt=None):
        """Stores KV block i = kv_blocks[i] (root first) and, for each n in
        `states`, the recurrent state after block n (states[n]). Returns the
        per-item Statuses (KV blocks, then states in the order of `states`)."""
        kv_keys, state_keys = self.keys(tokens, cache_salt)
        out = self._client.put_batch(self._kv_ns, kv_keys[:len(kv_blocks)], list(kv_blocks), chain=True)
        for n in sorted(states):
            if not 1 <= n <= len(state_keys):
                raise kvtier.InvalidArgumentError(f"no block boundary {n} in {len(tokens)} tokens")
        boundaries = sorted(states)
        out += self._client.put_batch(self._state_ns, [state_keys[n - 1] for n in boundaries],
                                      [states[n] for n in boundaries])
        return out

    def lookup(self, tokens, cache_salt=None, max_blocks=None):
        """The largest n (blocks) such that the state after block n and every
        KV block read at n are stored; 0 if none."""
        kv_keys, state_keys = self.keys(tokens, cache_salt)
        top = len(kv_keys) if max_blocks is None else min(max_blocks, len(kv_keys))
        for n in range(top, 0, -1):
            if self._client.lookup(self._state_ns, [state_keys[n - 1]]).prefix_blocks != 1:
                continue
            needed = self.blocks_read_at(n)
            if self._client.lookup(self._kv_ns, kv_keys[needed.start:needed.stop]).prefix_blocks == len(needed):
                return n
        return 0

    def load(self, tokens, n, kv_out, state_out, cache_salt=None):
        """Copies the KV blocks read at n (kv_out[j] for blocks_read_at(n)[j])
        and the state after block n into the given buffers. Raises the
        kvtier.Error of the first block that failed (it was evicted since the
        lookup: recompute)."""
        kv_keys, state_keys = self.keys(tokens, cache_salt)
        needed = self.blocks_read_at(n)
        statuses = self._client.get_batch(self._kv_ns, kv_keys[needed.start:needed.stop], list(kv_out))
        statuses += self._client.get_batch(self._state_ns, [state_keys[n - 1]], [state_out])
        for s in statuses:
            s.raise_if_error()
