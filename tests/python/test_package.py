"""The installable package: `pip install --no-index <repo>/python` into a
fresh venv of another CPython than the one the suite runs on builds kvtier
for that interpreter with the in-tree backend (python/_build_backend), and
the installed package works against a real kvtierd without PYTHONPATH or
LD_LIBRARY_PATH.

The build goes to $KVTIER_PACKAGE_BUILD_DIR (ctest: a folder of the build
tree, kept, so a rerun only relinks) or else a temporary folder; the venv is
always temporary and removed.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from conftest import SOURCE_DIR

# The interpreters tried, in order; the first that exists and is not the
# suite's own is used.
CANDIDATES = [f"/root/.pyenv/versions/{v}/bin/python" for v in ("3.12.1", "3.10.13", "3.13.0")]


def other_interpreter():
    """(path, "X.Y") of an interpreter other than this one, or None."""
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for path in CANDIDATES:
        if not os.access(path, os.X_OK):
            continue
        version = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        if version != ours:
            return path, version
    return None


def clean_env(**extra):
    """The environment of a venv child: nothing that would point it at the
    build tree's package or libraries, and no bytecode in the source tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def project_version():
    return re.search(r"project\(kvtier VERSION ([0-9.]+)", (SOURCE_DIR / "CMakeLists.txt").read_text()).group(1)


@pytest.fixture(scope="module")
def interpreter():
    """(path, "X.Y") of the other interpreter, or skip."""
    found = other_interpreter()
    if found is None:
        pytest.skip(f"no interpreter other than Python {sys.version_info[0]}.{sys.version_info[1]} "
                    f"among {', '.join(CANDIDATES)}")
    return found


