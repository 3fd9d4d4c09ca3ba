"""A lesson runs as a script (`python lessons/NN_topic.py`) and as a notebook (`jupytext --to ipynb`);
the two things that differ between them are here.

    args = lesson_flags(parser, quick={"epochs": 3})   # its flags; MINIRL_QUICK=1 picks the quick ones
    show(curve_figure(...))                             # a saved figure: drawn inline in a notebook

Flags. A script reads them from its command line. A notebook has no command line of its own (its
kernel's sys.argv holds the kernel's flags, which parse_known_args passes over), so the one switch a
notebook can set is the environment: `os.environ["MINIRL_QUICK"] = "1"` in a cell above the lesson's,
or `MINIRL_QUICK=1 jupyter lab`. It makes each lesson's `quick` values the defaults: the smoke mode the
tests run, seconds instead of minutes. A flag on the command line still wins over it.

Figures. The figure functions of run/plots.py draw on their own matplotlib Figure and save it, without
choosing a backend, so a notebook's inline plotting stays as it was; `show` then puts the saved PNG
inline when a Jupyter kernel runs the lesson, and prints where it is otherwise.
"""

import os

QUICK = "MINIRL_QUICK"


def quick_mode() -> bool:
    """True when the environment asks for the lessons' quick mode (MINIRL_QUICK set, and not 0)."""
    return os.environ.get(QUICK, "").strip() not in ("", "0")


def lesson_flags(parser, quick: dict):
    """Parse a lesson's flags; under MINIRL_QUICK its `quick` values (keyed by argparse dest) are the
    defaults. Unknown flags (a kernel's own) are ignored."""
    unknown = set(quick) - {action.dest for action in parser._actions}
    if unknown:
        raise ValueError(f"quick values for flags the lesson does not have: {sorted(unknown)}")
    if quick_mode():
        parser.set_defaults(**quick)
    args, _ = parser.parse_known_args()
    return args


def in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel attached), where a figure can be drawn
    inline; False in a script or a terminal IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return getattr(shell, "kernel", None) is not None


def show(path: str) -> str:
    """Show a saved figure: inline in a notebook, its path from a script. Returns the path."""
    if in_notebook():
        from IPython.display import Image, display

        display(Image(filename=path))
    print(f"figure: {path}")
    return path
