"""Stage 2 of `recipe code` (recipe_code.py): the demonstrations SFT learns from, played by a
scripted engineer (envs/engineer.py) or, for the retry episode, the imperfect teacher
(envs/teacher.py), and written to the run folder; a resumed run reads back the ones it wrote.
"""

import json
import os

from ..envs.bugs import ESCAPES, load_bug_templates
from ..envs.code_tasks import load_templates
from ..envs.engineer import demonstrations
from ..envs.teacher import retry_demonstrations
from ..run.stages import not_whole


def demonstrate(s: dict, seed: int, summary: dict, out_dir: str, earlier: dict) -> str:
    """Stage 2: the demonstrations, written to out_dir/demonstrations.jsonl (its path returned).
    A resumed run (`earlier`: the summary it continues, same settings and seed) reads back the
    ones it wrote, when they are whole, instead of playing them again."""
    print(f"2. demonstrations: the scripted engineer fixes {s['demonstrations']} training bugs")
    data = os.path.join(out_dir, "demonstrations.jsonl")
    if "demonstrator" in earlier and not not_whole(data):
        with open(data) as f:
            if sum(1 for _ in f) == s["demonstrations"]:
                summary["demonstrator"] = earlier["demonstrator"]
                print(f"   written earlier: read from {data}")
                return data
    train = load_bug_templates("train") if s["tasks"] == "bugs" else load_templates()
    if s["escapes"]:
        # bugs on lines a JSON call must escape (data/code_escapes.json), drawn like the others
        train = train + load_bug_templates("train", ESCAPES)
    if s["teacher"] == "imperfect":
        conversations, demo = retry_demonstrations(
            train, s["demonstrations"], seed, s["retry_rate"], s["again"], s["no_op"]
        )
    else:
        conversations, demo = demonstrations(
            train,
            s["demonstrations"],
            s["retry_rate"],
            s["test_rate"],
            seed,
            s["hack_rate"],
            s["opening"],
        )
        demo.update(retry_rate=s["retry_rate"], test_rate=s["test_rate"], hack_rate=s["hack_rate"])
    summary["demonstrator"] = demo
    with open(data + ".tmp", "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in conversations)
    os.replace(data + ".tmp", data)
    if s["teacher"] == "imperfect":
        print(
            f"   {len(conversations)} conversations, fix rate {demo['fix_rate']:.3f}: "
            f"{demo['with_wrong_first']:.2f} with a wrong first edit (not trained on), "
            f"{demo['with_retry']:.2f} with a second attempt, {demo['gave_up']:.2f} giving up"
        )
    else:
        print(
            f"   {len(conversations)} conversations, fix rate {demo['fix_rate']:.3f}, "
            f"{demo['with_retry']:.2f} with a wrong edit first, {demo['hacked']:.2f} deleting "
            "the failing tests"
        )
    return data
