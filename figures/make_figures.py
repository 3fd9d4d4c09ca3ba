"""Redraw every figure of the README and docs/ from the metrics in runs/ (nothing is recomputed).

python figures/make_figures.py            # after `python -m minirl quickstart`, `... recipe calculator`, `... recipe code`
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from minirl.run.plots import code_recipe_figure, quickstart_figure, recipe_figure  # noqa: E402

FIGURES = {
    "quickstart.png": (quickstart_figure, os.path.join("runs", "quickstart")),
    "recipe_calculator.png": (recipe_figure, os.path.join("runs", "recipe-calculator")),
    "recipe_code.png": (code_recipe_figure, os.path.join("runs", "recipe-code")),
}


def main(runs_root: str = ".", out_dir: str = os.path.dirname(os.path.abspath(__file__))):
    for name, (draw, run_dir) in FIGURES.items():
        run_dir = os.path.join(runs_root, run_dir)
        if not os.path.exists(os.path.join(run_dir, "summary.json")):
            print(f"skip {name}: no {run_dir}/summary.json (run the job that makes it first)")
            continue
        print("wrote", draw(run_dir, os.path.join(out_dir, name)))


if __name__ == "__main__":
    main()
