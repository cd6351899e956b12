"""The connection of kvtier's SGLang storage backend (sglang.py) to
kvtierd. It opens once the KV pool is registered, is dropped when a call
says the daemon went away, and reopens on a later call at most every
reconnect_interval_s; no data-path call waits for it (a call meanwhile
misses). Failures are counted and logged, at most one warning per 10 s."""

from __future__ import annotations

import logging
import threading
import time

import kvtier

logger = logging.getLogger("kvtier.integrations.sglang")  # the backend's (sglang.py's) logger

_DEAD_CONNECTION = ("unavailable", "cancelled")
_WARN_EVERY_S = 10.0


class DaemonLink:
    """One backend's kvtier.Client over `namespaces` (the KV namespace, then
    the sidecar pools'; index i is kvtier namespace i). Thread-safe: SGLang's
    threads call at once; at most one connects, the others go on."""

    def __init__(self, socket_path, client_name, connect_timeout_s, call_timeout_s, verify_checksums,
                 reconnect_interval_s, stats):
        """`stats`: the backend's BackendStats (_sglang_stats.py), which counts
        the failures."""
        self.socket_path = socket_path
        self.namespaces = []  # set when the pool registers, grown by add_namespace
        self._client_name = client_name
        self._connect_timeout_s = connect_timeout_s
        self._call_timeout_s = call_timeout_s
        self._verify_checksums = verify_checksums
        self._reconnect_interval_s = reconnect_interval_s
        self._stats = stats
        self._client = None
        self._next_connect = 0.0
        self._connect_lock = threading.Lock()
        self._next_warning = 0.0

    def client(self, registered: bool):
        """The connection, or None (no pool yet: `registered` false, or the
        daemon unreachable and the next attempt not due). Never waits for
        another thread's attempt."""
        client = self._client
        if client is not None or not registered:
            return client
        if time.monotonic() < self._next_connect or not self._connect_lock.acquire(blocking=False):
            return None
        try:
            if self._client is None:
                self._next_connect = time.monotonic() + self._reconnect_interval_s
                self._client = kvtier.Client(
                    self.socket_path, list(self.namespaces), client_name=self._client_name,
                    connect_timeout=self._connect_timeout_s, call_timeout=self._call_timeout_s,
                    verify_checksums=self._verify_checksums)
            return self._client
        except Exception as e:  # noqa: BLE001
            self.failed(f"connecting to kvtierd at {self.socket_path}", e)
            return None
        finally:
            self._connect_lock.release()

    def add_namespace(self, namespace) -> int:
        """Appends `namespace` and returns its index; the connection is closed
        so that the next call reconnects registering it."""
        with self._connect_lock:
            index = len(self.namespaces)
            self.namespaces = self.namespaces + [namespace]
            client, self._client, self._next_connect = self._client, None, 0.0
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001  (the new connection replaces it either way)
                pass
        return index

    def checked(self, statuses):
        """`statuses`, after dropping the connection if one says it died."""
        dead = next((s for s in statuses if s.code in _DEAD_CONNECTION), None)
        if dead is not None:
            self.failed("a kvtierd call", kvtier.Error(f"connection lost: {dead.message}"), dead.code)
        return statuses

    def failed(self, what, error, code=None):
        """Counts and (rate-limited) logs a failure; drops a dead connection."""
        self._stats.count(errors=1)
        client = self._client
        if client is not None and (code or getattr(error, "code", None)) in _DEAD_CONNECTION:
            self._client = None
            try:
                client.close()
            except Exception:  # noqa: BLE001  (closing a dead connection)
                pass
        now = time.monotonic()
        if now >= self._next_warning:
            self._next_warning = now + _WARN_EVERY_S
            logger.warning("kvtier: %s failed: %s (counted as missed/not stored; further failures within %.0f s "
                           "are not logged)", what, error, _WARN_EVERY_S)
