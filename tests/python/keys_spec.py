"""Block keys v2 (docs/KEYS.md) in plain Python, and the published vectors.

An implementation of docs/KEYS.md written from the document, independent of
the C++ code (common/block_key.cc): the standard library plus the `xxhash`
package (XXH3-128, seed 0). It produces docs/key_vectors.json, and
tests/unit/block_key_test.cc checks the C++ code against the same hex.

    python3 tests/python/keys_spec.py            # writes docs/key_vectors.json
    python3 tests/python/keys_spec.py --xxhsum   # also re-hashes every vector
                                                 # with the xxhsum CLI

A descriptor is a dict with every field of NamespaceDescriptor (see BASE).
Extra keys are lists of (kind, payload) with kind an int (EXTRA_*) and the
payload bytes. Hashes are returned as 32 lower-case hex digits: the canonical
form, high64 big-endian then low64 big-endian (what `xxhsum -H2` prints).
"""

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import xxhash

MAGIC = b"kvtier-ns-v2"

EXTRA_CACHE_SALT = 1
EXTRA_MULTIMODAL = 2
EXTRA_PROMPT_EMBEDS = 3

MAX_EXTRA_KEY_BYTES = 4096     # the salt and each payload
MAX_EXTRA_KEYS_PER_BLOCK = 64  # not counting the salt
MAX_OBJECT_KIND_BYTES = 64


def xxh128_hex(data):
    """XXH3-128, seed 0, canonical hex (high64 BE || low64 BE)."""
    return xxhash.xxh3_128_hexdigest(data)


def xxhsum_hex(data):
    """The same through the xxhsum CLI (`xxhsum -H2`), to cross-check."""
    out = subprocess.run(["xxhsum", "-H2"], input=data, capture_output=True, check=True).stdout
    return out.split()[0].decode()


def _u32(v):
    return struct.pack("<I", v)


def _str(x):
    """str: u32 LE byte length, then the bytes (str is UTF-8 encoded)."""
    b = x.encode("utf-8") if isinstance(x, str) else bytes(x)
    return _u32(len(b)) + b


def validate(d):
    """Raises ValueError naming the first bad field (NamespaceDescriptor::Validate)."""
    for f in ("model_id", "model_revision"):
        if not d[f]:
            raise ValueError(f + " must not be empty")
    if bool(d["adapter_id"]) != bool(d["adapter_revision"]):
        raise ValueError("adapter_revision must be set exactly when adapter_id is")
    if not d["kv_dtype"]:
        raise ValueError("kv_dtype must not be empty")
    for f in ("block_tokens", "layer_count"):
        if d[f] <= 0:
            raise ValueError(f + " must be > 0")
    if not d["kv_layout"]:
        raise ValueError("kv_layout must not be empty")
    if d["bytes_per_token_per_layer"] <= 0:
        raise ValueError("bytes_per_token_per_layer must be > 0")
    if d["block_tokens"] * d["layer_count"] * d["bytes_per_token_per_layer"] >= 2**64:
        raise ValueError("bytes_per_token_per_layer too large")
    for rank, size in (("tp_rank", "tp_size"), ("pp_rank", "pp_size")):
        if d[size] <= 0:
            raise ValueError(size + " must be > 0")
        if d[rank] >= d[size]:
            raise ValueError(rank + " must be < " + size)
    if d["kv_format_version"] <= 0:
        raise ValueError("kv_format_version must be > 0")
    kind = d["object_kind"]
    if not re.fullmatch(r"[a-z0-9_]{1,%d}" % MAX_OBJECT_KIND_BYTES, kind):
        raise ValueError("object_kind must be 1 to 64 bytes of [a-z0-9_]")


def validate_extras(cache_salt=b"", block_extras=None):
    """Raises ValueError unless the extras pass ChainExtras::Validate."""
    if len(cache_salt) > MAX_EXTRA_KEY_BYTES:
        raise ValueError("cache_salt longer than %d bytes" % MAX_EXTRA_KEY_BYTES)
    for i, entries in enumerate(block_extras or []):
        if len(entries) > MAX_EXTRA_KEYS_PER_BLOCK:
            raise ValueError("block %d: more than %d extra keys" % (i, MAX_EXTRA_KEYS_PER_BLOCK))
        for kind, payload in entries:
            if kind not in (EXTRA_MULTIMODAL, EXTRA_PROMPT_EMBEDS):
                raise ValueError("block %d: kind %d is not 2 or 3" % (i, kind))
            if not 0 < len(payload) <= MAX_EXTRA_KEY_BYTES:
                raise ValueError("block %d: payload of %d bytes" % (i, len(payload)))


