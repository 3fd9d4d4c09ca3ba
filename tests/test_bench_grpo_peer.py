"""bench/grpo_step.py --tiny --peer: minirl's learning phase (grpo.grpo_step on fixed rollouts, with
the speed-ups the CLI runs, or the plain pipeline with --plain) and transformers + peft's, on the same
rollouts from the same weights, compute the same log-probs, loss and gradient norm."""

import os
import sys

import pytest

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
)


@pytest.mark.parametrize(
    "dtype, tolerance, norm_rel, options",
    [
        ("float32", 1e-4, 1e-4, []),
        ("bfloat16", 2e-2, 1e-2, []),
        ("float32", 1e-4, 1e-4, ["--plain"]),
    ],
)
def test_grpo_step_peer_tiny_agrees_with_transformers_peft(
    dtype, tolerance, norm_rel, options, monkeypatch, capsys
):
    import grpo_step

    monkeypatch.setattr(
        sys,
        "argv",
        ["grpo_step.py", "--tiny", "--peer", "--repeats", "1", "--group", "4", "--dtype", dtype]
        + options,
    )
    grpo_step.main()
    out = capsys.readouterr().out
    assert "ratio transformers+peft / minirl:" in out, out
    assert f"{dtype} base" in out, out
    assert ("plain pipeline" if options else "fast pipeline") in out, out
    gap = float(out.split("max |Δlogprob| minirl vs transformers+peft: ")[1].split()[0])
    assert gap < tolerance, out
    line = next(line for line in out.splitlines() if "|Δloss| first run" in line)
    losses = line.split("(losses ")[1].split(";")[0].split(" / ")
    norms = line.split("grad_norm ")[1].rstrip(")").split(" / ")
    assert float(losses[0]) == pytest.approx(float(losses[1]), abs=1e-5), line
    assert float(norms[0]) == pytest.approx(float(norms[1]), rel=norm_rel), line
