"""`python -m minirl view`: the page for a tiny GRPO run, loaded from disk by a real headless Chromium
(Debian's chromium and chromium-driver, driven by selenium): G completions per group, a token's log-prob
on hover, the curves, tool calls and observations set apart; hostile model output stays text; 1,000
rollouts stay small and open fast; every bad input names what and where."""

import csv
import json
import os
import random
import re
import shutil
import time

import pytest
import torch

from minirl.apps.cli import main
from minirl.apps.viewer import build_page, write_page
from minirl.apps.viewer_data import keep_steps, page_data, read_rollouts, token_roles
from minirl.chat import tool_turn_text
from minirl.rollout import Trajectory, sample_completions
from minirl.run.grpo import GRPOConfig, train
from minirl.run.rollout_log import RolloutLog, rollout_records
from minirl.tasks import Task
from minirl.toy import build_checkpoint

G, GROUPS, STEPS = 4, 2, 3
HOSTILE = (
    '<script>window.pwned = 1</script>"><img src=x onerror="window.pwned = 2"></div></td></tr></table>'
    "<!-- </script><script>window.pwned = 3</script>"
)


class ScriptedTask(Task):
    """Real samples, except two members of each group: a calculator episode (tool call, observation,
    answer) and a completion of hostile HTML."""

    name = "scripted"
    reward_functions = {"first": (lambda t: float(t.completion_ids[0] % 4 == 0), 1.0)}

    def sample(self, n, rng):
        return [
            {
                "messages": [{"role": "user", "content": f"What is {rng.randint(10, 99)} * 7?"}],
                "tools": None,
                "answer": 42,
            }
            for _ in range(n)
        ]

    def eval_items(self):
        return self.sample(2, random.Random(0))

    def accuracy(self, t):
        return {"strict": "42" in t.text, "lenient": "42" in t.text}

    def rollout(self, model, tokenizer, items, group_size, max_new_tokens, **options):
        trajectories = sample_completions(
            model, tokenizer, items, group_size, max_new_tokens, **options
        )
        call, answer = (
            tokenizer.encode(s)
            for s in (
                '<tool_call>\n{"name": "calculator", "arguments": '
                '{"expression": "6 * 7"}}\n</tool_call><|im_end|>',
                "42<|im_end|>",
            )
        )
        observation = tokenizer.encode(tool_turn_text(["42"]))
        hostile = tokenizer.encode(HOSTILE + "<|im_end|>")
        for i in range(
            0, len(trajectories) if group_size > 1 else 0, group_size
        ):  # not in greedy evaluation
            tool, bad = trajectories[i], trajectories[i + 1]
            tool.completion_ids = call + observation + answer
            tool.action_mask = [1] * len(call) + [0] * len(observation) + [1] * len(answer)
            tool.logprobs = [-0.5 if m else 0.0 for m in tool.action_mask]
            tool.finish_reason, tool.turns, tool.text = "answer", 2, "42"
            tool.tool_calls = [
                {"name": "calculator", "arguments": {"expression": "6 * 7"}, "result": "42"}
            ]
            bad.completion_ids, bad.action_mask, bad.logprobs = (
                hostile,
                [1] * len(hostile),
                [-1.0] * len(hostile),
            )
            bad.text = HOSTILE
        return trajectories


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("view")
    base = build_checkpoint(str(root / "tiny"), seed=0, initializer_range=0.2)
    out = str(root / "run")
    train(
        GRPOConfig(
            model=base,
            task=ScriptedTask(),
            out=out,
            steps=STEPS,
            group_size=G,
            prompts_per_step=3,
            max_new_tokens=8,
            lr=1e-3,
            beta=0.04,
            save_every=100,
            log_rollouts_every=2,
            log_rollout_groups=GROUPS,
        )
    )
    return out


