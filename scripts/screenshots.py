"""Screenshots of a finished campaign's records in the MLflow UI and the Prefect dashboard, taken in headless Chromium
(docs/records.md).

    .venv/bin/python scripts/screenshots.py docs/screenshots [--campaign-dir runs/campaign] [--home .ratchet]
        [--plots-html dvc_plots/index.html]

Starts `ratchet ui` and `ratchet server` on free loopback ports against the project's stores (default: $RATCHET_HOME,
else the project's `.ratchet/`: its mlflow.db and its Prefect home), writes the PNGs into the directory, and stops
both servers. Every MLflow address is opened in the UI's "Machine learning" mode (`ui_route`), as the addresses a
campaign prints are, so rounds show as training runs with no switch to find:

    1-model-versions.png   Models -> ratchet-<campaign>-<identity>: every version with its tags ratchet.parent and
                           ratchet.parent_model_version (the lineage), @champion
    2-round-run.png        a promoting round run: its params, its registered model version
    3-cited-trace.png      the trace of a failed episode an evidence packet cites, opened by clicking the claim's link in
                           the round run's description, the cited turn selected: its phases with the times they took
    4-net-by-round.png     the campaign run's metrics: the gate's net and its CI bounds, the champion's dev mean and
                           the promotions, by round (the link `net by round` a campaign prints)
    5-rounds-compared.png  the round runs compared: the params that differ (plan, owner, the gate's why), metrics
    6-version-lineage.png  the champion version's page: its description links its parent version (the link is
                           clicked and the parent's page checked) and its logged model; its source run
    7-prefect-runs.png     the Prefect dashboard's flow runs: the campaign and its rounds, their states and durations
    8-prefect-flow-run.png the campaign's flow run: its logs, its tag `mlflow:<run id>` (the MLflow run links back)
    9-dvc-plots-diff.png   with --plots-html: the page `dvc plots diff` wrote (offline template), e.g. the default
                           campaign against a 3-round experiment

Needs Debian's Chromium (`apt-get install -y chromium`; or --chromium) and Playwright's Python package
(`.venv/bin/pip install playwright==1.65.2`; in no extra), which drives that Chromium as it is: no browser is
downloaded. Nothing is fetched from outside 127.0.0.1. Not part of the test suite. `scripts/screenshots.sh` does
all of it in one command (installs, `dvc repro`, the r3 experiment and its plots page, this script).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
W, H = 1400, 900  # the viewport (the comparison: 1400x1700); each PNG stays under 300 KB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mlflow_ui(uri: str, port: int, timeout: float = 300.0):
    """`ratchet ui` against the store."""
    with serving(
        ["ui", "--port", str(port), "--tracking-uri", uri], port, "/health", dict(os.environ), timeout
    ) as base:
        yield base


@contextmanager
def prefect_ui(home: Path, port: int, timeout: float = 300.0):
    """`ratchet server` (the Prefect server and its dashboard) on the Prefect home the campaign recorded its flow runs
    in, with no PREFECT_API_URL of the caller's: this server's own API."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(RATCHET_HOME=str(home), PREFECT_HOME=str(home / "prefect"))
    with serving(["server", "--port", str(port)], port, "/api/health", env, timeout) as base:
        yield base


