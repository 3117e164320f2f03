"""Model backends behind one chat interface, registered by name with typed options:
`sim` (the embedded simulated agent) and `openai` (any OpenAI-compatible server)."""

from __future__ import annotations

from typing import Any

from components.models.base import ChatModel, ChatResult, ModelError
from components.registry import Registry

MODELS = Registry("model")


@MODELS.register("sim")
def sim():
    """The embedded simulated agent (offline, deterministic)."""
    from components.models.simulated import SimulatedAgent

    return SimulatedAgent()


@MODELS.register("openai")
def openai_chat(*, base_url: str, model: str = "ratchet-sim", api_key_env: str = "OPENAI_API_KEY",
                timeout: float = 60.0, max_retries: int = 4, backoff: float = 0.5, backoff_cap: float = 8.0,
                temperature: float = 0.0):
    """A model behind an OpenAI-compatible /v1/chat/completions endpoint."""
    from components.models.openai_chat import OpenAIChat

    return OpenAIChat(base_url=base_url, model=model, api_key_env=api_key_env, timeout=timeout,
                      max_retries=max_retries, backoff=backoff, backoff_cap=backoff_cap, temperature=temperature)


def make_model(name: str, cfg: dict[str, Any] | None = None) -> ChatModel:
    return MODELS.make(name, cfg, where="model")


__all__ = ["MODELS", "ChatModel", "ChatResult", "ModelError", "make_model"]
