"""``agentrl view`` in a real browser: headless Chromium from the distribution's packages, driven
by Playwright, over runs made by a tiny ``train.py`` and an ``agentrl eval``. Each page's
screenshot is saved under the test session's ``viewer-screenshots`` folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sandboxes import backend_skip_reason

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium")
TINY = ["--no-use-ray", "--no-progress", "--num-rollout", "2", "--rollout-batch-size", "2"]


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "look at the" in done.stdout.strip().splitlines()[-1]  # the last line names agentrl view


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with two tiny runs and one evaluation: ``sft`` (supervised on the oracle's calc
    demonstrations: multi-turn token streams with environment tokens), ``grpo`` (calc, rewards
    with spread from a custom reward, an eval set every rollout, asynchronous) and ``ev/oracle.json``
    (swe-tools' oracle in bubblewrap: a grade and a sandbox command log)."""
    reason = backend_skip_reason("bwrap")
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("viewed")
    rm = root / "rm.py"
    rm.write_text("def rm(args, sample):\n    return float(len(sample.response) % 2)\n")
    _run([str(REPO / "train.py"), "--env", "calc", "--loss-type", "sft_loss", *TINY,
          "--output-dir", "sft"], root)
    _run([str(REPO / "train.py"), "--env", "calc", *TINY, "--n-samples-per-prompt", "2",
          "--custom-rm-path", str(rm), "--rollout-temperature", "1.0", "--eval-env", "calc",
          "--eval-interval", "1", "--eval-max-prompts", "2", "--async-training",
          "--output-dir", "grpo"], root)
    _run(["-m", "agentrl", "eval", "--env", "swe-tools", "--policy", "oracle", "--limit", "2",
          "--env-kwarg", "sandbox=bwrap", "--output", "ev/oracle.json"], root)
    rm.unlink()
    return root


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Viewer:
    """``agentrl view PATH --port 0`` in a process of its own."""

    def __init__(self, path: Path) -> None:
        # stop() plays a Ctrl-C: the server gets SIGINT's default action even when this test
        # runs as a background job (whose children inherit SIGINT ignored, so Python would
        # install no KeyboardInterrupt for it)
        self.process = subprocess.Popen([sys.executable, "-m", "agentrl", "view", str(path), "--port", "0"],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        preexec_fn=_default_sigint)
        line = self.process.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert found, line + self.process.stderr.read()
        self.url = found.group(1)

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def stop(self) -> str:
        self.process.send_signal(signal.SIGINT)
        _, stderr = self.process.communicate(timeout=30)
        return stderr


@pytest.fixture(scope="module")
def viewer(runs: Path) -> Iterator[Viewer]:
    served = Viewer(runs)
    yield served
    assert "Traceback" not in served.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("viewer-screenshots")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: `make test` installs it as root (scripts/setup-system.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # the distribution's Chromium; as root it needs --no-sandbox
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser, viewer):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert errors == []  # no script error on any page


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_overview_draws_one_point_per_logged_rollout(page, viewer, runs, shots):
    page.goto(f"{viewer.url}#/run/grpo")
    page.wait_for_selector("figure.chart[data-metric='rollout/reward_mean'] circle.pt")
    metrics = _metrics(runs / "grpo" / "metrics.jsonl")
    evals = _metrics(runs / "grpo" / "eval.jsonl")
    for key in ("rollout/reward_mean", "train/grad_norm", "train/entropy"):
        points = page.locator(f"circle.pt[data-series='{key}']")
        assert points.count() == sum(key in m for m in metrics) == 2, key
    assert page.locator("figure[data-metric='eval/calc'] circle.pt").count() == len(evals) == 3
    # an asynchronous run's figures have charts of their own
    for key in ("async/staleness_max", "async/trainer_wait_s", "async/groups_in_flight"):
        assert page.locator(f"circle.pt[data-series='{key}']").count() == sum(key in m for m in metrics) == 2, key
    stages = page.locator("figure[data-metric='time'] circle.pt[data-series='train']")
    assert stages.count() == len(metrics)
    assert "--custom-rm-path" in page.locator("#summary").inner_text()
    page.locator("figure[data-metric='rollout/reward_mean'] svg").hover()
    assert page.locator("#tooltip").is_visible() and "rollout/reward_mean" in page.locator("#tooltip").inner_text()
    chart = page.locator("figure[data-metric='rollout/reward_mean']")
    box = chart.locator("svg").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] * 0.5)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.8, box["y"] + box["height"] * 0.5, steps=5)
    page.mouse.up()
    assert "zoomed" in chart.get_attribute("class")  # a drag zooms into the range it covered
    chart.locator("svg").dblclick()
    assert "zoomed" not in chart.get_attribute("class")
    # the y range is never narrower than 1% of the values: a 1e-5 wobble of an entropy of 5
    # draws flat, a real change keeps its own range
    flat_lo, flat_hi = page.evaluate("yRange([5.0, 5.00001, 4.99999], false)")
    assert flat_hi - flat_lo >= 0.05
    lo, hi = page.evaluate("yRange([0.2, 0.6], false)")
    assert lo < 0.2 < 0.6 < hi < 0.7
    page.screenshot(path=str(shots / "run-overview.png"), full_page=True)


