"""Model backends behind one chat interface, registered by name with typed options:
`sim` (the embedded simulated agent), `openai` (any OpenAI-compatible server) and `local` (the small model
that `ratchet serve-local` serves on loopback). An installed package adds a backend through the `ratchet.models`
entry-point group: a factory whose keyword-only parameters are its options, returning a `ChatModel`

    [project.entry-points."ratchet.models"]
    my-model = "my_package.model:factory"

and a world contributes its own that way (the tau2 world's `gold`, the replay of tau2's gold actions for the parity
check: `components.worlds.taubench.gold.model`), so nothing here imports a world's code."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator

from components.models.base import ChatModel, ChatResult, ModelError
from components.registry import Registry

ENTRY_POINT_GROUP = "ratchet.models"
MODELS = Registry("model", entry_points=ENTRY_POINT_GROUP)


def _http_url(v: str) -> str:
    """An endpoint the OpenAI SDK can reach: refused at once, not after every episode has spent its retries."""
    from urllib.parse import urlsplit

    u = urlsplit(v)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{v!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
    return v


HttpURL = Annotated[str, AfterValidator(_http_url)]
ToolChoice = Literal["auto", "none", "required"]  # sent as is: a server refuses anything else on every request


@MODELS.register("sim")
def sim(*, world: str | None = None, model: str | None = None, learned: list[str] | None = None):
    """The embedded simulated agent (offline, deterministic). `world`: the registered world it plays; by default the
    one each request belongs to (by the tools it offers). `learned`: fact ids a training step taught it (see
    `components.outer.learn`); `model`: the name of that trained model (its identity in records)."""
    from components.models.simulated import SimulatedAgent
    from components.worlds import world as world_spec

    return SimulatedAgent(competence=world_spec(world).competence if world else None, learned=frozenset(learned or ()))


@MODELS.register("openai")
def openai_chat(
    *,
    base_url: HttpURL,
    model: str = "ratchet-sim",
    api_key_env: str = "OPENAI_API_KEY",
    timeout: float = 60.0,
    max_retries: int = 4,
    backoff: float = 0.5,
    backoff_cap: float = 8.0,
    temperature: float = 0.0,
    max_tokens: int = 512,
    tool_choice: ToolChoice = "auto",
    headers: dict[str, str] | None = None,
    json_actions: bool = False,
    schema_format: Literal["json_schema", "json_object", "none"] = "json_schema",
    max_tokens_field: Literal["auto", "max_tokens", "max_completion_tokens"] = "auto",
    reasoning: bool = False,
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None,
    parallel_tool_calls: bool | None = None,
    extra_body: dict[str, Any] | None = None,
):
    """A model behind an OpenAI-compatible /v1/chat/completions endpoint (see `openai_chat.py` for each option)."""
    from components.models.openai_chat import OpenAIChat

    return OpenAIChat(
        base_url=base_url,
        model=model,
        api_key_env=api_key_env,
        timeout=timeout,
        max_retries=max_retries,
        backoff=backoff,
        backoff_cap=backoff_cap,
        temperature=temperature,
        max_tokens=max_tokens,
        tool_choice=tool_choice,
        headers=headers,
        json_actions=json_actions,
        schema_format=schema_format,
        max_tokens_field=max_tokens_field,
        reasoning=reasoning,
        reasoning_effort=reasoning_effort,
        parallel_tool_calls=parallel_tool_calls,
        extra_body=extra_body,
    )


# `ratchet serve-local` (llama-cpp-python) on its default port: a slow CPU server, so long timeouts and few retries;
# llama-cpp-python takes a schema as {"type": "json_object", "schema": ...}.
LOCAL_PORT = 8765
LOCAL_MODEL = "smollm2-135m-instruct"


@MODELS.register("local")
def local(
    *,
    base_url: HttpURL = f"http://127.0.0.1:{LOCAL_PORT}/v1",
    model: str = LOCAL_MODEL,
    timeout: float = 300.0,
    max_retries: int = 1,
    backoff: float = 1.0,
    temperature: float = 0.0,
    max_tokens: int = 256,
    tool_choice: ToolChoice = "auto",
    headers: dict[str, str] | None = None,
    json_actions: bool = False,
    schema_format: Literal["json_schema", "json_object", "none"] = "json_object",
):
    """The small local model served by `ratchet serve-local` (the optional `[local]` extra); `headers` reach it as
    they reach any server (a proxy in front of it may want them)."""
    from components.models.openai_chat import OpenAIChat

    return OpenAIChat(
        base_url=base_url,
        model=model,
        timeout=timeout,
        max_retries=max_retries,
        backoff=backoff,
        temperature=temperature,
        max_tokens=max_tokens,
        tool_choice=tool_choice,
        headers=headers,
        json_actions=json_actions,
        schema_format=schema_format,
    )


def make_model(name: str, cfg: dict[str, Any] | None = None) -> ChatModel:
    return MODELS.make(name, cfg, where="model")


__all__ = ["ENTRY_POINT_GROUP", "MODELS", "ChatModel", "ChatResult", "ModelError", "make_model"]
