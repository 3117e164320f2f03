"""The customer of a tau2 episode: scripted (the offline default, and what tests use) or tau2's user simulator.

`RATCHET_TAU2_USER` unset: the scripted user. It opens with everything its scenario tells it (the task's
`first_message`: reason for the call, known info, instructions), answers every message with its known info, grants
every `confirm`, and stops (tau2's ###STOP###) after `SCRIPTED_REPLIES` replies.

`RATCHET_TAU2_USER` set to the options of Ratchet's `openai` backend as YAML or JSON (its own `base_url`, `model`,
`temperature`, `max_tokens`, ...; validated like `--model openai`): tau2's user simulator. Its system prompt is tau2's
own (`tau2/user/user_simulator.py`'s SYSTEM_PROMPT over `simulation_guidelines.md` and the task's user scenario), the
conversation is shown with the roles flipped as tau2 does, and the agent opens with tau2's greeting. A reply holding
one of tau2's stop tokens (###STOP###, ###TRANSFER###, ###OUT-OF-SCOPE###) ends the call. A `confirm` is put to it as
the agent's question, and its answer is asked for under the JSON schema {"confirmed": boolean}. Every call it makes
is kept in `calls` (request, reply, usage) and summed in `usage`: the episode's `user_tokens_in`, `user_tokens_out`
and `user_model_calls` in scores.csv, beside the agent's own. With `reply_store: <path>` among the options and
temperature 0, its replies go through a reply store like the agent's (a request seen before is answered from it).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

import yaml

from components.errors import InputError
from components.models.base import ModelError, add_usage
from components.runtime.types import Usage

ENV_VAR = "RATCHET_TAU2_USER"
SCRIPTED_REPLIES = 12
STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"  # tau2/user/base.py
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)
GREETING = "Hi! How can I help you today?"  # tau2/orchestrator/orchestrator.py DEFAULT_FIRST_AGENT_MESSAGE
CONFIRM_SCHEMA = {"type": "object", "required": ["confirmed"], "properties": {"confirmed": {"type": "boolean"}},
                  "additionalProperties": False}


class ScriptedUser:
    def __init__(self, task, first: str):
        ins = task.user_scenario.instructions
        self._first = first
        self._known = (getattr(ins, "known_info", None) or "").strip()
        self.replies = 0
        self.stopped = False
        self.calls: list[dict] = []
        self.usage = Usage()  # a script spends nothing

    def first(self) -> str:
        return self._first

    def reply(self, assistant_text: str) -> str | None:
        if self.replies >= SCRIPTED_REPLIES:
            self.stopped = True
            return None
        self.replies += 1
        return f"Yes. {self._known}".strip()

    def confirm(self, tool: str, args: dict, summary: str) -> bool:
        return True


@lru_cache(maxsize=1)
def tau2_user_prompt_template() -> str:
    """tau2's user simulator SYSTEM_PROMPT, read from its source: importing `tau2.user.user_simulator` would import
    tau2's LLM client (litellm), which this install leaves out."""
    import tau2.user as pkg

    src = Path(pkg.__file__).with_name("user_simulator.py").read_text(encoding="utf-8")
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SYSTEM_PROMPT" for t in node.targets):
            value = node.value  # """...""".strip()
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "strip":
                value = value.func.value
            return ast.literal_eval(value).strip()
    raise InputError(f"{pkg.__file__}: SYSTEM_PROMPT: not found in tau2's user simulator")


def tau2_user_system_prompt(task) -> str:
    from tau2.utils.utils import DATA_DIR

    guidelines = (DATA_DIR / "tau2" / "user_simulator" / "simulation_guidelines.md").read_text(encoding="utf-8")
    return tau2_user_prompt_template().format(global_user_sim_guidelines=guidelines,
                                              instructions=str(task.user_scenario))


