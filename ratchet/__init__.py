"""Ratchet as a Python library: evaluate a memory package, diagnose an evaluation, gate two score tables, run a
campaign, reproduce a promotion, export training data (and materialize a benchmark to do it on). Each function takes a frozen, typed request and returns a
typed result; bad input raises `InputError`, one line naming the file (or option) and the field.

    import ratchet

    result = ratchet.evaluate(ratchet.EvalRequest(package="data/packages/seed", split="dev", seeds=1))
    print(result.summary.mean_score)

The `ratchet` command line is a thin layer over these functions (docs: "Python quick start", "Python API").
"""

from flows.api import (
    BenchmarkParams,
    CampaignRequest,
    CampaignResult,
    Compound,
    DiagnoseRequest,
    EvalRequest,
    EvalResult,
    EvalSummary,
    ExportRequest,
    ExportResult,
    GateRequest,
    InputError,
    Localization,
    ModelSettings,
    OwnerScore,
    ReproduceRequest,
    ReproduceResult,
    Verdict,
    campaign,
    campaign_params,
    diagnose,
    evaluate,
    export,
    gate,
    materialize,
    reproduce,
)

__all__ = [
    "BenchmarkParams",
    "CampaignRequest",
    "CampaignResult",
    "Compound",
    "DiagnoseRequest",
    "EvalRequest",
    "EvalResult",
    "EvalSummary",
    "ExportRequest",
    "ExportResult",
    "GateRequest",
    "InputError",
    "Localization",
    "ModelSettings",
    "OwnerScore",
    "ReproduceRequest",
    "ReproduceResult",
    "Verdict",
    "campaign",
    "campaign_params",
    "diagnose",
    "evaluate",
    "export",
    "gate",
    "materialize",
    "reproduce",
]