def ns_bytes(d):
    """The canonical namespace bytes (KEYS.md section 2)."""
    out = MAGIC + _str(d["model_id"]) + _str(d["model_revision"])
    if d["adapter_id"]:
        out += b"\x01" + _str(d["adapter_id"]) + _str(d["adapter_revision"])
    else:
        out += b"\x00"
    out += _str(d["kv_dtype"]) + struct.pack("<II", d["block_tokens"], d["layer_count"])
    out += _str(d["kv_layout"])
    out += struct.pack("<QII", d["bytes_per_token_per_layer"], d["tp_rank"], d["tp_size"])
    out += struct.pack("<III", d["pp_rank"], d["pp_size"], d["kv_format_version"])
    out += _str(d["object_kind"])
    return out


def fingerprint(d, hash_hex=xxh128_hex):
    validate(d)
    return hash_hex(ns_bytes(d))


def extras_bytes(entries):
    """extras(i) of KEYS.md section 3: empty, or u32 count then u8 kind || str payload."""
    if not entries:
        return b""
    out = _u32(len(entries))
    for kind, payload in entries:
        out += struct.pack("<B", kind) + _str(payload)
    return out


def link_bytes(prev_hex, position, block_tokens, entries=()):
    """The bytes hashed into k[position]."""
    return (bytes.fromhex(prev_hex) + _u32(position)
            + struct.pack("<%dI" % len(block_tokens), *block_tokens) + extras_bytes(entries))


def block_entries(i, cache_salt=b"", block_extras=None):
    """Block i's extra keys as hashed: the salt first (block 0 only), then its own."""
    entries = []
    if i == 0 and cache_salt:
        entries.append((EXTRA_CACHE_SALT, cache_salt))
    if block_extras and i < len(block_extras):
        entries.extend(block_extras[i])
    return entries


