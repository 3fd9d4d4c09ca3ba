"""`minirl view` on an eval folder: items with the fewest successes first, model output escaped, bounded."""

import html
import json

import pytest
from test_evaluation import episode

from minirl.apps.cli import main
from minirl.apps.eval_viewer import build_page


def write_folder(folder, episodes):
    folder.mkdir()
    with open(folder / "episodes.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in episodes)


def test_failures_first_escaped_and_bounded(tmp_path, capsys):
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    episodes = []
    for item, wins in ((0, 2), (1, 0), (2, 1)):  # item 1 fails both samples, item 2 one of two
        for s in range(2):
            messages = [
                {"role": "user", "content": f"question {item}"},
                {"role": "assistant", "content": hostile if item == 1 else "42"},
            ]
            episodes.append(episode(item, s, s < wins, question=f"Q{item}", messages=messages))
    episodes.append(
        episode(
            1,
            0,
            False,
            perturbation="tool_error",
            perturbed=1,
            messages=[{"role": "tool", "content": "Error: injected"}],
        )
    )
    episodes.append(episode(1, 1, False, perturbation="tool_error", perturbed=0))
    episodes += [
        episode(i, s, True, perturbation="tool_error", perturbed=0)
        for i in (0, 2)
        for s in range(2)
    ]
    write_folder(tmp_path / "run", episodes)
    page = build_page(str(tmp_path / "run"))
    assert (
        "<script" not in page and "<img" not in page and html.escape(hostile) in page
    )  # shown as text
    order = [page.index(f"item {i}:") for i in (1, 2, 0)]
    assert order == sorted(order)  # 0/2, then 1/2, then 2/2 passed
    assert "item 1: 0/2 passed" in page and "tool_error (1× fired)" in page and "pass@1" in page
    small = build_page(str(tmp_path / "run"), max_episodes=4)
    assert "item 1:" in small and "item 0:" not in small and "more items not shown" in small
    main(["view", str(tmp_path / "run"), "--out", str(tmp_path / "page.html")])
    assert (tmp_path / "page.html").read_text() == page and "wrote" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["view", str(tmp_path / "run"), "--max-rollouts", "0"])
    assert "--max-rollouts must be at least 1" in capsys.readouterr().err
