"""The PEP 517 build backend of the kvtier Python package, with no dependencies.

`pip install ./python` runs it with the interpreter of the target venv. It
configures the repository (the parent of python/) with CMake in a private
build directory keyed by that interpreter, builds only the extension
`kvtier._kvtier` and what it links (libkvtier_client, libkvtier_proto), and
writes a wheel with zipfile: the pure-Python package as CMake assembled it,
the extension, and the two shared libraries beside it. Every one of them
carries the RUNPATH $ORIGIN, so the installed package needs no
LD_LIBRARY_PATH; system libraries (protobuf, xxhash, the CUDA runtime when
the client is built with CUDA) come from the machine, so a wheel is for
the machine (or image) it was built on: its platform tag is the plain
linux_<arch>, not manylinux.

Where it builds: $KVTIER_BUILD_DIR if set, else ~/.cache/kvtier/build
($XDG_CACHE_HOME), in a folder per interpreter and source tree, kept so a
reinstall only relinks. Extra CMake arguments: $KVTIER_CMAKE_ARGS (split
like a shell would), e.g. "-DKVTIER_CUDA=OFF". Parallel jobs:
$CMAKE_BUILD_PARALLEL_LEVEL, else the number of CPUs.

Hooks: build_wheel, build_sdist (the source tree the build needs, under
_source/, so a wheel can be built from the sdist alone),
get_requires_for_build_wheel/_sdist (none), prepare_metadata_for_build_wheel.
"""

import base64
import fcntl
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # python/ (or the sdist's root)
_NAME = "kvtier"
_TARGET = "kvtier_python"
# The shared libraries the extension links, as <build>/<path>, shipped under
# their SONAMEs beside it.
_SHARED_LIBS = ("client_lib/libkvtier_client.so.0", "proto/libkvtier_proto.so")
# What an sdist carries of the repository: the folders the top CMakeLists.txt
# adds (tests/ only when BUILD_TESTING, which the backend turns off).
_SDIST_TOP = ("CMakeLists.txt", "CMakePresets.json", "include", "common", "proto", "gpu", "policy",
              "tiers", "daemon", "client_lib", "tools", "python")


def _log(message):
    print(f"kvtier build: {message}", file=sys.stderr, flush=True)


def _source_root():
    """The repository to build: the parent of python/ in a checkout, or
    _source/ in an sdist; $KVTIER_SOURCE_DIR overrides both."""
    candidates = []
    if os.environ.get("KVTIER_SOURCE_DIR"):
        candidates.append(Path(os.environ["KVTIER_SOURCE_DIR"]))
    candidates += [_PACKAGE_DIR.parent, _PACKAGE_DIR / "_source"]
    for root in candidates:
        top = root / "CMakeLists.txt"
        if (top.is_file() and "project(kvtier" in top.read_text()
                and (root / "python" / "src" / "module.cc").is_file()):
            return root.resolve()
    raise RuntimeError(
        "kvtier: cannot find the kvtier source tree (tried " + ", ".join(map(str, candidates)) +
        "). Build from the repository (pip install <repo>/python) or set KVTIER_SOURCE_DIR.")


def _version():
    """kvtier.__version__, which must match the CMake project version."""
    text = (_PACKAGE_DIR / "kvtier" / "__init__.py").read_text()
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M)
    if not match:
        raise RuntimeError("kvtier: python/kvtier/__init__.py has no __version__")
    try:
        top = _source_root() / "CMakeLists.txt"
    except RuntimeError:
        return match.group(1)  # the source tree is checked where it is needed
    project = re.search(r"project\(kvtier VERSION ([0-9.]+)", top.read_text())
    if project and project.group(1) != match.group(1):
        raise RuntimeError(f"kvtier: __version__ {match.group(1)} differs from the CMake project "
                           f"version {project.group(1)} ({top})")
    return match.group(1)


def _tag():
    """The wheel tag of this interpreter, e.g. cp312-cp312-linux_x86_64."""
    if sys.implementation.name != "cpython":
        raise RuntimeError(f"kvtier: the binding is built for CPython only, not {sys.implementation.name}")
    python = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    abi = python + getattr(sys, "abiflags", "")
    platform = re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())
    return f"{python}-{abi}-{platform}"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {_NAME}\nVersion: {_version()}\n"
            "Summary: Python client of kvtierd, the node-local hierarchical KV-cache service for LLM inference\n"
            "Requires-Python: >=3.9\n")


def _wheel_file():
    return (f"Wheel-Version: 1.0\nGenerator: kvtier_backend\nRoot-Is-Purelib: false\nTag: {_tag()}\n")


def _build_dir(source):
    root = os.environ.get("KVTIER_BUILD_DIR")
    if not root:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        root = os.path.join(cache, "kvtier", "build")
    # Other CMake arguments configure another build (a kept folder is not
    # configured again).
    extra = os.environ.get("KVTIER_CMAKE_ARGS", "")
    key = hashlib.sha256(f"{sys.base_prefix}\0{sys.version}\0{source}".encode() +
                         (f"\0{extra}".encode() if extra else b"")).hexdigest()[:12]
    return Path(root) / f"{sys.implementation.cache_tag}-{key}"