def test_two_runs_compare_on_one_chart(page, viewer, shots):
    page.goto(f"{viewer.url}#/run/grpo")
    page.wait_for_selector("#compare")
    page.select_option("#compare", "sft")
    other = page.locator("figure[data-metric='rollout/reward_mean'] circle.pt[data-series='rollout/reward_mean (sft)']")
    other.first.wait_for()
    assert other.count() == 2
    page.screenshot(path=str(shots / "run-compare.png"), full_page=True)


def test_an_episodes_token_view_shows_exactly_its_tokens_with_the_masked_ones_marked(page, viewer, runs, shots):
    sample = json.loads((runs / "sft" / "trajectories" / "rollout_00000.jsonl").read_text().splitlines()[0])
    page.goto(f"{viewer.url}#/run/sft/sample/rollout_00000.jsonl/1")
    page.wait_for_selector("#tokens span.tok")
    tokens = page.locator("#tokens span.tok")
    assert tokens.count() == len(sample["tokens"])
    prompt = len(sample["tokens"]) - sample["response_length"]
    assert page.locator("#tokens span.tok.prompt").count() == prompt
    assert page.locator("#tokens span.tok.masked").count() == sample["loss_mask"].count(0) > 0
    assert page.locator("#tokens span.tok.trained").count() == sample["loss_mask"].count(1) > 0
    from tokenizers import Tokenizer

    policy_dir = json.loads((runs / "sft" / "run.json").read_text())["launches"][-1]["policy_dir"]
    pieces = Tokenizer.from_file(f"{policy_dir}/tokenizer.json").decode_batch(
        [[i] for i in sample["tokens"]], skip_special_tokens=False)
    assert page.locator("#tokens").evaluate(
        "box => [...box.querySelectorAll('span.tok')].map(s => s.textContent)") == pieces
    assert page.locator("#tokens .turn-mark").count() == len(sample["turns"])
    bubbles = page.locator("#conversation .bubble")
    assert bubbles.count() == len(sample["metadata"]["messages"])
    assert page.locator("#conversation .bubble.tool").count() >= 1  # the calculator's answer
    assert page.locator("#turns tr").count() == len(sample["turns"]) + 1
    assert "expected" in page.locator("#grade").inner_text()  # calc's grade: the answer it wanted
    assert "private fields" in page.locator("#grade-note").inner_text()  # marked as the grader's
    page.screenshot(path=str(shots / "episode.png"), full_page=True)


def test_the_episode_table_filters_by_status_reward_and_text(page, viewer, runs, shots):
    rows = [json.loads(line) for line in (runs / "grpo" / "trajectories" / "rollout_00000.jsonl").read_text().splitlines()]
    page.goto(f"{viewer.url}#/run/grpo/rollout/rollout_00000.jsonl")
    page.wait_for_selector("#episodes tbody tr")
    assert page.locator("#episodes tbody tr").count() == len(rows)
    status = rows[0]["status"]
    page.select_option("#f-status", status)
    page.wait_for_function(f"document.querySelector('#count').textContent.startsWith('{sum(r['status'] == status for r in rows)} of')")
    assert all(s == status for s in page.locator("#episodes tbody tr").evaluate_all("rs => rs.map(r => r.dataset.status)"))
    page.select_option("#f-status", "")
    page.fill("#f-min", "0.5")
    page.locator("#f-min").dispatch_event("change")
    winners = sum(r["reward"] >= 0.5 for r in rows)
    page.wait_for_function(f"document.querySelector('#count').textContent.startsWith('{winners} of {len(rows)}')")
    page.fill("#f-min", "")
    page.locator("#f-min").dispatch_event("change")
    page.fill("#f-text", "no text any episode contains")
    page.wait_for_function(f"document.querySelector('#count').textContent.startsWith('0 of {len(rows)}')")
    page.fill("#f-text", "")
    page.wait_for_function(f"document.querySelector('#count').textContent.startsWith('{len(rows)} of')")
    page.locator("#episodes th[data-key='reward']").click()  # sorted by reward, ascending
    page.wait_for_function("document.querySelector('#episodes th[data-key=reward]').textContent.includes('▴')")
    shown = [float(x) for x in page.locator("#episodes tbody tr td:nth-child(5)").all_inner_texts()]
    assert shown == sorted(shown)
    page.screenshot(path=str(shots / "rollout-table.png"), full_page=True)
    page.goto(f"{viewer.url}#/run/grpo/rollout/rollout_00000.jsonl/group/{rows[0]['group_id']}")
    page.wait_for_selector("#group .card")
    assert page.locator("#group .card").count() == sum(r["group_id"] == rows[0]["group_id"] for r in rows)
    page.screenshot(path=str(shots / "group.png"), full_page=True)


