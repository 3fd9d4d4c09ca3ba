"""Redraw every figure of the README and docs/ from the metrics in runs/ (nothing is recomputed).

python figures/make_figures.py            # after `python -m minirl quickstart`, `... recipe calculator`, `... recipe code`

hack_seeded.png needs the two GRPO runs of docs/results.md "The seeded run" (runs/hack-seeded/grpo,
the guarded reward, and runs/hack-seeded-naive). FIGURES names exactly the PNGs committed here, but
viewer.png (figures/viewer_screenshot.py); figures/README.md lists them (tests/test_figures.py).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from minirl.run.plots import (  # noqa: E402
    code_recipe_figure,
    hack_figure,
    quickstart_figure,
    recipe_figure,
)

FIGURES = {
    "quickstart.png": (quickstart_figure, os.path.join("runs", "quickstart")),
    "recipe_calculator.png": (recipe_figure, os.path.join("runs", "recipe-calculator")),
    "recipe_code.png": (code_recipe_figure, os.path.join("runs", "recipe-code")),
    "hack_seeded.png": (
        hack_figure,
        os.path.join("runs", "hack-seeded", "grpo"),
        os.path.join("runs", "hack-seeded-naive"),
    ),
}


def main(runs_root: str = ".", out_dir: str = os.path.dirname(os.path.abspath(__file__))):
    for name, (draw, *run_dirs) in FIGURES.items():
        run_dirs = [os.path.join(runs_root, d) for d in run_dirs]
        missing = [d for d in run_dirs if not os.path.exists(os.path.join(d, "summary.json"))]
        if missing:
            print(f"skip {name}: no {missing[0]}/summary.json (run the job that makes it first)")
            continue
        print("wrote", draw(*run_dirs, os.path.join(out_dir, name)))


if __name__ == "__main__":
    main()
