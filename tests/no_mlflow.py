"""A stand-in for the campaign's MLflow tracker, for tests whose claims are about a campaign's rounds, files and
lineage: the tracker only reads those after each round, and logging a small campaign's runs, cited traces and model
versions is most of its CPU. What a campaign logs is checked in tests/test_records_and_reproduce.py and
tests/test_trace_destination.py, a rerun on the same bytes (replayed rounds) logged in tests/test_campaign.py."""

from __future__ import annotations


class NoMLflow:
    """`flows.campaign.CampaignTracker`'s calls in flows/campaign.py (a new call there fails loudly here)."""

    run_id = experiment_id = uri = "no-mlflow"

    def __init__(self, *args, **kwargs):
        self.client = self  # `tracker.client.log_text(...)`, `tracker.client.log_dict(...)`

    def log_round(self, rec: dict) -> str:
        return self.run_id

    def finish(self, *args, **kwargs) -> None:
        pass

    def log_text(self, *args, **kwargs) -> None:
        pass

    def log_dict(self, *args, **kwargs) -> None:
        pass
