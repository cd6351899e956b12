"""Adapters for inference engines: vLLM (kvtier.integrations.vllm) and SGLang
(kvtier.integrations.sglang). See docs/INTEGRATIONS.md."""
