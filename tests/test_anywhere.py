"""A campaign runs from any working directory: the built-in packages it starts from are the installed project's."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT


def test_a_campaign_started_outside_the_checkout_finds_its_start_package(tmp_path, monkeypatch):
    """The default `campaign.start` (data/packages/seed) and a built-in name (`seed`) resolve to the installed
    project's packages when the working directory has none; inside the project they stay as before (relative, the
    path dvc.yaml and the records name); a directory of that name here wins."""
    from components.params import load_params
    from flows.campaign import prepare

    monkeypatch.chdir(tmp_path)
    shipped = (ROOT / "data" / "packages" / "seed").resolve()
    for given in ({}, {"campaign.start": "seed"}, {"campaign.start": "data/packages/seed"}):
        p = load_params(None, {"campaign.out": str(tmp_path / "c"), **given})
        assert Path(p.campaign.start) == shipped, given
    prepare(load_params(None, {"campaign.out": str(tmp_path / "c")}))  # refused before: no such directory
    (tmp_path / "data" / "packages" / "seed").mkdir(parents=True)
    assert load_params(None).campaign.start == "data/packages/seed"  # the one here
    monkeypatch.chdir(ROOT)
    assert load_params(None).campaign.start == "data/packages/seed"
    assert load_params(ROOT / "params.yaml").campaign.start == "data/packages/seed"