def chain(d, tokens, cache_salt=b"", block_extras=None, hash_hex=xxh128_hex):
    """(fingerprint, [k[0], k[1], ...]) of every full block of `tokens`."""
    validate_extras(cache_salt, block_extras)
    b = d["block_tokens"]
    prev = fp = fingerprint(d, hash_hex)
    keys = []
    for i in range(len(tokens) // b):  # full blocks only
        prev = hash_hex(link_bytes(prev, i, tokens[i * b:(i + 1) * b],
                                   block_entries(i, cache_salt, block_extras)))
        keys.append(prev)
    return fp, keys


# ---------------------------------------------------------------------------
# The published vectors (KEYS.md section 4)

BASE = dict(
    model_id="meta-llama/Llama-3.1-8B-Instruct",
    model_revision="0e9e39f249a16976918f6564b8830bc894c89659",
    adapter_id="", adapter_revision="",
    kv_dtype="bf16", block_tokens=4, layer_count=32, kv_layout="layer_major_kv",
    bytes_per_token_per_layer=4096, tp_rank=0, tp_size=1,
    pp_rank=0, pp_size=1, kv_format_version=1, object_kind="kv",
)

V7_DESCRIPTOR = dict(
    model_id="Qwen/Qwen2.5-7B-Instruct",
    model_revision="a09a35458c702b33eeacc393d103063234e8bc28",
    adapter_id="", adapter_revision="",
    kv_dtype="fp8_e4m3", block_tokens=256, layer_count=28, kv_layout="layer_major_kv",
    bytes_per_token_per_layer=1024, tp_rank=0, tp_size=1,
    pp_rank=0, pp_size=1, kv_format_version=1, object_kind="kv",
)

T12 = [128000, 9906, 11, 1917, 0, 1, 2, 3, 4294967295, 128255, 65536, 256]

# V7's tokens: tokens[i] = (i * multiplier) mod modulus, i = 0 .. n-1.
V7_RECIPE = dict(n=868, multiplier=7919, modulus=128256)

IMAGE_A = b"image:sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
IMAGE_B = b"image:sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"
EMBEDS = b"embeds:xxh3:4a1c7e0f2b9d3856"


def generated_tokens(n, multiplier, modulus):
    return [(i * multiplier) % modulus for i in range(n)]


def tokens_of(v):
    """The token list of a vector (expands V7's recipe)."""
    return v["tokens"] if "tokens" in v else generated_tokens(**v["tokens_recipe"])


def _with(**changes):
    d = dict(BASE)
    d.update(changes)
    return d


# (name, what it shows, descriptor, tokens or None for V7's recipe, salt, block extras)
_CASES = [
    ("V1", "base", BASE, T12, b"", None),
    ("V2", "another model revision: a different chain from block 0",
     _with(model_revision="5206a32e0bd3067aef1ce90f5528ade7d866253f"), T12, b"", None),
    ("V3", "adapter present (compare V1, adapter absent)",
     _with(adapter_id="acme/sql-lora", adapter_revision="v3"), T12, b"", None),
    ("V4", "tensor-parallel rank 0 of 2",
     _with(bytes_per_token_per_layer=2048, tp_rank=0, tp_size=2), T12, b"", None),
    ("V5", "tensor-parallel rank 1 of 2 (differs from V4 only in tp_rank)",
     _with(bytes_per_token_per_layer=2048, tp_rank=1, tp_size=2), T12, b"", None),
    ("V6", "partial trailing block not keyed (equals V1)", BASE, T12 + [42, 43, 44], b"", None),
    ("V7", "block_tokens 256, generated tokens", V7_DESCRIPTOR, None, b"", None),
    ("V8", "pipeline-parallel rank 1 of 2 (the second stage's 16 layers)",
     _with(layer_count=16, pp_rank=1, pp_size=2), T12, b"", None),
    ("V9", "kv_format_version 2", _with(kv_format_version=2), T12, b"", None),
    ("V10", "object_kind recurrent_state", _with(object_kind="recurrent_state"), T12, b"", None),
    ("V11", "cache salt tenant-a", BASE, T12, b"tenant-a", None),
    ("V12", "cache salt tenant-b (differs from V11 from k[0])", BASE, T12, b"tenant-b", None),
    ("V13", "per-block extras: multimodal on block 1, prompt embeds on block 2, no salt",
     BASE, T12, b"", [[], [(EXTRA_MULTIMODAL, IMAGE_A)], [(EXTRA_PROMPT_EMBEDS, EMBEDS)]]),
    ("V14", "salt and two multimodal entries on block 0 (salt first)",
     BASE, T12, b"tenant-a", [[(EXTRA_MULTIMODAL, IMAGE_A), (EXTRA_MULTIMODAL, IMAGE_B)]]),
    ("V15", "V14 with the two multimodal entries swapped",
     BASE, T12, b"tenant-a", [[(EXTRA_MULTIMODAL, IMAGE_B), (EXTRA_MULTIMODAL, IMAGE_A)]]),
]


def vectors(hash_hex=xxh128_hex):
    """Every published vector as a JSON-ready dict (the entries of docs/key_vectors.json)."""
    out = []
    for name, title, d, tokens, salt, extras in _CASES:
        v = dict(name=name, title=title, descriptor=dict(d))
        if tokens is None:
            v["tokens_recipe"] = dict(V7_RECIPE)
        else:
            v["tokens"] = list(tokens)
        v["cache_salt_hex"] = salt.hex()
        v["block_extras"] = [[dict(kind=k, payload_hex=p.hex()) for k, p in entries]
                             for entries in (extras or [])]
        v["fingerprint"], v["keys"] = chain(d, tokens_of(v), salt, extras, hash_hex)
        if name in ("V1", "V7"):
            v["ns_bytes_hex"] = ns_bytes(d).hex()
        out.append(v)
    return out


def document(hash_hex=xxh128_hex):
    return dict(
        spec="docs/KEYS.md",
        magic=MAGIC.decode(),
        hash="XXH3-128, seed 0; hex = high64 big-endian then low64 big-endian (xxhsum -H2)",
        extra_key_kinds=dict(cache_salt=EXTRA_CACHE_SALT, multimodal=EXTRA_MULTIMODAL,
                             prompt_embeds=EXTRA_PROMPT_EMBEDS),
        tokens_recipe="tokens[i] = (i * multiplier) mod modulus for i in 0 .. n-1",
        vectors=vectors(hash_hex),
    )


def dumps(doc):
    """JSON with one line per array of scalars (a raw newline never occurs inside a string)."""
    text = json.dumps(doc, indent=1)
    return re.sub(r"\[\n([^\[\]{}]*?)\n\s*\]",
                  lambda m: "[" + ", ".join(x.strip().rstrip(",") for x in m.group(1).split("\n")) + "]",
                  text)


def main(argv):
    root = Path(__file__).resolve().parents[2]
    doc = document()
    if "--xxhsum" in argv:
        if document(xxhsum_hex) != doc:
            sys.exit("the xxhsum CLI disagrees with the xxhash module")
        print("xxhsum CLI agrees on every vector")
    path = root / "docs" / "key_vectors.json"
    text = dumps(doc)
    assert json.loads(text) == doc
    path.write_text(text + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1:])