def records(run) -> list[dict]:
    with open(os.path.join(run, "rollouts.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---- the page as text ----------------------------------------------------------------------------------


def test_the_page_is_self_contained_and_model_text_stays_inert(run):
    page = build_page(run)
    assert page.count("<script") == 2, "the JSON data block and the viewer's own code, nothing else"
    assert (
        "<img" not in page
        and "window.pwned = 1</script>" not in page
        and "<!-- </script>" not in page
    )
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), (
        "nothing may be fetched from the network"
    )
    data = json.loads(
        re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1)
    )
    assert [s["step"] for s in data["steps"]] == [1, 2, 3] and data[
        "logged_rollouts"
    ] == STEPS * GROUPS * G
    assert all(len(g["completions"]) == G for s in data["steps"] for g in s["groups"])
    texts = [
        "".join(data["pieces"][t][1] for t in c["tokens"])
        for s in data["steps"]
        for g in s["groups"]
        for c in g["completions"]
    ]
    assert texts.count(HOSTILE + "<|im_end|>") == STEPS * GROUPS  # all there, as inert JSON


def test_token_roles_find_tool_calls_even_split_over_tokens():
    pieces = [
        "<|im_start|>",
        "q",
        "ok ",
        "<tool",
        "_call>",
        '{"a": 1}',
        "</tool_call>",
        "\n",
        "obs",
        "done",
    ]
    mask = [0, 0, 1, 1, 1, 1, 1, 1, 0, 1]
    assert token_roles(pieces, mask, 2) == "pp" + "attttao" + "a"


def test_large_runs_show_evenly_spaced_steps():
    logged = [{"step": s} for s in range(1, 101) for _ in range(16)]
    assert keep_steps(logged, 2000) == list(range(1, 101))
    kept = keep_steps(logged, 160)
    assert len(kept) == 10 and kept[0] == 1 and kept[-1] == 100


