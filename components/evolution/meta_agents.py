"""Meta-agents by name: the built-ins (`rules`, `llm`: `components.evolution.meta`) and the installed plug-ins.

A package adds a meta-agent through the `ratchet.meta_agents` entry-point group: a factory whose keyword-only
parameters are its options (`campaign.meta_agent_cfg`), returning a `MetaAgent` (`plan(ctx) -> PlanOutcome`,
`spends`), named in params as `campaign.meta_agent`:

    [project.entry-points."ratchet.meta_agents"]
    my-planner = "my_package.planner:factory"

The built-ins are declared here by name and imported on first use: params validate a meta-agent's name against
this registry without importing the meta-agents' stack (pandas, the diagnosis).
"""

from __future__ import annotations

from components.registry import Registry

ENTRY_POINT_GROUP = "ratchet.meta_agents"
META_AGENTS = Registry("meta_agent", entry_points=ENTRY_POINT_GROUP)
META_AGENTS.declare("rules", "components.evolution.meta:rules")
META_AGENTS.declare("llm", "components.evolution.meta:llm")

__all__ = ["ENTRY_POINT_GROUP", "META_AGENTS"]
