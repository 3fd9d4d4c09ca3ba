"""The folder a quickstart or recipe writes (files.fresh_folder): an earlier run's outputs are
cleared, anything else is refused before a byte goes, e.g. --out pointed at the base checkpoint."""

import os

import pytest
from conftest import cli_error, snapshot

from minirl.apps import quickstart, recipe
from minirl.files import fresh_folder
from minirl.toy import build_checkpoint


def tree(path):
    """Every file and folder under `path`, relative to it."""
    return sorted(
        os.path.relpath(os.path.join(root, name), path)
        for root, dirs, files in os.walk(path)
        for name in dirs + files
    )


def test_a_missing_or_empty_folder_is_made(tmp_path):
    fresh_folder(str(tmp_path / "new" / "run"), {"summary.json"}, "job")
    os.makedirs(tmp_path / "empty")
    fresh_folder(str(tmp_path / "empty"), {"summary.json"}, "job")
    assert tree(tmp_path / "new") == ["run"] and tree(tmp_path / "empty") == []


def test_an_earlier_runs_outputs_are_cleared(tmp_path):
    run = tmp_path / "run"
    os.makedirs(run / "sft" / "adapter")
    (run / "sft" / "adapter" / "weights").write_text("w")
    (run / "summary.json").write_text("{}")
    (run / "viewer.html").write_text("<html>")
    (run / "pipeline.png").write_text("png")
    # a link among the outputs is removed, never followed
    os.makedirs(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "keep").write_text("k")
    os.symlink(tmp_path / "elsewhere", run / "grpo")
    fresh_folder(str(run), {"summary.json", "sft", "grpo"}, "job", also=[str(run / "pipeline.png")])
    assert tree(run) == [] and (tmp_path / "elsewhere" / "keep").read_text() == "k"


def test_a_folder_holding_anything_else_is_refused_whole(tmp_path):
    run = tmp_path / "run"
    os.makedirs(run / "sft")
    (run / "summary.json").write_text("{}")
    (run / "model.safetensors").write_text("weights")
    before = tree(run)
    with pytest.raises(
        ValueError, match=r"--out .*run holds model.safetensors.*nothing was removed"
    ):
        fresh_folder(str(run), {"summary.json", "sft"}, "job")
    assert tree(run) == before
    # a figure counts as an output only where it lies in the folder
    (run / "model.safetensors").unlink()
    (run / "plot.png").write_text("png")
    with pytest.raises(ValueError, match="plot.png"):
        fresh_folder(str(run), {"summary.json", "sft"}, "job", also=[str(tmp_path / "plot.png")])
    with pytest.raises(ValueError, match="is a file"):
        fresh_folder(str(run / "summary.json"), {"summary.json"}, "job")


@pytest.mark.parametrize(
    "job",
    [
        lambda model: recipe.run(model, out_dir=model, smoke=True),
        lambda model: quickstart.run(out_dir=model, smoke=True, figure=None),
    ],
    ids=["recipe calculator", "quickstart"],
)
def test_out_pointed_at_the_base_checkpoint_loses_nothing(tmp_path, job):
    model = build_checkpoint(str(tmp_path / "toy"))
    before = snapshot(model)
    with pytest.raises(ValueError, match="config.json"):
        job(model)
    assert snapshot(model) == before


def test_recipe_code_out_at_its_model_is_one_clear_line(tmp_path, capsys):
    """python -m minirl recipe code --model M --out M, as a user mistypes it."""
    model = build_checkpoint(str(tmp_path / "toy"))
    before = snapshot(model)
    line = cli_error(["recipe", "code", "--model", model, "--out", model, "--smoke"], capsys)
    assert "config.json" in line and "nothing was removed" in line
    assert snapshot(model) == before