def _base_interpreter():
    """The interpreter a venv was made from (same headers and ABI): the kept
    build folder is shared by its venvs and must not name one that may be
    deleted."""
    candidate = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return str(candidate) if os.access(candidate, os.X_OK) else sys.executable


def _run(command, cwd=None):
    _log("$ " + " ".join(shlex.quote(str(c)) for c in command))
    subprocess.run([str(c) for c in command], cwd=cwd, check=True, stdout=sys.stderr)


def _cmake_build(source):
    """Configures (once) and builds the extension; returns the build dir."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("kvtier: cmake is not on PATH (scripts/install-deps.sh installs it)")
    build = _build_dir(source)
    build.mkdir(parents=True, exist_ok=True)
    with open(build / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per folder at a time
        python = _base_interpreter()
        cache = build / "CMakeCache.txt"
        if not cache.is_file() or f"KVTIER_PYTHON:FILEPATH={python}\n" not in cache.read_text():
            configure = [cmake, "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                         "-DBUILD_TESTING=OFF", f"-DKVTIER_PYTHON={python}",
                         "-DKVTIER_PYTHON_MODULE=ON",
                         # Every library finds its neighbours beside itself, and
                         # system ones where it was linked against them.
                         "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",
                         "-DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON"]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            if shutil.which("ccache"):
                configure += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
            configure += shlex.split(os.environ.get("KVTIER_CMAKE_ARGS", ""))
            try:
                _run(configure)
            except subprocess.CalledProcessError:
                cache.unlink(missing_ok=True)  # configure again next time
                raise
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        started = time.monotonic()
        _run([cmake, "--build", build, "--target", _TARGET, "-j", jobs])
        _log(f"built in {time.monotonic() - started:.0f} s in {build}")
    return build


def _package_files(source, build):
    """(path in the wheel, file on disk) of the package: its Python and JSON
    files from the source tree (what python/CMakeLists.txt copies; read
    from the source so a file deleted there is not shipped from an old
    build), the extension and the shared libraries from the build."""
    package = source / "python" / _NAME
    files = []
    for path in sorted(package.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
            files.append((f"{_NAME}/{path.relative_to(package).as_posix()}", path))
    extensions = sorted((build / "python" / _NAME).glob("_kvtier.*.so"))
    if not extensions:
        raise RuntimeError(f"kvtier: the build left no extension in {build / 'python' / _NAME}")
    files.append((f"{_NAME}/{extensions[-1].name}", extensions[-1]))
    for lib in _SHARED_LIBS:
        files.append((f"{_NAME}/{Path(lib).name}", (build / lib).resolve()))
    return files


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _dist_info():
    return f"{_NAME}-{_version()}.dist-info"


def _write_dist_info(directory):
    info = Path(directory) / _dist_info()
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(_metadata())
    (info / "WHEEL").write_text(_wheel_file())
    (info / "top_level.txt").write_text(f"{_NAME}\n")
    return info.name


def _write_wheel(wheel_directory, files):
    name = f"{_NAME}-{_version()}-{_tag()}.whl"
    info = _dist_info()
    entries = list(files) + [(f"{info}/METADATA", _metadata().encode()),
                             (f"{info}/WHEEL", _wheel_file().encode()),
                             (f"{info}/top_level.txt", f"{_NAME}\n".encode())]
    record = []
    target = Path(wheel_directory) / name
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as whl:
        for arcname, content in entries:
            if isinstance(content, Path):
                data = content.read_bytes()
                mode = 0o755 if os.access(content, os.X_OK) else 0o644
            else:
                data, mode = content, 0o644
            zinfo = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            zinfo.external_attr = (0o100000 | mode) << 16
            zinfo.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(zinfo, data)
            record.append(_record_line(arcname, data))
        record.append(f"{info}/RECORD,,")
        whl.writestr(zipfile.ZipInfo(f"{info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)),
                     "\n".join(record) + "\n")
    _log(f"wrote {target}")
    return name


# PEP 517 hooks.

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_dist_info(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    source = _source_root()
    _log(f"building for {sys.executable} (Python {sys.version.split()[0]}) from {source}")
    build = _cmake_build(source)
    return _write_wheel(wheel_directory, _package_files(source, build))


def build_sdist(sdist_directory, config_settings=None):
    """python/ at the root (pyproject.toml, the backend, the package) and the
    parts of the repository the build needs under _source/."""
    source = _source_root()
    base = f"{_NAME}-{_version()}"
    name = f"{base}.tar.gz"

    def skip(info):
        parts = Path(info.name).parts
        if "__pycache__" in parts or info.name.endswith(".pyc") or (len(parts) > 1 and parts[1] == "build"):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for entry in ("pyproject.toml", "_build_backend", "kvtier"):
            tar.add(str(_PACKAGE_DIR / entry), arcname=f"{base}/{entry}", filter=skip)
        for entry in _SDIST_TOP:
            if (source / entry).exists():
                tar.add(str(source / entry), arcname=f"{base}/_source/{entry}", filter=skip)
        pkg_info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        pkg_info.size = len(data)
        tar.addfile(pkg_info, io.BytesIO(data))
    _log(f"wrote {name}")
    return name
