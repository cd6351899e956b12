"""Key conformance: an independent pure-Python implementation of docs/KEYS.md
(keys_spec.py) and the binding (the C++ library) both reproduce every
published vector of docs/key_vectors.json, which the doc itself shows."""

import json
import os
from pathlib import Path

import pytest

import keys_spec
import kvtier

SOURCE = Path(os.environ.get("KVTIER_SOURCE_DIR", Path(__file__).resolve().parents[2]))
PUBLISHED = json.loads((SOURCE / "docs" / "key_vectors.json").read_text())
VECTORS = PUBLISHED["vectors"]
KIND = {1: kvtier.ExtraKind.CACHE_SALT, 2: kvtier.ExtraKind.MULTIMODAL, 3: kvtier.ExtraKind.PROMPT_EMBEDS}


def inputs(v):
    salt = bytes.fromhex(v["cache_salt_hex"])
    extras = [[(e["kind"], bytes.fromhex(e["payload_hex"])) for e in block] for block in v["block_extras"]]
    return keys_spec.tokens_of(v), salt, extras


def binding_chain(v):
    ns = kvtier.Namespace(**v["descriptor"])
    tokens, salt, extras = inputs(v)
    keys = kvtier.ChainHasher(ns).keys(tokens, cache_salt=salt or None,
                                       extras=[[(KIND[k], p) for k, p in b] for b in extras] or None)
    return ns, [k.hex() for k in keys]


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_pure_python_reproduces_the_vector(v):
    tokens, salt, extras = inputs(v)
    fp, keys = keys_spec.chain(v["descriptor"], tokens, salt, extras or None)
    assert (fp, keys) == (v["fingerprint"], v["keys"])
    if "ns_bytes_hex" in v:
        assert keys_spec.ns_bytes(v["descriptor"]).hex() == v["ns_bytes_hex"]


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_binding_reproduces_the_vector(v):
    ns, keys = binding_chain(v)
    assert ns.fingerprint().hex() == v["fingerprint"]
    assert keys == v["keys"]
    if "ns_bytes_hex" in v:
        assert ns.canonical_bytes().hex() == v["ns_bytes_hex"]
    # Incremental keys equal the whole chain.
    tokens, salt, extras = inputs(v)
    if keys:
        h = kvtier.ChainHasher(ns)
        ex = [[(KIND[k], p) for k, p in b] for b in extras] or None
        first = h.keys(tokens[:ns.block_tokens], cache_salt=salt or None, extras=ex)
        assert [k.hex() for k in h.extend(tokens, first, cache_salt=salt or None, extras=ex)] == keys


def test_the_json_is_what_the_spec_script_writes():
    assert keys_spec.vectors() == VECTORS


def test_the_doc_shows_every_published_key():
    doc = (SOURCE / "docs" / "KEYS.md").read_text()
    missing = [(v["name"], h) for v in VECTORS for h in [v["fingerprint"], *v["keys"]] if h not in doc]
    assert not missing


def test_salt_and_extras_change_the_chain_where_the_spec_says():
    ns = kvtier.Namespace(**VECTORS[0]["descriptor"])
    h = kvtier.ChainHasher(ns)
    tokens = keys_spec.tokens_of(VECTORS[0])
    plain = h.keys(tokens)
    assert h.keys(tokens, cache_salt="a")[0] != plain[0]
    on_block_1 = h.keys(tokens, extras=[[], [(kvtier.ExtraKind.MULTIMODAL, b"img")]])
    assert on_block_1[0] == plain[0] and on_block_1[1] != plain[1]
    with pytest.raises(kvtier.InvalidArgumentError):
        h.keys(tokens, extras=[[(kvtier.ExtraKind.CACHE_SALT, b"x")]])  # the salt has its own argument
    with pytest.raises(kvtier.InvalidArgumentError):
        h.keys(tokens, extras=[[(kvtier.ExtraKind.MULTIMODAL, b"")]])  # empty payload


def test_external_keys_follow_the_spec():
    ns = kvtier.Namespace(**VECTORS[0]["descriptor"])
    fp = ns.fingerprint()
    page = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    expected = keys_spec.xxh128_hex(fp.canonical() + b"\xff\xff\xff\xff" + page.encode())
    assert kvtier.external_key(fp, page).hex() == expected
    assert kvtier.external_key(fp, page.encode()) == kvtier.external_key(fp, page)
    doc = (SOURCE / "docs" / "KEYS.md").read_text()
    assert kvtier.external_key(fp, page + "_k").hex() == "3ee831c51008b14b7304329d1d5ed699"
    assert "3ee831c51008b14b7304329d1d5ed699" in doc and fp.hex() == VECTORS[0]["fingerprint"]
    other = kvtier.Namespace(**dict(VECTORS[0]["descriptor"], model_revision="other"))
    assert kvtier.external_key(other.fingerprint(), page) != kvtier.external_key(fp, page)
