"""How a round reads in MLflow: its run's title, description, params and metrics, from its lineage record."""

from __future__ import annotations

from typing import Any

from components.codes import Verdict
from components.evolution.record import RoundRecord


def round_ci_level(rec: RoundRecord | dict[str, Any]) -> float | None:
    """The two-sided level of a round's dev CI as the gate used it (the report's and the CLI's, one definition)."""
    from components.evolution.report import ci_level

    return ci_level(rec)


def ci_text(rec: RoundRecord | dict[str, Any]) -> str:
    """A round's dev interval as every view states it: `99.5% CI [+0.012, +0.121]`."""
    rec = RoundRecord.of(rec)
    g, level = rec.gated, round_ci_level(rec)
    return (f"{100 * level:.4g}% CI" if level is not None else "CI") + f" [{g.ci_lo:+.3f}, {g.ci_hi:+.3f}]"


def round_title(rec: RoundRecord | dict[str, Any]) -> str:
    """A round run's name, verdict and net first (what a reader scans a list of rounds for), then the plan or why
    there was none."""
    rec = RoundRecord.of(rec)
    net = f" net {rec.gate.net:+.3f}" if rec.gate else ""
    return f"r{int(rec.round)} {rec.verdict}{net}: {rec.summary or rec.reason}"[:240]


def describe_round(rec: RoundRecord | dict[str, Any]) -> str:
    """One paragraph a person reads on the round's run page: plan, owner, verdict and why."""
    rec = RoundRecord.of(rec)
    parent = (rec.parent.version if rec.parent else "") or (rec.champion_before or "?")
    g, rep = rec.gate, rec.repair
    words = [f"Round {rec.round} on champion {parent}."]
    if rec.summary:  # the mechanism is recorded once the plan reaches the gate
        words.append(
            f"Plan (owner {rec.owner or '-'}"
            + (f", mechanism {rec.mechanism}" if rec.mechanism else "")
            + f"): {rec.summary}."
        )
    if rep:
        words.append(f"Repair screen on the diagnosed tasks: {rep.repaired} repaired, {rep.broken} broken.")
    if g:
        words.append(
            f"Held-out gate on dev: net {g.net:+.3f}, {ci_text(rec)}, "
            f"{g.n_improved} improved / {g.n_regressed} regressed of {g.n_items} items."
        )
    child = rec.child.version if rec.child else None
    verdict = {
        Verdict.ACCEPT: f"accepted: committed as {child}",
        Verdict.REJECT: "rejected: the champion stays",
        Verdict.NO_PLAN: "no plan: nothing left to patch",
    }.get(rec.verdict, rec.verdict)
    words.append(f"Verdict: {verdict} ({rec.reason}).")
    return " ".join(words)


def round_params(rec: RoundRecord, params: dict[str, Any]) -> dict[str, Any]:
    """A round run's params: the gate's settings at this look, the campaign's model and meta-agent, the plan."""
    c, gp = params.get("campaign", {}), params.get("gate", {})
    return {
        "gate": {
            **{
                k: gp.get(k) for k in ("alpha", "campaign_alpha", "n_boot", "material", "reg_cap", "seed", "sequential")
            },
            "look_alpha": rec.dev_look.alpha if rec.dev_look else None,
        },
        "reason": (rec.reason or "-")[:6000],
        "verdict": str(rec.verdict),
        "seeds": c.get("seeds"),
        "model": c.get("model"),
        "meta_agent": c.get("meta_agent"),
        "max_turns": c.get("max_turns"),
        "plan": rec.summary or "-",
        "owner": str(rec.owner or "-"),
        "looks": {
            k: {"looks_used": seq.looks_used, "stopped_early": seq.stopped_early, "why": seq.why}
            for k, seq in _stage_looks(rec).items()
            if seq
        },
    }


def _stage_looks(rec: RoundRecord) -> dict:
    return rec.sequential.stages() if rec.sequential is not None else {}


def round_metrics(rec: RoundRecord) -> dict[str, Any]:
    """A round run's metrics: the gate's and the repair screen's figures, the looks they took, the CI's level."""
    g, seqs = rec.gate, _stage_looks(rec)
    return {
        **_gate_figures(rec),
        "accepted": 1.0 if rec.accepted else 0.0,
        "dev_look": rec.dev_look.look if rec.dev_look else None,
        # sequential early stopping: looks evaluated, and whether the verdict came early
        **{f"{k}_looks_used": seq and seq.looks_used for k, seq in seqs.items()},
        **{f"{k}_stopped_early": float(seq.stopped_early) for k, seq in seqs.items() if seq},
        # the alpha this look at dev may spend (the param gate.alpha is one comparison's, the test
        # certification's), and the level of the CI the gate decided on
        "look_alpha": rec.dev_look.alpha if rec.dev_look else None,
        "ci_level": round_ci_level(rec) if g else None,
        **_look_cost(rec),
    }


def _gate_figures(rec: RoundRecord) -> dict[str, Any]:
    """The gate's figures and the repair screen's (None where the round did not reach them)."""
    g, rep = rec.gate, rec.repair
    return {
        "dev_base_mean": g and g.base_mean,
        "dev_cand_mean": g and g.cand_mean,
        "net": g and g.net,
        "ci_lo": g and g.ci_lo,
        "ci_hi": g and g.ci_hi,
        "n_improved": g and g.n_improved,
        "n_regressed": g and g.n_regressed,
        "repair_repaired": rep and rep.repaired,
        "repair_broken": rep and rep.broken,
        "repair_delta": (rep.cand_mean - rep.base_mean) if rep else None,
    }


def _look_cost(rec: RoundRecord) -> dict[str, Any]:
    """What the dev look cost: alpha reserved and charged, prompt tokens per episode of both arms."""
    look, dev = rec.dev_look, rec.tokens.dev if rec.tokens else None
    # with the futility refund: what the look reserved and what it cost (one-sided)
    return {
        "look_reserved": look.reserved if look else None,
        "look_charge": look.charge if look else None,
        # prompt tokens per episode of both arms on the dev cells the gate saw
        "dev_base_tokens": dev.base if dev else None,
        "dev_cand_tokens": dev.cand if dev else None,
    }
