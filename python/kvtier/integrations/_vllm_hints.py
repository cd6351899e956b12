"""Queue hints of the kvtier vLLM connector's scheduler side: enqueue /
started / finished per rank's namespace, sent from a background thread so
that the scheduler never waits on kvtierd for them."""

import collections
import logging
import threading

import kvtier

logger = logging.getLogger("kvtier.vllm")

# Hints waiting for the sender thread; beyond this the oldest are dropped
# (counted): a hint is advice, and the scheduler must never wait for it.
MAX_PENDING_HINTS = 4096


class HintSender:
    """Sends queue hints (enqueue / started / finished) from its own thread,
    oldest first, a batch per wake-up; never blocks the caller. Thread-safe."""

    def __init__(self):
        self._pending = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = False
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="kvtier-hints", daemon=True)
        self._thread.start()

    def submit(self, client, call):
        with self._lock:
            if len(self._pending) >= MAX_PENDING_HINTS:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append((client, call))
            self._idle.clear()
        self._wake.set()

    def flush(self, timeout=10.0):
        """Waits until every submitted hint was sent (tests and shutdown)."""
        return self._idle.wait(timeout)

    def close(self):
        self.flush(2.0)
        self._stop = True
        self._wake.set()
        self._thread.join(2.0)

    def _run(self):
        while not self._stop:
            self._wake.wait()
            self._wake.clear()
            while True:
                with self._lock:
                    if not self._pending:
                        self._idle.set()
                        break
                    client, call = self._pending.popleft()
                try:
                    call(client)
                except kvtier.NotFoundError:
                    pass  # the request was no longer queued
                except Exception as e:  # noqa: BLE001 - a hint never fails the engine
                    logger.debug("kvtier: queue hint failed: %s", e)


def hint_id(state, rank_index):
    """The queue-hint request id of one rank's namespace of a request."""
    return state.hint_id * len(state.keys) + rank_index
