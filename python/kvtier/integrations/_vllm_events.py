"""KV cache events the vLLM connector hands vLLM through take_events():
vLLM's own classes (vllm/distributed/kv_events.py: BlockStored,
BlockRemoved, AllBlocksCleared, msgspec structs) when vLLM is installed,
else stand-ins with the same fields. Only the fields the installed class
declares are passed, and one it requires that is not given is None, so a
vLLM with fewer or more fields still gets its own event objects (vLLM at
0181ea3173e5 requires `medium` and `lora_name`)."""

from dataclasses import dataclass, field

try:
    from vllm.distributed import kv_events as _vllm_events
except ImportError:  # vLLM is not installed
    _vllm_events = None


@dataclass
class _BlockStored:
    block_hashes: list
    parent_block_hash: object = None
    token_ids: list = field(default_factory=list)
    block_size: int = 0
    lora_id: object = None
    medium: str = None
    lora_name: object = None


@dataclass
class _BlockRemoved:
    block_hashes: list
    medium: str = None


@dataclass
class _AllBlocksCleared:
    pass


def _fields(cls):
    names = getattr(cls, "__struct_fields__", None)
    if names is None:
        names = getattr(cls, "__dataclass_fields__", {}).keys()
    return set(names)


def _make(name, fallback, **values):
    cls = getattr(_vllm_events, name, None) if _vllm_events is not None else None
    if cls is not None:
        accepted = _fields(cls)
        try:
            return cls(**{k: v for k, v in values.items() if k in accepted})
        except TypeError:
            pass
        try:  # a field vLLM requires that kvtier does not know (lora_name before it was passed): None
            return cls(**{k: values.get(k) for k in accepted})
        except TypeError:  # still refused: the stand-in
            pass
    accepted = _fields(fallback)
    return fallback(**{k: v for k, v in values.items() if k in accepted})


def BlockStored(**values):  # noqa: N802 - vLLM's event name
    return _make("BlockStored", _BlockStored, **values)


def BlockRemoved(**values):  # noqa: N802 - vLLM's event name
    return _make("BlockRemoved", _BlockRemoved, **values)


def AllBlocksCleared():  # noqa: N802 - vLLM's event name
    return _make("AllBlocksCleared", _AllBlocksCleared)
