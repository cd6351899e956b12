"""What a vLLM request makes of its kvtier keys: the extras that key its
blocks as vLLM's own block hashes would (cache salt, multimodal inputs,
prompt embeddings), the LoRA adapter it belongs to, and whether it opted
out of loads or saves."""

import hashlib

import kvtier


def opt_out(request):
    """(load, save) a request allows: vLLM's skip_reading_prefix_cache stops
    loads; kv_transfer_params {"kvtier": false} stops both and
    {"kvtier": {"load": false, "save": false}} either."""
    params = getattr(request, "kv_transfer_params", None) or {}
    choice = params.get("kvtier", True) if isinstance(params, dict) else True
    if isinstance(choice, dict):
        load, save = bool(choice.get("load", True)), bool(choice.get("save", True))
    else:
        load = save = bool(choice)
    if getattr(request, "skip_reading_prefix_cache", False):
        load = False
    return load, save


def key_extras(request, num_tokens, block_tokens):
    """The request's cache salt and per-block extra keys (docs/KEYS.md), as
    vLLM's own block hashes take them: the salt on block 0; each multimodal
    input's identifier, with its offset within the block, on every block it
    overlaps; a digest of the prompt embeddings of each block."""
    import torch
    salt = getattr(request, "cache_salt", None) or None
    blocks = num_tokens // block_tokens
    extras = [[] for _ in range(blocks)]
    for feature in getattr(request, "mm_features", None) or []:
        start, length = feature.mm_position.offset, feature.mm_position.length
        for b in range(start // block_tokens, min(blocks, -(-(start + length) // block_tokens))):
            extras[b].append((kvtier.ExtraKind.MULTIMODAL, f"{feature.identifier}@{start - b * block_tokens}"))
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is not None:
        for b in range(blocks):
            rows = embeds[b * block_tokens:(b + 1) * block_tokens].detach().cpu().contiguous()
            digest = hashlib.sha256(rows.view(-1).view(torch.uint8).numpy().tobytes()).digest()
            extras[b].append((kvtier.ExtraKind.PROMPT_EMBEDS, digest))
    return salt, (extras if any(extras) else None)


def adapter_of(request):
    """A LoRA request's (name, path): its place in the namespace (adapter_id,
    adapter_revision). Give each version of an adapter its own name or path."""
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return None
    return (str(lora.lora_name), str(getattr(lora, "lora_path", "") or f"id-{lora.lora_int_id}"))
