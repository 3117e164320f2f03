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
CONFIRM_SCHEMA = {
    "type": "object",
    "required": ["confirmed"],
    "properties": {"confirmed": {"type": "boolean"}},
    "additionalProperties": False,
}


class ScriptedUser:
    def __init__(self, task, first: str):
        ins = task.user_scenario.instructions
        self._first = first
        self._known = (getattr(ins, "known_info", None) or "").strip()
        self.replies = 0
        self.stopped = False
        self.final = ""  # the line that ended the call (tau2 keeps it in the conversation)
        self._transferred = False
        self.calls: list[dict] = []
        self.usage = Usage()  # a script spends nothing

    def first(self) -> str:
        return self._first

    def transferred(self) -> None:
        """The agent transferred the call to a human: the next message is answered with ###TRANSFER### (what tau2's
        user simulator is told to say)."""
        self._transferred = True

    def reply(self, assistant_text: str) -> str | None:
        if self._transferred or self.replies >= SCRIPTED_REPLIES:
            self.stopped = True
            self.final = TRANSFER if self._transferred else STOP
            return None
        self.replies += 1
        return scripted_reply(self._known)

    def confirm(self, tool: str, args: dict, summary: str) -> bool:
        return True


def scripted_reply(known: str) -> str:
    """What the scripted user answers every message with."""
    return f"Yes. {known}".strip()


def confirm_question(tool: str, args: dict, summary: str) -> str:
    """A `confirm` as the customer reads it: the agent's question (what it says is communicated, as tau2 credits
    what an agent says in a message)."""
    return f"{summary}\n\n({tool} {json.dumps(args, sort_keys=True)}) Do you confirm? Please answer yes or no."


def source_constant(path: Path, name: str) -> str:
    """A string constant (`NAME = \"\"\"...\"\"\".strip()`) of a tau2 source file, read without importing it: tau2's
    agent and user simulator modules import its LLM client (litellm), which this install leaves out."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "strip":
                value = value.func.value
            return ast.literal_eval(value).strip()
    raise InputError(f"{path}: {name}: not found in tau2's source")


@lru_cache(maxsize=1)
def tau2_user_prompt_template() -> str:
    """tau2's user simulator SYSTEM_PROMPT, read from its source."""
    import tau2.user as pkg

    return source_constant(Path(pkg.__file__).with_name("user_simulator.py"), "SYSTEM_PROMPT")


def tau2_user_system_prompt(task) -> str:
    from tau2.utils.utils import DATA_DIR

    guidelines = (DATA_DIR / "tau2" / "user_simulator" / "simulation_guidelines.md").read_text(encoding="utf-8")
    return tau2_user_prompt_template().format(
        global_user_sim_guidelines=guidelines, instructions=str(task.user_scenario)
    )


class LLMUser:
    """tau2's user simulator through an OpenAI-compatible server (see the module docstring)."""

    def __init__(self, task, model, seed: int):
        self.model = model
        self.seed = seed
        self.system = tau2_user_system_prompt(task)
        self.history: list[dict] = [{"role": "agent", "content": GREETING}]
        self.stopped = False
        self.final = ""  # the line that ended the call
        self.calls: list[dict] = []
        self.usage = Usage()  # every call's, a failed one's too (the episode's `user_tokens_in`, ... in scores.csv)

    def _messages(self) -> list[dict]:
        # tau2's flip_roles: the agent speaks as "user" to the simulator, the simulator's own lines are "assistant"
        flip = {"agent": "user", "customer": "assistant"}
        return [
            {"role": "system", "content": self.system},
            *({"role": flip[m["role"]], "content": m["content"]} for m in self.history),
        ]

    def _ask(self, json_mode: bool | dict = False) -> str:
        msgs = self._messages()
        try:
            res = self.model.complete(msgs, tools=None, seed=self.seed, json_mode=json_mode)
        except ModelError as e:  # what the failed call(s) spent all the same; the episode errs, saying whose model
            self.usage = add_usage(self.usage, e.usage)
            raise ModelError(f"the user simulator's model ({ENV_VAR}): {e.message}", e.kind, e.usage, e.text) from None
        self.usage = add_usage(self.usage, res.usage)
        self.calls.append({"messages": msgs, "reply": res.content, "usage": res.usage.model_dump()})
        return res.content or ""

    def _say(self) -> str | None:
        text = self._ask()
        self.history.append({"role": "customer", "content": text})
        if any(tok in text for tok in STOP_TOKENS):
            self.stopped = True
            self.final = text
            return None
        return text

    def transferred(self) -> None:
        """tau2's user simulator reads a transfer from the agent's words alone."""

    def first(self) -> str:
        text = self._say()
        return text if text is not None else STOP

    def reply(self, assistant_text: str) -> str | None:
        if self.stopped:
            return None
        self.history.append({"role": "agent", "content": assistant_text})
        return self._say()

    def confirm(self, tool: str, args: dict, summary: str) -> bool:
        self.history.append({"role": "agent", "content": confirm_question(tool, args, summary)})
        raw = self._ask(json_mode=CONFIRM_SCHEMA)
        try:
            granted = json.loads(raw).get("confirmed") is True
        except (json.JSONDecodeError, AttributeError):
            granted = False  # an unreadable answer grants nothing
        self.history.append({"role": "customer", "content": "Yes." if granted else "No."})
        return granted


def user_model_config() -> dict | None:
    """RATCHET_TAU2_USER as a mapping (None when unset); a value that is not one, or that names a key twice (YAML's
    loader and JSON's would keep the last silently), is one line naming the variable."""
    from components.io import strict_yaml, yaml_problem

    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    try:
        cfg = strict_yaml(raw)
    except yaml.YAMLError as e:
        raise InputError(f"{ENV_VAR}: -: not YAML or JSON, or not one value per key ({yaml_problem(e)})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{ENV_VAR}: -: must be a mapping of the openai backend's options (base_url, model, ...)")
    return cfg


# options of the user's model that say how to reach it, not what it says (as for the agent: `runtime.journal.TRANSPORT`)
USER_TRANSPORT = (
    "base_url",
    "timeout",
    "max_retries",
    "backoff",
    "backoff_cap",
    "api_key_env",
    "headers",
    "reply_store",
)


def user_settings() -> dict:
    """Which user simulator this process runs episodes with (`WorldSpec.settings`): `scripted`, or the model options
    of tau2's user simulator that decide what it says (its model, temperature, ...; not how it is reached). Checked
    as `make_user` checks them: a bad value is one line naming the variable."""
    cfg = user_model_config()
    if cfg is None:
        return {"user": "scripted"}
    _user_model(dict(cfg))  # refuses what an episode would refuse, before anything runs
    return {"user": {k: v for k, v in sorted(cfg.items()) if k not in USER_TRANSPORT}}


def _user_model(cfg: dict):
    """The user's model from its options (`reply_store` taken out first); an InputError names the variable."""
    from components.models import make_model

    try:
        return make_model("openai", cfg)  # typed options: a bad key or value is one clear line
    except InputError as e:
        raise InputError(f"{ENV_VAR}: {e}") from None


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
    from components.models.callcache import deterministic

    store = cfg.pop("reply_store", None)
    if store is not None and not isinstance(store, str):
        raise InputError(f"{ENV_VAR}: reply_store: must be a file path")
    model = _user_model(cfg)
    if store and deterministic("openai", cfg):  # a sampled user's replies must not be pinned
        model = _StoredUser(model, store, cfg)
    seed = int(hashlib.sha256(f"tau2-user#{task.id}".encode()).hexdigest()[:8], 16)
    return LLMUser(task, model, seed)