class LLMUser:
    """tau2's user simulator through an OpenAI-compatible server (see the module docstring)."""

    def __init__(self, task, model, seed: int):
        self.model = model
        self.seed = seed
        self.system = tau2_user_system_prompt(task)
        self.history: list[dict] = [{"role": "agent", "content": GREETING}]
        self.stopped = False
        self.calls: list[dict] = []
        self.usage = Usage()  # every call's, a failed one's too (the episode's `user_tokens_in`, ... in scores.csv)

    def _messages(self) -> list[dict]:
        # tau2's flip_roles: the agent speaks as "user" to the simulator, the simulator's own lines are "assistant"
        flip = {"agent": "user", "customer": "assistant"}
        return [{"role": "system", "content": self.system},
                *({"role": flip[m["role"]], "content": m["content"]} for m in self.history)]

    def _ask(self, json_mode: bool | dict = False) -> str:
        msgs = self._messages()
        try:
            res = self.model.complete(msgs, tools=None, seed=self.seed, json_mode=json_mode)
        except ModelError as e:  # what the failed call(s) spent all the same
            self.usage = add_usage(self.usage, e.usage)
            raise
        self.usage = add_usage(self.usage, res.usage)
        self.calls.append({"messages": msgs, "reply": res.content, "usage": res.usage.model_dump()})
        return res.content or ""

    def _say(self) -> str | None:
        text = self._ask()
        self.history.append({"role": "customer", "content": text})
        if any(tok in text for tok in STOP_TOKENS):
            self.stopped = True
            return None
        return text

    def first(self) -> str:
        text = self._say()
        return text if text is not None else STOP

    def reply(self, assistant_text: str) -> str | None:
        if self.stopped:
            return None
        self.history.append({"role": "agent", "content": assistant_text})
        return self._say()

    def confirm(self, tool: str, args: dict, summary: str) -> bool:
        question = f"{summary}\n\n({tool} {json.dumps(args, sort_keys=True)}) Do you confirm? Please answer yes or no."
        self.history.append({"role": "agent", "content": question})
        raw = self._ask(json_mode=CONFIRM_SCHEMA)
        try:
            granted = json.loads(raw).get("confirmed") is True
        except (json.JSONDecodeError, AttributeError):
            granted = False  # an unreadable answer grants nothing
        self.history.append({"role": "customer", "content": "Yes." if granted else "No."})
        return granted


def user_model_config() -> dict | None:
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    try:
        cfg = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise InputError(f"{ENV_VAR}: -: not YAML or JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{ENV_VAR}: -: must be a mapping of the openai backend's options (base_url, model, ...)")
    return cfg


class _StoredUser:
    """The user model behind a reply store (`reply_store` in RATCHET_TAU2_USER): a request seen before is answered
    from the store, as the agent's are (`components.models.callcache`); written through after every call, since an
    episode's environment has no end of its own to flush at."""

    def __init__(self, model, path: str, cfg: dict):
        from components.models.callcache import CachedModel, CallStore

        self.cached = CachedModel(model, CallStore(path), {"model": "tau2-user", "cfg": cfg})
        self.name = model.name

    def complete(self, messages, *, tools, seed, json_mode=False):
        try:
            return self.cached.complete(messages, tools=tools, seed=seed, json_mode=json_mode)
        finally:
            self.cached.store.flush()


def make_user(task, first: str):
    cfg = user_model_config()
    if cfg is None:
        return ScriptedUser(task, first)
    from components.models import make_model
    from components.models.callcache import deterministic

    store = cfg.pop("reply_store", None)
    if store is not None and not isinstance(store, str):
        raise InputError(f"{ENV_VAR}: reply_store: must be a file path")
    model = make_model("openai", cfg)  # typed options: a bad key or value is one clear line
    if store and deterministic("openai", cfg):  # a sampled user's replies must not be pinned
        model = _StoredUser(model, store, cfg)
    seed = int(hashlib.sha256(f"tau2-user#{task.id}".encode()).hexdigest()[:8], 16)
    return LLMUser(task, model, seed)
