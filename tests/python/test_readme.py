"""The Python quick start of README.md runs as written against a kvtierd
(the one of this test, in place of the default socket path)."""

import re

from conftest import SOURCE_DIR


def quick_start():
    text = (SOURCE_DIR / "README.md").read_text()
    section = text[text.index("## Python quick start"):]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README.md's Python quick start has no python block"
    return blocks[0]


def test_the_readme_quick_start_runs(daemon):
    code = quick_start()
    assert "/run/kvtier/kvtierd.sock" in code  # the default socket, which this test replaces
    scope = {}
    exec(compile(code.replace("/run/kvtier/kvtierd.sock", daemon.socket_path), "README.md", "exec"), scope)
    keys, ns = scope["keys"], scope["ns"]
    assert len(keys) == 200 // ns.block_tokens and scope["cached"] == 0
    assert bytes(scope["block"]) == bytes(ns.block_bytes)  # what was put comes back
