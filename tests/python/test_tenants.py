"""Tenants end to end: a kvtierd with [[tenant]] tables, and clients that
run as other uids (setpriv), each with its own arena, keys and quotas.

Every client here is a child process under `setpriv --reuid/--regid`, so
the daemon sees the uid the kernel gives it (SO_PEERCRED), as it would an
inference engine running as its own service user. Needs root (to become
other uids); skipped otherwise.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import kvtier
from conftest import test_namespace
from test_metrics import metrics_url, parse, scrape

KVTIER_TOOL = os.environ.get("KVTIER_TOOL", "")
SOCKET_GID = 4242          # the socket's group: every tenant's user is in it
ALPHA, BETA, STRANGER = 1101, 1102, 1103
MiB = 1 << 20

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run clients as other uids (setpriv)")

# A client run as another uid: does what argv[2] says and prints one JSON
# object. Blocks are 4 KiB; block i of pattern p is a SHA-256 of (p, i),
# repeated.
CHILD = textwrap.dedent('''
    import ctypes, hashlib, json, sys
    import kvtier
    socket_path, action, model, pattern, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    ns = kvtier.Namespace(model_id=model, model_revision="rev-1", kv_dtype="fp32", block_tokens=16,
                          layer_count=4, bytes_per_token_per_layer=64)
    keys = kvtier.ChainHasher(ns).keys(list(range(n * 16)))
    def block(i, p):
        return (hashlib.sha256(b"%d:%d" % (p, i)).digest() * (ns.block_bytes // 32 + 1))[:ns.block_bytes]
    def arena_holds(needle):
        """Whether any kvtier arena this process maps holds `needle`."""
        for line in open("/proc/self/maps"):
            if "kvtier-arena" not in line:
                continue
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if ctypes.string_at(lo, hi - lo).find(needle) >= 0:
                return True
        return False
    out = {}
    try:
        with kvtier.Client(socket_path, [ns]) as c:
            out["arena_bytes"] = c.arena_bytes
            out["fingerprint"] = c.fingerprints[0].hex()
            out["keys"] = [k.hex() for k in keys[:2]]
            if action == "put":
                for i, k in enumerate(keys):
                    c.put(0, k, block(i, pattern))
            elif action == "erase":
                out["erased"] = c.erase(0, keys)
            elif action == "enqueue":
                c.enqueue(1, 0, keys)
                c.finished(1)
            hit = c.lookup(0, keys)
            out["prefix"] = hit.prefix_blocks
            out["tiers"] = [str(t) for t in hit.tiers]
            exact = 0
            buf = bytearray(ns.block_bytes)
            for i, k in enumerate(keys):
                try:
                    c.get(0, k, buf)
                    exact += bytes(buf) == block(i, pattern)
                except kvtier.NotFoundError:
                    pass
            out["exact"] = exact
            out["sees_alpha_block"] = arena_holds(block(0, 1))
    except kvtier.Error as e:
        out["error"] = type(e).__name__ + ": " + str(e)
    print(json.dumps(out))
''')

# Run as another uid: opens argv[2] raw connections (never sending a
# request), prints {"opened": n} and waits for a line on stdin; then, for
# each connection, what came within a second: "open" (nothing, still open)
# or the bytes the daemon sent before closing it (its refusal frame).
HOLDER = textwrap.dedent('''
    import json, select, socket, sys, time
    held = []
    for _ in range(int(sys.argv[2])):
        s = socket.socket(socket.AF_UNIX)
        s.connect(sys.argv[1])
        held.append(s)
    print(json.dumps({"opened": len(held)}), flush=True)
    sys.stdin.readline()
    seen = []
    deadline = time.monotonic() + 1
    for s in held:
        got = b""
        while True:
            ready, _, _ = select.select([s], [], [], max(0, deadline - time.monotonic()))
            if not ready:
                seen.append("open")
                break
            try:
                chunk = s.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                seen.append(got.decode("utf-8", "replace"))
                break
            got += chunk
    print(json.dumps({"seen": seen}), flush=True)
''')


def tenants_config():
    return textwrap.dedent(f'''
        [[tenant]]
        name = "alpha"
        uids = [{ALPHA}]
        host_bytes = "16MiB"
        nvme_bytes = "2MiB"

        [[tenant]]
        name = "beta"
        uids = [{BETA}]
        host_bytes = "24MiB"
        models = ["test/model"]
    ''')


def stage_for_other_users(stage):
    """Copies what the other uids run (the package, the libraries it loads
    from the build tree, the kvtier tool) to `stage`, readable by all: the
    build tree may sit where only root can read (a clone under /root)."""
    package = Path(kvtier.__file__).resolve().parent
    shutil.copytree(package, stage / "python" / "kvtier")
    (stage / "lib").mkdir()
    extension = next(package.glob("_kvtier*.so"))
    for line in subprocess.run(["ldd", str(extension)], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and not parts[2].startswith(("/lib", "/usr")):
            shutil.copy(parts[2], stage / "lib" / parts[0])
    if KVTIER_TOOL:
        (stage / "bin").mkdir()
        shutil.copy(KVTIER_TOOL, stage / "bin" / "kvtier")
    for path in [stage, *stage.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    env = os.environ.copy()
    env["PYTHONPATH"] = str(stage / "python")
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(stage / "lib"), env.get("LD_LIBRARY_PATH")]))
    return env


def make_tenancy(make_daemon, server_extra="", metrics_extra=""):
    d = make_daemon(host_bytes=64 * MiB, nvme_bytes=64 * MiB,
                    extra=tenants_config(), server_extra=server_extra, metrics_extra=metrics_extra)
    # The other uids must reach the socket: its directory and the test's root.
    for path in (d.directory, d.directory.parent):
        os.chmod(path, 0o755)
    os.chown(d.socket_path, -1, SOCKET_GID)
    os.chmod(d.socket_path, 0o660)
    for name, text in (("child.py", CHILD), ("holder.py", HOLDER)):
        (d.directory / name).write_text(text)
        os.chmod(d.directory / name, 0o644)
    d.child_env = stage_for_other_users(d.directory / "stage")
    return d


@pytest.fixture
def tenancy(make_daemon):
    return make_tenancy(make_daemon)


class Holder:
    """`n` idle connections held open by `uid` (HOLDER) until `seen()`."""

    def __init__(self, d, uid, n):
        self.proc = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", f"--groups={SOCKET_GID}", sys.executable,
             str(d.directory / "holder.py"), d.socket_path, str(n)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=d.child_env)
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read()
        assert json.loads(line)["opened"] == n

    def seen(self):
        out, err = self.proc.communicate("go\n", timeout=60)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])["seen"]


def run_as(d, uid, argv, groups=(SOCKET_GID,)):
    """`argv` as `uid` (primary group the same number), with `groups`."""
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}",
           "--groups=" + ",".join(str(g) for g in groups) if groups else "--clear-groups", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=d.child_env)


def client(d, uid, action, model="test/model", pattern=1, n=8):
    r = run_as(d, uid, [sys.executable, str(d.directory / "child.py"), d.socket_path, action, model,
                        str(pattern), str(n)])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def cli(d, uid, *args):
    if not KVTIER_TOOL:
        pytest.skip("KVTIER_TOOL is not set: run the suite through ctest")
    if uid is None:  # root: the operator
        return subprocess.run([KVTIER_TOOL, *args, "--socket", d.socket_path], capture_output=True, text=True,
                              timeout=60)
    return run_as(d, uid, [str(d.directory / "stage" / "bin" / "kvtier"), *args, "--socket", d.socket_path])


def test_each_tenant_has_its_own_arena_blocks_and_fingerprints(tenancy):
    d = tenancy
    a = client(d, ALPHA, "put", pattern=1)
    assert "error" not in a, a
    assert a["arena_bytes"] == 16 * MiB and a["prefix"] == 8 and a["exact"] == 8
    assert a["sees_alpha_block"], "the positive control: alpha's own arena holds its block"

    # Same namespace, same keys: beta sees nothing of alpha's, cannot read it
    # and its mapping does not hold it.
    b = client(d, BETA, "get", pattern=1)
    assert "error" not in b, b
    assert b["arena_bytes"] == 24 * MiB
    assert b["prefix"] == 0 and b["exact"] == 0
    assert not b["sees_alpha_block"], "beta's arena must not hold alpha's bytes"
    assert b["fingerprint"] != a["fingerprint"], "the namespace is scoped by the tenant"

    # Beta writes the same keys: its own blocks, alpha's stay as they were.
    b = client(d, BETA, "put", pattern=2)
    assert b["prefix"] == 8 and b["exact"] == 8
    a = client(d, ALPHA, "get", pattern=1)
    assert a["prefix"] == 8 and a["exact"] == 8, "beta's put must not overwrite alpha's blocks"

    # Beta erases the keys: its own go, alpha's stay.
    b = client(d, BETA, "erase", pattern=2)
    assert b["erased"] == 8 and b["prefix"] == 0
    a = client(d, ALPHA, "get", pattern=1)
    assert a["exact"] == 8, "beta's erase must not reach alpha's blocks"


def test_strangers_are_refused_and_models_are_enforced(tenancy):
    d = tenancy
    s = client(d, STRANGER, "get")
    assert s.get("error", "").startswith("PermissionDeniedError"), s
    assert "no tenant" in s["error"]
    r = cli(d, STRANGER, "stats")
    assert r.returncode != 0 and "no tenant" in (r.stdout + r.stderr), r
    b = client(d, BETA, "get", model="other/model")
    assert b.get("error", "").startswith("PermissionDeniedError") and "may not cache model" in b["error"], b
    # The daemon kept serving the others.
    assert "error" not in client(d, ALPHA, "get")


def test_a_tenant_cannot_list_or_drop_another_tenants_namespace(tenancy):
    d = tenancy
    a = client(d, ALPHA, "put", pattern=1)
    client(d, BETA, "put", pattern=2)

    mine = cli(d, BETA, "ls", "--json")
    assert mine.returncode == 0, mine.stderr
    listed = json.loads(mine.stdout)
    fingerprints = {n["fingerprint"] for n in listed["namespaces"]} if isinstance(listed, dict) else \
        {n["fingerprint"] for n in listed}
    assert a["fingerprint"] not in fingerprints and len(fingerprints) == 1

    r = cli(d, BETA, "drop", "--ns", a["fingerprint"])
    assert client(d, ALPHA, "get", pattern=1)["exact"] == 8, "beta's drop must not reach alpha's namespace"

    # Pins: beta cannot hold alpha's blocks; the operator can.
    pin = ["pin", "--ns", a["fingerprint"], "--key", a["keys"][0], "--ttl", "10m"]
    r = cli(d, BETA, *pin)
    assert r.returncode == 1, (r.stdout, r.stderr)
    r = cli(d, None, *pin)
    assert r.returncode == 0 and "held" in r.stdout, (r.stdout, r.stderr)
    r = cli(d, None, "unpin", "--ns", a["fingerprint"], "--key", a["keys"][0])
    assert r.returncode == 0, (r.stdout, r.stderr)

    # The operator (root: the daemon's uid, no tenant's) sees and drops both.
    everyone = cli(d, None, "ls", "--json")
    assert everyone.returncode == 0, everyone.stderr
    assert a["fingerprint"] in everyone.stdout and '"alpha"' in everyone.stdout and '"beta"' in everyone.stdout
    r = cli(d, None, "drop", "--model", "test/model")
    assert r.returncode == 0, r.stderr
    assert client(d, ALPHA, "get", pattern=1)["prefix"] == 0
    assert client(d, BETA, "get", pattern=2)["prefix"] == 0


def test_shared_nvme_keeps_tenants_apart_and_counts_quotas_per_tenant(make_daemon):
    # tenant_series: the operator opted in to per-tenant series without a token.
    d = make_tenancy(make_daemon, metrics_extra="tenant_series = true\n")
    # 5000 blocks of 4 KiB (about 20 MiB) through alpha's 16 MiB arena: the
    # oldest go down to the shared NVMe tier, more than its 2 MiB quota.
    a = client(d, ALPHA, "put", pattern=1, n=5000)
    assert "error" not in a, a
    b = client(d, BETA, "get", pattern=1, n=5000)
    assert b["prefix"] == 0 and b["exact"] == 0, "beta must not see alpha's blocks on the shared tier either"

    _, samples = scrape(metrics_url(d))

    def sample(name, **labels):
        return samples.get((name, frozenset(labels.items())))

    assert sample("kvtier_tier_used_bytes", tier="host", tenant="alpha") > 0
    assert sample("kvtier_tier_used_bytes", tier="host", tenant="beta") == 0
    assert sample("kvtier_nvme_quota_bytes", tenant="alpha") == 2 * MiB
    assert sample("kvtier_nvme_quota_refusals_total", tenant="alpha") > 0, \
        "20 MiB through a 16 MiB arena must push alpha past its 2 MiB NVMe quota"
    assert sample("kvtier_server_connections_refused_total") is not None
    # Use per namespace, within its tenant.
    alpha_ns = {labels: v for (name, labels), v in samples.items()
                if name == "kvtier_namespace_bytes" and ("ns", a["fingerprint"][:16]) in labels}
    assert alpha_ns, "no namespace.bytes series for alpha's namespace"
    host = [v for labels, v in alpha_ns.items() if ("tier", "host") in labels]
    assert host and host[0] > 0
    assert all(("tenant", "alpha") in labels and ("model", "test/model") in labels for labels in alpha_ns)


# The labels that name a tenant or a namespace, or carry a client's text.
CLIENT_LABELS = {"tenant", "ns", "model", "revision", "adapter"}
ALPHA_MODEL = "alpha/private-model"


def scrape_text(url, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def put_as_alpha_and_beta(d):
    """Alpha caches ALPHA_MODEL, beta test/model: each tenant has namespace series."""
    a = client(d, ALPHA, "put", model=ALPHA_MODEL, pattern=1)
    b = client(d, BETA, "put", pattern=2)
    assert "error" not in a and "error" not in b, (a, b)
    return a, b


def client_series(samples):
    return [k for k in samples if any(label in CLIENT_LABELS for label, _ in k[1])]


def test_without_a_token_a_scrape_shows_no_tenants_series_or_model_ids(tenancy):
    d = tenancy
    a, b = put_as_alpha_and_beta(d)
    text = scrape_text(metrics_url(d))
    _, samples = parse(text)
    assert ALPHA_MODEL not in text and "test/model" not in text, "a scrape anyone can make names no tenant's model"
    assert a["fingerprint"][:16] not in text and b["fingerprint"][:16] not in text
    assert client_series(samples) == [], client_series(samples)[:5]
    assert ("kvtier_server_connections_open", frozenset()) in samples, "daemon-wide series are still served"
    assert any(name == "kvtier_build_info" for name, _ in samples)
    # The operator's stats over the socket still have every tenant's series.
    r = cli(d, None, "stats")
    assert r.returncode == 0, r.stderr
    assert 'tenant="alpha"' in r.stdout and 'tenant="beta"' in r.stdout and ALPHA_MODEL in r.stdout


def test_a_bearer_token_guards_the_endpoint_and_shows_every_series(make_daemon, tmp_path):
    token = "kvtier-metrics-test-token-0123456789abcdef"
    token_file = tmp_path / "metrics.token"
    token_file.write_text(token + "\n")
    os.chmod(token_file, 0o600)
    d = make_tenancy(make_daemon, metrics_extra=f'bearer_token_file = "{token_file}"\n')
    a, _ = put_as_alpha_and_beta(d)
    url = metrics_url(d)
    for presented in (None, token[:-1], token + "x", ""):
        with pytest.raises(urllib.error.HTTPError) as e:
            scrape_text(url, presented)
        assert e.value.code == 401, presented
        assert e.value.headers["WWW-Authenticate"].startswith("Bearer")
        assert ALPHA_MODEL not in e.value.read().decode()
    with urllib.request.urlopen(url[: -len("/metrics")] + "/healthz", timeout=10) as r:
        assert r.read() == b"ok\n", "liveness needs no token"
    text = scrape_text(url, token)
    _, samples = parse(text)
    models = {dict(labels).get("model") for name, labels in samples if name == "kvtier_namespace_bytes"}
    assert {ALPHA_MODEL, "test/model"} <= models, models
    assert ("kvtier_tier_used_bytes", frozenset({"tier": "host", "tenant": "alpha"}.items())) in samples
    assert ("kvtier_tier_used_bytes", frozenset({"tier": "host", "tenant": "beta"}.items())) in samples
    assert any(("ns", a["fingerprint"][:16]) in labels for _, labels in samples)


def test_a_tenant_at_its_limit_cannot_keep_another_from_connecting(make_daemon):
    # 16 slots, half kept in parts of 2 for alpha, beta and the operator, 10 shared.
    d = make_tenancy(make_daemon, server_extra="max_connections = 16\nfirst_request_timeout_ms = 60000\n")
    alpha = Holder(d, ALPHA, 40)
    b = client(d, BETA, "get")
    assert "error" not in b, f"beta must connect while alpha holds all it may: {b}"
    seen = alpha.seen()
    assert seen.count("open") == 12, f"alpha holds its part and the shared slots: {seen}"
    refused = [s for s in seen if s != "open"]
    assert all("tenant alpha holds its part" in s for s in refused), refused


def test_a_strangers_connections_are_refused_at_accept_and_take_no_slot(make_daemon):
    d = make_tenancy(make_daemon, server_extra="max_connections = 16\n")
    stranger = Holder(d, STRANGER, 40)  # more than all the slots, never sending a request
    a = client(d, ALPHA, "get")
    assert "error" not in a, f"a tenant must connect while a stranger holds connections: {a}"
    seen = stranger.seen()
    assert all("no tenant" in s for s in seen), \
        f"each stranger's connection is answered PermissionDenied and closed at once: {seen}"


def test_a_tenants_config_get_shows_its_own_tenant_only(tenancy):
    d = tenancy
    mine = cli(d, BETA, "config", "get")
    assert mine.returncode == 0, mine.stderr
    assert 'name = "beta"' in mine.stdout and f"uids = [{BETA}]" in mine.stdout, mine.stdout
    assert '"alpha"' not in mine.stdout and str(ALPHA) not in mine.stdout, \
        f"beta must not see alpha's table: {mine.stdout}"
    assert ".tenant-key" not in mine.stdout, "the tenant key's path is the operator's"
    everyone = cli(d, None, "config", "get")
    assert everyone.returncode == 0, everyone.stderr
    assert 'name = "alpha"' in everyone.stdout and 'name = "beta"' in everyone.stdout