def test_a_kl_not_computed_shows_as_missing_not_zero(tmp_path):
    """β = 0 runs no reference policy, so no KL exists: metrics.csv leaves its cell empty (it wrote
    0.0), the rollouts carry null, and the page draws no KL curve (it drew a flat line at 0)."""
    base = build_checkpoint(str(tmp_path / "tiny"), seed=0, initializer_range=0.2)
    out = str(tmp_path / "run")
    settings = dict(group_size=G, prompts_per_step=2, max_new_tokens=8, lr=1e-3, save_every=100)
    train(GRPOConfig(model=base, task=ScriptedTask(), out=out, steps=2, beta=0.0, **settings))
    with open(os.path.join(out, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [r["kl"] for r in rows] == ["", ""] and all(r["loss"] for r in rows)
    assert all(k is None for r in records(out) for k in r["kl"])
    data = page_data(read_rollouts(os.path.join(out, "rollouts.jsonl")), 100)
    completions = [c for s in data["steps"] for g in s["groups"] for c in g["completions"]]
    assert completions and not any("kl" in c for c in completions)
    page = build_page(out, 100)
    assert "KL to the reference" not in page and page.count('<svg class="curve"') >= 3
    # with β > 0 the same run has its KL, and its curve
    train(
        GRPOConfig(model=base, task=ScriptedTask(), out=out + "-kl", steps=2, beta=0.04, **settings)
    )
    assert "KL to the reference" in build_page(out + "-kl", 100)


def test_bad_inputs_say_what_and_where(run, tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="no such run folder"):
        build_page(str(tmp_path / "nowhere"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main(["view", str(empty)])
    assert exit_info.value.code == 2 and "no rollouts.jsonl" in capsys.readouterr().err
    lines = open(os.path.join(run, "rollouts.jsonl"), encoding="utf-8").read().splitlines()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "rollouts.jsonl").write_text(lines[0] + "\n" + lines[1][:50] + "\n")
    with pytest.raises(ValueError, match=r"rollouts.jsonl:2: not valid JSON"):
        build_page(str(broken))
    record = json.loads(lines[0])
    record["pieces"] = record["pieces"][:-1]
    (broken / "rollouts.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=r"rollouts.jsonl:1: pieces has"):
        build_page(str(broken))
    record["pieces"].append("")
    (broken / "rollouts.jsonl").write_text(json.dumps({**record, "step": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"rollouts.jsonl:1: step should be int, got '1'"):
        build_page(str(broken))
    del record["reward"]
    (broken / "rollouts.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=r"rollouts.jsonl:1: missing reward"):
        build_page(str(broken))
    assert not os.path.exists(broken / "viewer.html")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match="cannot write .*a-file"):
        write_page(run, str(tmp_path / "a-file" / "view.html"))


# ---- the page in a real browser -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip(
        "selenium", reason="the browser test drives Chromium through selenium: pip install selenium"
    )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip(
            "no chromium/chromedriver on PATH: apt-get install chromium chromium-driver (.ci/run does)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    yield chrome
    chrome.quit()


def open_page(browser, path) -> float:
    """Load a page from disk and wait for the viewer to finish drawing; returns the seconds it took."""
    from selenium.webdriver.support.ui import WebDriverWait

    start = time.perf_counter()
    browser.get("file://" + os.path.abspath(path))
    WebDriverWait(browser, 10).until(
        lambda b: b.execute_script("return document.body.dataset.ready === '1'")
    )
    return time.perf_counter() - start


def test_the_page_in_chromium(run, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(browser, write_page(run, str(tmp_path / "view.html")))
    css = browser.find_elements
    # the last logged step: GROUPS groups of G completions, sorted by reward
    tables = css(By.CSS_SELECTOR, "table.group")
    assert len(tables) == GROUPS
    for table in tables:
        assert len(table.find_elements(By.CSS_SELECTOR, "td.completion")) == G
        rewards = [
            float(re.search(r"reward (-?[\d.]+)", th.text).group(1))
            for th in table.find_elements(By.TAG_NAME, "th")
        ]
        assert rewards == sorted(rewards, reverse=True)
    # hovering a token shows its log-probs, the same as rollouts.jsonl's
    th, td = (
        tables[0].find_elements(By.TAG_NAME, "th")[0],
        tables[0].find_elements(By.CSS_SELECTOR, "td.completion")[0],
    )
    sample = int(re.search(r"sample (\d+)", th.text).group(1))
    record = next(
        r for r in records(run) if r["step"] == STEPS and r["group"] == 0 and r["sample"] == sample
    )
    tokens = td.find_elements(By.CSS_SELECTOR, ".tok")
    k = next(
        i
        for i, t in enumerate(tokens)
        if t.text.strip() and "o" not in t.get_attribute("class").split()
    )
    ActionChains(browser).move_to_element(tokens[k]).perform()
    tip = browser.find_element(By.ID, "tip")
    assert tip.is_displayed() and "advantage" in tip.text and "ratio" in tip.text
    shown = float(re.search(r"sampling log-prob (-?[\d.]+)", tip.text).group(1))
    assert abs(shown - record["sampler_logprob"][record["prompt_len"] + k]) < 1.1e-3
    learner = float(re.search(r"log-prob πθ (-?[\d.]+)", tip.text).group(1))
    assert abs(learner - record["logprob"][record["prompt_len"] + k]) < 1.1e-3
    # tool calls and tool responses are set apart
    calls, observations = css(By.CSS_SELECTOR, "td .toolcall"), css(By.CSS_SELECTOR, "td .obs")
    assert (
        len(calls) == len(observations) == GROUPS
        and "calculator" in calls[0].text
        and "42" in observations[0].text
    )
    # the curves render: an SVG per metric with a drawn line
    curves = css(By.CSS_SELECTOR, "svg.curve")
    assert len(curves) >= 5
    for svg in curves:
        assert (
            browser.execute_script(
                "return arguments[0].querySelector('polyline').getBBox().width", svg
            )
            > 0
        )
    # each curve has a colour key: every line's colour is a legend entry's, name and swatch
    for svg in curves:
        lines, names, swatches = browser.execute_script(
            "const s = arguments[0], look = (q, f) => [...s.querySelectorAll(q)].map(f);"
            "return [look('polyline', p => getComputedStyle(p).stroke),"
            "look('text.legend', t => getComputedStyle(t).fill),"
            "look('line.swatch', l => getComputedStyle(l).stroke)];",
            svg,
        )
        assert lines and lines == names == swatches, (lines, names, swatches)
    # hostile output: shown as text, nothing executed, the layout held
    assert browser.execute_script("return window.pwned") is None
    assert browser.execute_script("return document.images.length") == 0
    assert len(css(By.TAG_NAME, "script")) == 2
    assert (
        sum("window.pwned = 1</script>" in td.text for td in css(By.CSS_SELECTOR, "td.completion"))
        == GROUPS
    )
    assert browser.execute_script(
        "return [...document.body.children].map(e => e.id).filter(Boolean)"
    ) == ["run", "summary", "curves-section", "rollouts-section", "tip", "data"]
    assert all(
        len(t.find_elements(By.CSS_SELECTOR, ":scope > tr")) == 2
        for t in css(By.CSS_SELECTOR, "table.group")
    )
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    # the step picker redraws another step
    Select(browser.find_element(By.ID, "step")).select_by_index(0)
    assert "step 1" in Select(browser.find_element(By.ID, "step")).first_selected_option.text
    assert len(css(By.CSS_SELECTOR, "td.completion")) == GROUPS * G
    browser.save_screenshot(str(tmp_path / "viewer.png"))
    assert (tmp_path / "viewer.png").read_bytes()[:4] == b"\x89PNG"


def test_a_thousand_rollouts_stay_small_and_open_fast(browser, toy_tokenizer, tmp_path):
    """50 logged steps x 2 groups x G = 10: prompts of ~60 tokens, completions of 100 (real text, so the
    pieces are a real mix), every per-token field filled as the defaults fill them (one inner step, so
    π_old = πθ; beta > 0, so π_ref and KL), log-probs spread like a policy's (most near 0)."""
    rng = random.Random(0)
    text = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 37 * 84? "
        "Think step by step and end with the answer.<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt = toy_tokenizer.encode(text)
    words = toy_tokenizer.encode(
        " ".join(
            str(rng.randint(1, 999)) + rng.choice([" plus", " times", " is", "."])
            for _ in range(400)
        )
    )
    log = RolloutLog(str(tmp_path / "rollouts.jsonl"), None)
    for step in range(1, 51):
        trajectories = []
        for _ in range(20):
            start = rng.randrange(len(words) - 100)
            ids = words[start : start + 100]
            trajectories.append(
                Trajectory(
                    {"answer": 3108},
                    prompt,
                    ids,
                    [1] * 100,
                    [-rng.expovariate(2) for _ in ids],
                    "length",
                    reward=float(rng.random() < 0.5),
                )
            )
        sampled = torch.tensor([t.logprobs for t in trajectories])  # (20, 100)
        logprob = sampled + 1e-3 * torch.randn(20, 100)
        per_token = {
            "logprob": logprob,
            "old_logprob": logprob,
            "ref_logprob": logprob + 0.1 * torch.randn(20, 100),
        }
        log.write(
            rollout_records(
                step * 10,
                trajectories,
                torch.randn(20),
                list(range(20)),
                per_token,
                toy_tokenizer,
                group_size=10,
                groups=2,
            )
        )
    log.close()
    with open(tmp_path / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "reward_mean", "kl", "completion_len"])
        writer.writerows([s, rng.random(), rng.random() / 10, 100] for s in range(1, 501))
    page = write_page(str(tmp_path), str(tmp_path / "big.html"))
    megabytes = os.path.getsize(page) / 1e6
    seconds = open_page(browser, page)
    print(
        f"1,000 rollouts: {megabytes:.2f} MB, opened in {seconds:.2f} s "
        f"({browser.execute_script('return window.viewerReadyMs'):.0f} ms in the page)"
    )
    assert megabytes < 4, megabytes  # ~34 bytes per completion token; 3.4 MB when this was written
    assert seconds < 2, seconds
    assert "1000 rollouts logged at 50 steps" in browser.find_element("id", "notes").text