@contextmanager
def serving(args: list[str], port: int, health: str, env: dict, timeout: float):
    """`ratchet <args>` in its own process group (each server starts workers), until `health` answers 200; stopped
    with the group on exit."""
    ratchet = Path(sys.executable).with_name("ratchet")
    log = tempfile.TemporaryFile()  # not a pipe: a server writing to an unread pipe would block once it is full
    proc = subprocess.Popen(
        [str(ratchet), *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    base = f"http://127.0.0.1:{port}"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    try:
        deadline = time.monotonic() + timeout  # a loaded machine: the server's imports take a while
        while True:
            if proc.poll() is not None:
                log.seek(0)
                sys.exit(f"screenshots: `ratchet {args[0]}` exited {proc.returncode}: {log.read().decode()[-2000:]}")
            try:
                with direct.open(f"{base}{health}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                sys.exit(f"screenshots: `ratchet {args[0]}` did not answer on {base} within {timeout:.0f} s")
            time.sleep(1)
        yield base
    finally:
        stop_group(proc)
        log.close()


def stop_group(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the server's process group and wait until every member is gone (the mlflow server outlives
    `ratchet ui` by a few seconds), SIGKILL after `grace` seconds."""
    sig, deadline = signal.SIGTERM, time.monotonic() + grace
    while True:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        proc.poll()  # reap `ratchet ui` itself
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.5)
        sig = signal.SIGKILL if sig == signal.SIGKILL else 0  # after the first TERM: only probe, until the deadline


def records(uri: str, campaign_dir: Path) -> dict:
    """What the views show, found through the client API: the experiment, the registered model, the round runs
    (oldest first), a promoting round and a trace it cites. The campaign is the one in `campaign_dir`, found by its
    identity (`campaign_records`: its summary.json names its experiment, and its run is that directory's finished
    one with the summary's champion), never "the latest finished run named default", which after a `dvc exp run`
    is the experiment's."""
    from mlflow import MlflowClient

    from components.errors import InputError
    from components.tracking.mlflow_log import campaign_records

    c = MlflowClient(uri)
    try:
        found = campaign_records(c, campaign_dir)
    except InputError as e:
        sys.exit(f"screenshots: {e} (run the campaign first)")
    top = found["run"]
    eid, model = top.info.experiment_id, top.data.tags["ratchet.registered_model"]
    name = c.get_experiment(eid).name
    rounds = c.search_runs(
        [eid],
        f"tags.`ratchet.kind` = 'round' and tags.mlflow.parentRunId = '{top.info.run_id}'",
        order_by=["attributes.start_time ASC"],
    )
    if not rounds:
        sys.exit(f"screenshots: {uri}: experiment {name} has no round runs")
    accepted = [r for r in rounds if r.data.tags.get("ratchet.verdict") == "accept"]
    # the round shown: the first promotion that cites traces (its description links them), else any promotion
    traced = [
        r
        for r in accepted
        if c.search_traces(locations=[eid], run_id=r.info.run_id, max_results=1, include_spans=False)
    ]
    shown = (traced or accepted or rounds)[0]
    traces = c.search_traces(
        locations=[eid], run_id=shown.info.run_id, max_results=1, include_spans=False
    ) or c.search_traces(locations=[eid], max_results=1, include_spans=False)
    if not traces:
        sys.exit(f"screenshots: {uri}: experiment {name} has no traces")
    champion = c.get_model_version_by_alias(model, "champion")
    return {
        "eid": eid,
        "model": model,
        "rounds": [r.info.run_id for r in rounds],
        "round": shown.info.run_id,
        "trace": traces[0].info.trace_id,
        "champion": str(champion.version),
        "parent": champion.tags.get("ratchet.parent_model_version", ""),
        "run": top.info.run_id,
        "flow_run": top.data.tags.get("ratchet.prefect_flow_run", ""),
    }


# scroll only the nearest scrollable box (the span tree) so the element is in its middle; scrollIntoView would also
# shift the page under the trace's header
CENTER_IN_ITS_LIST = """e => {
  let p = e.parentElement;
  while (p && !(p.scrollHeight > p.clientHeight && /(auto|scroll)/.test(getComputedStyle(p).overflowY))) p = p.parentElement;
  if (p) p.scrollTop += e.getBoundingClientRect().top - p.getBoundingClientRect().top - p.clientHeight / 2;
}"""


def settle(page, text: str | None = None, timeout: float = 120_000) -> None:
    """Wait until the page has drawn its data: `text` (something only the loaded data shows) visible and no spinner
    left. Not "network idle": the UI polls, so the network never is."""
    if text:
        page.get_by_text(text, exact=False).first.wait_for(state="visible", timeout=timeout)
    page.wait_for_function(
        "!document.querySelector('[role=progressbar], .ant-spin-spinning, [data-testid*=spinner]')", timeout=timeout
    )
    page.wait_for_timeout(2500)  # late panels, column sizing and animations


def browser(p, chromium: str):
    # run as root (CI, containers) Chromium needs --no-sandbox; nothing it opens leaves 127.0.0.1, and without the
    # background-networking flags it would try Google's hosts at every start (refused on a closed network)
    return p.chromium.launch(
        executable_path=chromium,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    )


def shoot(ui: str, rec: dict, out: Path, chromium: str) -> list[Path]:
    from playwright.sync_api import sync_playwright

    from components.tracking.mlflow_log import ui_route

    out.mkdir(parents=True, exist_ok=True)
    eid, shots = rec["eid"], []
    at = lambda route: f"{ui}/{ui_route(route)}"  # noqa: E731  (in the "Machine learning" mode, as the CLI prints)
    with sync_playwright() as p:
        b = browser(p, chromium)
        page = b.new_page(viewport={"width": W, "height": H})
        page.set_default_timeout(120_000)
        click = lambda text: page.get_by_text(text, exact=False).first.click()  # noqa: E731
        button = lambda label: page.locator(f"button[aria-label='{label}']").first.click()  # noqa: E731

        def step(name: str, url: str, text: str, *then, height: int = H) -> None:
            page.set_viewport_size({"width": W, "height": height})
            page.goto(url)
            try:
                settle(page, text)
                for action in then:
                    action()
                    page.wait_for_timeout(1000)
                settle(page)
            except Exception:
                page.screenshot(path=str(out / f"failed-{name}"))  # what the page showed instead
                raise
            path = out / name
            page.screenshot(path=str(path))
            shots.append(path)

        # once per browser: close the assistant panel if it opens, and fold the sidebar, for room
        page.goto(at(f"#/models/{rec['model']}"))
        settle(page, "Version 1")
        if page.locator("button[aria-label='Close']").count():
            button("Close")
        if page.locator("button[aria-label='Toggle sidebar']").count():
            button("Toggle sidebar")

        # the versions, newest first: tags ratchet.parent / ratchet.parent_model_version walk the lineage, @champion
        step(
            "1-model-versions.png",
            at(f"#/models/{rec['model']}"),
            "Version 1",
            lambda: click("Description"),
            lambda: click("Tags"),
        )
        # the params table scrolled to the top; the description (plan, verdict, cited traces) is above it
        step(
            "2-round-run.png",
            at(f"#/experiments/{eid}/runs/{rec['round']}"),
            "Parameters (",
            lambda: page.get_by_text("Parameters (").first.evaluate("e => e.scrollIntoView({block: 'start'})"),
        )
        # from a packet's claim in the round's description, its link clicked (the UI opens it in a new tab): the
        # trace full screen, the cited turn selected: its phase spans (memory delivered, model call, checker
        # verdicts, tool call) and its inputs
        page.set_viewport_size({"width": W, "height": H})
        page.goto(at(f"#/experiments/{eid}/runs/{rec['round']}"))
        settle(page, "Cited failed episodes")
        with page.context.expect_page() as opened:
            page.locator("a[href*='selectedEvaluationId=']").first.click()
        trace = opened.value
        trace.set_default_timeout(120_000)
        settle(trace, "(cited)")
        for action in (
            lambda: trace.locator("button[aria-label='Full screen']").first.click(),
            lambda: trace.get_by_text("(cited)").first.click(),
            lambda: trace.get_by_text("(cited)").first.evaluate(CENTER_IN_ITS_LIST),
        ):
            action()
            trace.wait_for_timeout(1000)
        settle(trace)
        trace.set_viewport_size({"width": W, "height": H})
        trace.screenshot(path=str(out / "3-cited-trace.png"))
        shots.append(out / "3-cited-trace.png")
        trace.close()
        # the gate's net and CI by round, the champion's dev mean: the campaign run's stepped metrics
        # (the charts are alphabetical: `round_` in the search box puts the net and its CI bounds first)
        step(
            "4-net-by-round.png",
            at(f"#/experiments/{eid}/runs/{rec['run']}/model-metrics"),
            "Model metrics",
            lambda: page.get_by_role("searchbox").first.fill("round_"),
            lambda: page.get_by_text("round_net", exact=True).first.wait_for(state="visible"),
        )
        # the round runs side by side: what differs between rounds (plan, owner, the gate's why) and their metrics
        runs, exps = json.dumps(rec["rounds"]), json.dumps([eid])
        step(
            "5-rounds-compared.png",
            at(f"#/compare-runs?runs={runs}&experiments={exps}"),
            "Show diff only",
            lambda: click("Visualizations"),
            lambda: page.locator("[role=switch][aria-label='Parameters - Show diff only']").click(),
            lambda: page.locator("[role=switch][aria-label='Metrics - Show diff only']").click(),
            height=1700,
        )
        # the champion's version page: its description links the parent version (clicked: the parent's page opens)
        # and its logged model; its source run is the promoting round
        step("6-version-lineage.png", at(f"#/models/{rec['model']}/versions/{rec['champion']}"), "Promoted in round")
        if rec["parent"]:  # the parent-version link in the description works (it opens in this tab or a new one)
            v, pages = rec["parent"], len(page.context.pages)
            page.locator(f"a[href$='/versions/{v}'], a[href*='/versions/{v}?']").first.click()
            page.wait_for_timeout(3000)
            parent = page.context.pages[-1] if len(page.context.pages) > pages else page
            settle(parent, f"Version {v}")
            if parent is not page:
                parent.close()
        b.close()
    return shots


def shoot_prefect(ui: str, rec: dict, out: Path, chromium: str) -> list[Path]:
    """The dashboard's flow runs (the campaign and its rounds) and the campaign's flow run: logs and its MLflow tag."""
    from playwright.sync_api import sync_playwright

    shots = []
    with sync_playwright() as p:
        b = browser(p, chromium)
        page = b.new_page(viewport={"width": W, "height": H})
        page.set_default_timeout(120_000)
        for name, url, text in (
            ("7-prefect-runs.png", f"{ui}/runs", "campaign"),
            ("8-prefect-flow-run.png", f"{ui}/runs/flow-run/{rec['flow_run']}", "Logs"),
        ):
            if "flow-run/" in url and not rec["flow_run"]:
                continue  # a campaign run recorded without a flow run (not through Prefect)
            page.goto(url)
            try:
                settle(page, text)
            except Exception:
                page.screenshot(path=str(out / f"failed-{name}"))
                raise
            page.screenshot(path=str(out / name))
            shots.append(out / name)
        b.close()
    return shots


def shoot_page(html: Path, out: Path, chromium: str) -> Path:
    """A local page (the one `dvc plots diff` writes), as it renders offline."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = browser(p, chromium)
        page = b.new_page(viewport={"width": W, "height": 780})
        page.goto(html.resolve().as_uri())
        page.wait_for_function("document.querySelectorAll('svg, canvas').length > 0", timeout=120_000)
        page.wait_for_timeout(2500)
        page.screenshot(path=str(out / "9-dvc-plots-diff.png"))
        b.close()
    return out / "9-dvc-plots-diff.png"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="directory for the PNGs")
    ap.add_argument(
        "--campaign-dir",
        type=Path,
        default=ROOT / "runs" / "campaign",
        help="the campaign's directory (default: the workspace's runs/campaign); its summary.json names its records",
    )
    ap.add_argument(
        "--home",
        type=Path,
        default=Path(os.environ.get("RATCHET_HOME") or ROOT / ".ratchet"),
        help="the stores: mlflow.db and the Prefect home prefect/ (default: $RATCHET_HOME, else .ratchet)",
    )
    ap.add_argument("--tracking-uri", default=None, help="default: sqlite:///<home>/mlflow.db")
    ap.add_argument("--plots-html", type=Path, default=None, help="a page `dvc plots diff` wrote, shot as it renders")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    a = ap.parse_args()
    uri = a.tracking_uri or f"sqlite:///{a.home.resolve() / 'mlflow.db'}"
    rec = records(uri, a.campaign_dir)
    shots = []
    with mlflow_ui(uri, free_port()) as base:
        shots += shoot(base, rec, a.out, a.chromium)
    with prefect_ui(a.home.resolve(), free_port()) as base:
        shots += shoot_prefect(base, rec, a.out, a.chromium)
    if a.plots_html:
        shots.append(shoot_page(a.plots_html, a.out, a.chromium))
    for path in shots:
        print(f"{path}  {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
