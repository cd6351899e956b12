#!/usr/bin/env bash
# Installs every Debian 12 package that kvtier's build, tests and benchmarks
# need. Idempotent: when everything is present it prints nothing and exits 0.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  ccache  # every build compiles through it (CMakeLists.txt); a fresh clone reuses ~/.cache/ccache
  liburing-dev librocksdb-dev libxxhash-dev xxhash libasio-dev
  libssl-dev  # libcrypto's HMAC-SHA256 authenticates remote-tier values
  libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev libbenchmark-dev
  libtomlplusplus-dev libcli11-dev libspdlog-dev
  redis-server redis-tools fio
  clang libclang-rt-14-dev
  clang-format  # the clang_format test: the sources follow .clang-format
  libzmq3-dev cppzmq-dev  # KV events: ZeroMQ PUB and ROUTER sockets (daemon/events/, `kvtier events`)
  libucx-dev ucx-utils  # the peer tier: UCX one-sided gets between kvtierd nodes; ucx_perftest, its ceiling
  librsvg2-bin  # rsvg-convert: look at `kvtier replay --plot` SVGs as PNG
  # The Python binding (python/) and its tests, for Debian's /usr/bin/python3;
  # torch (CPU) runs the real-model test of the engine connectors.
  python3 python3-dev pybind11-dev python3-numpy python3-pytest python3-xxhash python3-torch
  python3-zmq python3-msgpack  # an independent KV-events subscriber in the tests
  python3-build  # `python3 -m build --no-isolation` writes the wheel and sdist (docs/INTEGRATIONS.md)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