def test_an_eval_opens_with_pass_at_k_and_its_episodes(page, viewer, runs, shots):
    summary = json.loads((runs / "ev" / "oracle.json").read_text())
    page.goto(f"{viewer.url}#/eval/ev/oracle.json")
    page.wait_for_selector("#episodes tbody tr")
    assert "pass@1 1" in page.locator("#sets").inner_text()
    assert summary["sets"]["swe-tools"]["pass@1"] == 1.0
    assert page.locator("#episodes tbody tr").count() == 2
    page.screenshot(path=str(shots / "eval.png"), full_page=True)
    page.locator("#episodes tbody tr a.open").first.click()
    page.wait_for_selector("#commands")
    assert "tests/test_hidden.py" in page.locator("#grade").inner_text()  # the hidden tests passed
    phases = page.locator("#commands tr td:first-child").all_inner_texts()
    assert {"setup", "tools", "grade"} <= set(phases)
    assert page.locator("#tokens").inner_text().startswith("no tokens")  # the oracle is scripted
    page.screenshot(path=str(shots / "eval-episode.png"), full_page=True)


def test_a_damaged_run_shows_what_is_wrong_and_never_a_stack_trace(browser, runs, tmp_path, shots):
    damaged = tmp_path / "damaged"
    shutil.copytree(runs / "grpo", damaged)
    with (damaged / "metrics.jsonl").open("a") as f:
        f.write('{"rollout_id": 2, "rollout/rew')  # a line cut by a kill, no newline yet
    with (damaged / "trajectories" / "rollout_00000.jsonl").open("a") as f:
        f.write("not json at all\n")
    (damaged / "run.json").write_text("{half")
    served = Viewer(damaged)
    try:
        page = browser.new_page()
        page.goto(f"{served.url}#/run/.")
        page.wait_for_selector("#problems .problem")
        problems = page.locator("#problems").inner_text()
        assert "run.json cannot be read" in problems
        assert page.locator("circle.pt[data-series='rollout/reward_mean']").count() == 2  # the half line waits
        with (damaged / "metrics.jsonl").open("a") as f:
            f.write('ard_mean": 0.5}\nbroken\n')
        page.wait_for_function("document.querySelectorAll(\"circle.pt[data-series='rollout/reward_mean']\").length == 3",
                               timeout=20000)  # the page re-reads the growing file
        page.wait_for_function("document.querySelector('#problems').innerText.includes('metrics.jsonl line 4')",
                               timeout=20000)
        page.goto(f"{served.url}#/run/./rollout/rollout_00000.jsonl")
        page.wait_for_selector("#episodes tr.malformed")
        assert "malformed line" in page.locator("#episodes tr.malformed").inner_text()
        page.goto(f"{served.url}#/run/./sample/rollout_00000.jsonl/99")
        page.wait_for_selector("#error")
        assert "has no line 99" in page.locator("#error").inner_text()
        page.screenshot(path=str(shots / "damaged.png"), full_page=True)
        assert "Traceback" not in page.content()
        page.close()
    finally:
        assert "Traceback" not in served.stop()


def test_the_server_never_serves_files_outside_the_viewed_path(runs, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text('{"what": "not-for-the-viewer"}\n')
    viewed = tmp_path / "viewed"
    shutil.copytree(runs / "grpo", viewed)
    os.symlink(outside, viewed / "trajectories" / "rollout_00009.jsonl")  # a link out of the run
    os.symlink(tmp_path, viewed / "up")
    served = Viewer(viewed)
    try:
        for path in ("api/run?id=..", "api/run?id=../viewed", "api/run?id=up",
                     "api/rows?id=.&file=../../secret.txt", "api/sample?id=.&file=rollout_00009.jsonl&line=1",
                     "static/..%2F..%2Fcatalog.py", "static/%2e%2e/catalog.py", "api/rows?id=/etc&file=passwd"):
            status, body = served.get(path)
            assert status in (400, 404) and "error" in body, path
            assert "not-for-the-viewer" not in json.dumps(body), path
        assert served.get("api/run?id=.")[0] == 200
    finally:
        assert "Traceback" not in served.stop()


def test_a_path_that_is_neither_a_run_nor_an_eval_is_one_line_on_the_terminal(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    for path in (tmp_path, tmp_path / "notes.txt", tmp_path / "missing"):
        done = subprocess.run([sys.executable, "-m", "agentrl", "view", str(path)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert done.stderr.startswith("agentrl: error: ") and len(done.stderr.strip().splitlines()) == 1
