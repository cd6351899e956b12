"""Fixtures of the Python suite: a real kvtierd child on a private socket.

ctest runs this suite with /usr/bin/python3 -m pytest and sets
PYTHONPATH (the built package), KVTIERD (the daemon binary) and
KVTIER_SOURCE_DIR. Each daemon gets a fresh temporary directory and is
stopped with SIGTERM at the end of its test.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import kvtier

KVTIERD = os.environ.get("KVTIERD", "")
SOURCE_DIR = Path(os.environ.get("KVTIER_SOURCE_DIR", Path(__file__).resolve().parents[2]))


class Daemon:
    """A kvtierd child process. `restart()` stops it and starts a new one on
    the same configuration (the NVMe tier's file and index survive)."""

    def __init__(self, directory: Path, host_bytes: int, nvme_bytes: int, extra: str, server_extra: str = "",
                 metrics_extra: str = ""):
        self.directory = directory
        self.socket_path = str(directory / "kvtierd.sock")
        self.config = directory / "kvtierd.toml"
        nvme = ""
        if nvme_bytes:
            nvme = (f'[nvme]\npath = "{directory / "nvme.dat"}"\ncapacity_bytes = {nvme_bytes}\n'
                    f'region_bytes = "4MiB"\nadmission = "all"\n')
        self.config.write_text(
            f'[server]\nsocket_path = "{self.socket_path}"\n{server_extra}'
            f'[host]\ncapacity_bytes = {host_bytes}\nlock_memory = "off"\n'
            f'[hbm]\nenabled = "off"\n[metrics]\nport = 0\n{metrics_extra}' + nvme + extra)
        self.proc = None
        self.log = directory / "kvtierd.log"
        self.start()

    def start(self):
        if not KVTIERD:
            pytest.skip("KVTIERD is not set: run the suite through ctest")
        log = open(self.log, "ab")
        self.proc = subprocess.Popen([KVTIERD, "--config", str(self.config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvtierd exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.socket_path)
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("kvtierd did not listen within 30 s")

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        assert rc == 0, f"kvtierd exited with {rc}:\n{self.log.read_text()}"

    def pause(self):
        """SIGSTOP, returning once the kernel has stopped the process (the
        signal is delivered asynchronously)."""
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return
            time.sleep(0.001)
        raise RuntimeError("kvtierd did not stop")

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def restart(self):
        self.stop()
        self.start()


@pytest.fixture
def make_daemon():
    # A short private directory: a Unix socket path must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="kvtier-py-"))
    daemons = []

    def make(host_bytes=64 << 20, nvme_bytes=0, extra="", server_extra="", metrics_extra=""):
        """`extra`: TOML appended after the sections; `server_extra`, `metrics_extra`: lines of
        [server], [metrics]."""
        directory = root / f"d{len(daemons)}"
        directory.mkdir()
        daemons.append(Daemon(directory, host_bytes, nvme_bytes, extra, server_extra, metrics_extra))
        return daemons[-1]

    yield make
    try:
        for d in daemons:
            d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def daemon(make_daemon):
    return make_daemon()


def metrics_url(daemon):
    """The daemon's /metrics address from its log. kvtierd prints it once
    the endpoint runs, after the socket accepts: waits up to 10 s for it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = re.search(r"^metrics: (http://\S+)$", daemon.log.read_text(), re.M)
        if m:
            return m.group(1)
        time.sleep(0.02)
    raise AssertionError("kvtierd printed no metrics line:\n" + daemon.log.read_text())


def test_namespace(revision="rev-1", block_tokens=16, layer_count=4, bytes_per_token_per_layer=64):
    """A valid namespace; blocks are block_tokens * layer_count * bytes_per_token_per_layer bytes."""
    return kvtier.Namespace(model_id="test/model", model_revision=revision, kv_dtype="fp32",
                            block_tokens=block_tokens, layer_count=layer_count,
                            bytes_per_token_per_layer=bytes_per_token_per_layer)


test_namespace.__test__ = False  # a helper, not a test


def block_bytes(ns, seed):
    """One block of `ns` of random bytes (a numpy uint8 array), reproducible by `seed`."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, ns.block_bytes, dtype=np.uint8)


def keys_of(ns, n_blocks, first_token=0):
    """The chain keys of `n_blocks` blocks of consecutive token ids from `first_token`."""
    tokens = np.arange(first_token, first_token + n_blocks * ns.block_tokens, dtype=np.uint32)
    return kvtier.ChainHasher(ns).keys(tokens)
