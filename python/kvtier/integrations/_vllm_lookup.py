"""The asynchronous prefix lookups of the kvtier vLLM connector's scheduler
side: every rank's and group's namespace asked without waiting, the hit
the largest prefix they all hold (full-attention prefixes, the blocks
sliding windows read, recurrent states at block boundaries). An answer
later than lookup_timeout counts as a miss."""

import logging
import time

import kvtier

logger = logging.getLogger("kvtier.vllm")


class PrefixLookup:
    """Lookups for one connector's scheduler side, on its requests' states
    (RequestState). Thread: the scheduler's."""

    def __init__(self, geometry, stats):
        self._g = geometry
        self._stats = stats

    def lookup(self, state, client, usable):
        """The kvtier blocks every rank and group holds, or None while an
        answer is out. Phase 1 asks each full-attention namespace for its
        prefix from block 0 (up to `usable`), giving a candidate n. Phase 2
        asks each sliding-window namespace for the blocks its window reads
        at n, and each recurrent-state namespace for the state after every
        block up to n (one key each). The hit is the largest m <= n whose
        state is stored in every state group and whose windows were seen
        stored; when the states end below the checked windows, phase 3 asks
        the windows at that m. An answer later than lookup_timeout counts as
        a miss."""
        g = self._g
        if state.pending is None:
            state.phase, state.candidate = 1, usable
            full = [j for j in range(len(state.keys)) if self.kind(j) == "full"]
            self._send(state, client, {j: (0, usable) for j in full})  # none: every block is a candidate
            self._stats.add("lookups", 1)
        answers = self._answers(state)
        if answers is None:
            return None
        if answers is False:
            return 0
        asked = state.asked
        state.pending = None
        if state.phase == 1:
            n = min([state.candidate] + [asked[j][0] + a for j, a in answers.items()])
            windows = [j for j in range(len(state.keys)) if self.kind(j) == "window"]
            states = [j for j in range(len(state.keys)) if self.kind(j) == "state"]
            if n == 0 or not (windows or states):
                return n
            state.phase, state.candidate = 2, n
            requests = {j: (g.first_read(j % len(g.groups), n), n) for j in windows}
            requests.update({(j, m): (m - 1, m) for j in states for m in range(1, n + 1)})
            self._send(state, client, requests)
            return self.lookup(state, client, usable)
        windows = {j: (asked[j][0], asked[j][0] + a) for j, a in answers.items() if not isinstance(j, tuple)}
        if state.phase == 2:
            states = {j for j in answers if isinstance(j, tuple)}
            namespaces = {j for j, _ in states}
            stored = [m for m in range(state.candidate, 0, -1)
                      if all(answers.get((j, m), 0) == 1 for j in namespaces)]
            for m in stored:
                if self._windows_hold(windows, m):
                    return m
            if not stored or not windows or stored[0] == state.candidate:
                return 0  # conservative: no point below a failed window was checked
            # The states end below the checked windows: ask the windows there.
            m = stored[0]
            state.phase, state.candidate = 3, m
            self._send(state, client, {j: (g.first_read(j % len(g.groups), m), m) for j in windows})
            return self.lookup(state, client, usable)
        return state.candidate if self._windows_hold(windows, state.candidate) else 0

    def kind(self, j):
        """"full", "window" or "state": the kind of namespace j's group."""
        group = self._g.groups[j % len(self._g.groups)]
        return "state" if group.state else ("window" if group.window_tokens else "full")

    def _windows_hold(self, windows, m):
        """Whether every window group's stored run [first, end) covers what
        its window reads at m."""
        g = self._g
        return all(first <= g.first_read(j % len(g.groups), m) and m <= end for j, (first, end) in windows.items())

    def _answers(self, state):
        """{request: prefix blocks} once every lookup in flight answered,
        False when one failed or they took longer than lookup_timeout (a
        miss), None while they are out."""
        if not all(p.done() for p in state.pending.values()):
            if time.monotonic() - state.pending_since < self._g.lookup_timeout:
                return None
            logger.warning("kvtier: a lookup took over %.1f s; counted as a miss", self._g.lookup_timeout)
            state.pending = None
            return False
        try:
            return {j: p.result().prefix_blocks for j, p in state.pending.items()}
        except kvtier.Error as e:
            logger.warning("kvtier: lookup failed: %s", e)
            state.pending = None
            return False

    def _send(self, state, client, requests):
        """Asynchronous lookups: request r -> (first, end) asks namespace j
        (r itself, or r[0] for a state lookup (j, boundary)) for
        keys[j][first:end]."""
        state.asked = dict(requests)
        state.pending = {}
        for r, (first, end) in requests.items():
            j = r[0] if isinstance(r, tuple) else r
            state.pending[r] = client.lookup_async(j, state.keys[j][first:end])
        state.pending_since = time.monotonic()
