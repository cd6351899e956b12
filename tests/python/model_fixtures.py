"""pytest fixtures and helpers shared by the tests that run the tiny model
(tiny_model.py); a test module imports the fixtures it uses."""

import pytest
import torch

from tiny_model import TinyDecoder, TinyGemma, TinyMLA, make_deterministic


@pytest.fixture(autouse=True)
def deterministic():
    make_deterministic()


@pytest.fixture(scope="module")
def model():
    make_deterministic()
    return TinyDecoder(seed=0)


@pytest.fixture(scope="module")
def mla_model():
    """The MLA toy (one cached latent per token and layer, replicated over TP ranks)."""
    make_deterministic()
    return TinyMLA(seed=0)


@pytest.fixture(scope="module")
def gemma_model():
    """The hybrid toy: layer 0 full attention, layer 1 a sliding window of 8 tokens (block size 4)."""
    make_deterministic()
    return TinyGemma(seed=0)


def prompt(seed, n, vocab=101):
    """`n` token ids drawn from a seeded generator."""
    return [int(t) for t in torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))]