@pytest.fixture(scope="module")
def package_build_dir():
    """The backend's build folder ($KVTIER_BUILD_DIR) for this module's
    builds: one folder, so the second build of the same interpreter only
    relinks."""
    if os.environ.get("KVTIER_PACKAGE_BUILD_DIR"):
        yield os.environ["KVTIER_PACKAGE_BUILD_DIR"]
        return
    root = tempfile.mkdtemp(prefix="kvtier-pkg-build-")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def venv(interpreter, package_build_dir):
    interpreter, version = interpreter
    root = Path(tempfile.mkdtemp(prefix="kvtier-pkg-"))
    try:
        subprocess.run([interpreter, "-m", "venv", str(root / "venv")], check=True, env=clean_env())
        python = root / "venv" / "bin" / "python"
        started = time.monotonic()
        pip = subprocess.run([str(python), "-m", "pip", "install", "--no-index", str(SOURCE_DIR / "python")],
                             capture_output=True, text=True, cwd=root,
                             env=clean_env(KVTIER_BUILD_DIR=package_build_dir))
        seconds = time.monotonic() - started
        assert pip.returncode == 0, f"pip install failed:\n{pip.stdout}\n{pip.stderr}"
        print(f"pip install into a Python {version} venv took {seconds:.0f} s (build in {package_build_dir})")
        yield python, version
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_in(python, code, *args):
    return subprocess.run([str(python), "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, env=clean_env(), timeout=120)


def test_installed_package_round_trips_a_block(venv, daemon):
    python, version = venv
    out = run_in(python, """
        import os, sys
        import kvtier
        ns = kvtier.Namespace(model_id="test/model", model_revision="rev-1", kv_dtype="fp32",
                              block_tokens=16, layer_count=4, bytes_per_token_per_layer=64)
        keys = kvtier.ChainHasher(ns).keys(list(range(32)))
        data = bytes((i * 7 + 3) % 256 for i in range(ns.block_bytes))
        with kvtier.Client(sys.argv[1], [ns]) as client:
            client.put(0, keys[0], data)
            out = bytearray(ns.block_bytes)
            assert client.get(0, keys[0], out) == ns.block_bytes
            assert bytes(out) == data, "the block came back different"
            assert client.lookup(0, keys).prefix_blocks == 1
        print("version", kvtier.__version__)
        print("python", "%d.%d" % sys.version_info[:2])
        print("file", kvtier.__file__)
        """, daemon.socket_path)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["version"] == project_version()
    assert lines["python"] == version
    assert Path(lines["file"]).is_relative_to(python.parents[1]), "kvtier was not imported from the venv"


def test_installed_package_carries_its_libraries(venv):
    """The extension finds libkvtier_client beside itself ($ORIGIN), not in
    the build tree."""
    python, _ = venv
    out = run_in(python, """
        import kvtier, kvtier._kvtier
        maps = open("/proc/self/maps").read()
        print("\\n".join(sorted({l.split()[-1] for l in maps.splitlines() if "libkvtier" in l})))
        """)
    assert out.returncode == 0, out.stderr
    package = python.parents[1]
    libraries = out.stdout.split()
    assert any("libkvtier_client" in lib for lib in libraries), libraries
    for lib in libraries:
        assert Path(lib).is_relative_to(package), f"{lib} was loaded from outside the venv"


def fake_engines(folder, **versions):
    """Engines as importlib.metadata sees them (a dist-info each in
    `folder`, to put on PYTHONPATH), without installing them."""
    for name, engine_version in versions.items():
        info = folder / f"{name}-{engine_version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {engine_version}\n")


# Debian's python3-build (0.9.0) and what it imports, all pure Python.
BUILD_FRONTEND = ("build", "pep517", "packaging", "tomli")
DEBIAN_SITE = Path("/usr/lib/python3/dist-packages")


def test_build_frontend_wheel_installs(interpreter, package_build_dir, tmp_path):
    """`python3 -m build --no-isolation --wheel` (PEP 517 frontend, Debian's
    python3-build) writes a wheel with the in-tree backend, and that wheel
    installs offline into a fresh venv and runs. The frontend runs under
    the other interpreter (a wheel is for the interpreter that built it):
    it is Debian's package, put on that interpreter's path, as a venv with
    `pip install build` would have it. Shares the venv test's build folder,
    so after it only a relink."""
    python, version = interpreter
    missing = [m for m in BUILD_FRONTEND if not (DEBIAN_SITE / m).is_dir()]
    if missing:
        pytest.skip(f"python3-build is not installed (no {', '.join(missing)} in {DEBIAN_SITE}; "
                    "scripts/install-deps.sh installs it)")
    frontend = tmp_path / "frontend"
    frontend.mkdir()
    for module in BUILD_FRONTEND:
        (frontend / module).symlink_to(DEBIAN_SITE / module)
    dist = tmp_path / "dist"
    started = time.monotonic()
    built = subprocess.run([python, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(dist),
                            str(SOURCE_DIR / "python")], capture_output=True, text=True, cwd=tmp_path,
                           env=clean_env(PYTHONPATH=str(frontend), KVTIER_BUILD_DIR=package_build_dir),
                           timeout=600)
    assert built.returncode == 0, f"python -m build failed:\n{built.stdout}\n{built.stderr}"
    print(f"python -m build --wheel (Python {version}) took {time.monotonic() - started:.0f} s")
    tag = "cp" + version.replace(".", "")
    wheels = sorted(dist.glob("*.whl"))
    assert [w.name for w in wheels] == [f"kvtier-{project_version()}-{tag}-{tag}-linux_{os.uname().machine}.whl"]
    assert not (SOURCE_DIR / "python" / "build").exists(), "the build left a build/ folder in python/"

    subprocess.run([python, "-m", "venv", str(tmp_path / "venv")], check=True, env=clean_env())
    venv_python = tmp_path / "venv" / "bin" / "python"
    pip = subprocess.run([str(venv_python), "-m", "pip", "install", "--no-index", str(wheels[0])],
                         capture_output=True, text=True, cwd=tmp_path, env=clean_env(), timeout=300)
    assert pip.returncode == 0, f"pip install of the wheel failed:\n{pip.stdout}\n{pip.stderr}"
    out = run_in(venv_python, """
        import sys, kvtier, kvtier._kvtier
        print(kvtier.__version__, "%d.%d" % sys.version_info[:2], kvtier.__file__)
        """)
    assert out.returncode == 0, out.stderr
    got_version, got_python, got_file = out.stdout.split()
    assert (got_version, got_python) == (project_version(), version)
    assert Path(got_file).is_relative_to(tmp_path / "venv"), "kvtier was not imported from the venv"
    help_ = subprocess.run([str(venv_python), "-m", "kvtier", "--help"], capture_output=True, text=True,
                           env=clean_env(), timeout=60)
    assert help_.returncode == 0 and "doctor" in help_.stdout, help_.stdout + help_.stderr
    # No daemon at that socket: the doctor runs, says so and exits 1.
    out = doctor(venv_python, "--socket", tmp_path / "none.sock")
    assert out.returncode == 1 and out.stdout.splitlines()[-1] == "1 problem(s)", out.stdout + out.stderr


def doctor(python, *args, **env):
    return subprocess.run([str(python), "-m", "kvtier", "doctor", *map(str, args)],
                          capture_output=True, text=True, env=clean_env(**env), timeout=120)


def test_doctor_all_well(venv, daemon, tmp_path):
    python, version = venv
    fake_engines(tmp_path, vllm="0.27.1", sglang="0.5.10")
    out = doctor(python, "--socket", daemon.socket_path, PYTHONPATH=str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"kvtier {project_version()} at {python.parents[1]}"), lines[0]
    assert f"Python {version}." in lines[0]
    assert f"kvtierd: {daemon.socket_path}" in lines
    # The daemon's version and health, through the binding's Client.health.
    assert any(re.fullmatch(rf"  version: {re.escape(project_version())}, up \d+ s, healthy", l) for l in lines), lines
    assert "  tier host: 0 B used of 64.0 MiB" in lines
    assert any(l.startswith("vLLM: 0.27.1, supported: 5-D KV caches") for l in lines), lines
    assert any(l.startswith("SGLang: 0.5.10, supported: v1 + v2 hybrid") for l in lines), lines
    assert not any(l.startswith("problem:") for l in lines), lines
    assert lines[-1] == "all well"


def test_doctor_without_engines_or_daemon(venv, tmp_path):
    """A socket file with no daemon behind it: exit 1, one line saying so;
    engines that are not installed are no problem."""
    python, _ = venv
    path = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # closed without listening: connecting is refused
    out = doctor(python, "--socket", path)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "vLLM: not installed" in lines and "SGLang: not installed" in lines
    problems = [l for l in lines if l.startswith("problem:")]
    assert len(problems) == 1 and problems[0].startswith(f"problem: kvtierd unreachable at {path}: unavailable: "), lines
    assert lines[-1] == "1 problem(s)"


def test_doctor_engine_versions():
    """The support table, in the suite's own interpreter."""
    from kvtier import doctor as d
    assert d.engine_support("vllm", "0.29.0") == (True, d.ENGINE_SUPPORT["vllm"][0][1])
    assert d.engine_support("vllm", "0.28.0rc1")[0] and "4-D" in d.engine_support("vllm", "0.28.0rc1")[1]
    assert "kv_layout" in d.engine_support("vllm", "0.10.1.1")[1]
    # SGLang: 0.5.6 (the dynamic backend's interface_v1 switch) is the least
    # release served, v1 only; 0.5.10 (the hybrid cache controller) adds v2.
    for version in ("0.4.9", "0.5.3", "0.5.5", "0.5.5.post3"):
        supported, note = d.engine_support("sglang", version)
        assert not supported and "0.5.6" in note, (version, note)
    for version in ("0.5.6", "0.5.6.post2", "0.5.9"):
        assert d.engine_support("sglang", version) == (True, d.ENGINE_SUPPORT["sglang"][1][1]), version
        assert d.engine_support("sglang", version)[1].startswith("v1 only")
    for version in ("0.5.10rc0", "0.5.10", "0.5.19", "0.6.0"):
        assert d.engine_support("sglang", version) == (True, d.ENGINE_SUPPORT["sglang"][0][1]), version
        assert d.engine_support("sglang", version)[1].startswith("v1 + v2")


@pytest.mark.parametrize("sglang, supported", [("0.5.5.post3", False), ("0.5.6", True)])
def test_doctor_sglang_version_sets_exit_code(daemon, tmp_path, sglang, supported):
    """An SGLang below the least release served is a problem (exit 1); one
    in range is not (exit 0). The suite's own interpreter and build, with a
    healthy daemon, so the SGLang version is the only thing that differs."""
    fake_engines(tmp_path, sglang=sglang)
    pythonpath = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-m", "kvtier", "doctor", "--socket", daemon.socket_path],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1"})
    lines = out.stdout.splitlines()
    if supported:
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"SGLang: {sglang}, supported: v1 only: KV pages through batch_get_v1/batch_set_v1 " \
               "(dynamic backend, interface_v1 1); no hybrid cache controller, so kvtier's v2 half is never called" \
               in lines, lines
        assert lines[-1] == "all well"
    else:
        assert out.returncode == 1, out.stdout + out.stderr
        assert any(l.startswith(f"SGLang: {sglang}, NOT supported: before 0.5.6") for l in lines), lines
        from kvtier import doctor as d
        problems = [l for l in lines if l.startswith("problem:")]
        assert problems == [f"problem: SGLang {sglang} is not supported: {d.ENGINE_UNSUPPORTED['sglang']}"], lines
        assert lines[-1] == "1 problem(s)"
