"""GPU tier (pytest -m gpu, on a CUDA machine; bench/gpu_suite.sh runs it): the compiled decode step
with CUDA graphs against eager decoding, and the memory estimate against a measured GRPO step."""

import os
import sys

import pytest
import torch

from minirl import random_model
from minirl.config import preset
from minirl.fast import ON_A_GPU
from minirl.fast.decoder import Decoder
from minirl.run.memory import grpo_plan
from minirl.sampling import generate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
)


def test_compiled_cuda_graph_decoding_equals_eager():
    config = preset("0.5b", num_hidden_layers=4, vocab_size=4096)
    model = random_model(config, dtype=torch.bfloat16, device="cuda", seed=0)
    prompts = [[5, 17, 42, 9, 100, 3, 77], [200, 3], [11, 12, 13, 14, 15]]
    eager = generate(model, prompts, max_new_tokens=24, temperature=0, stop_token_ids=[])
    static = Decoder(model, static_cache=True).generate(
        prompts, max_new_tokens=24, temperature=0, stop_token_ids=[]
    )
    # keeps its cache, and so its CUDA graph, between the two calls
    decoder = Decoder(model, compile=True)
    compiled = generate(
        model, prompts, max_new_tokens=24, temperature=0, stop_token_ids=[], decoder=decoder
    )
    again = generate(
        model, prompts, max_new_tokens=24, temperature=0, stop_token_ids=[], decoder=decoder
    )
    for e, s, c, a in zip(eager, static, compiled, again):
        assert s.tokens == e.tokens
        # bfloat16 kernels inside a compiled graph may round differently: compare the first tokens,
        # where no earlier difference can have changed the context, and the log-probs loosely
        assert c.tokens[:4] == e.tokens[:4] and c.tokens == a.tokens
        torch.testing.assert_close(
            torch.tensor(c.logprobs[:4]), torch.tensor(e.logprobs[:4]), atol=0.1, rtol=0
        )


def test_compiled_decoding_records_its_cuda_graph_once(monkeypatch):
    """Calls after the first replay the recorded graph on the cache their Decoder keeps: no new recording
    per call (a new cache per call would record one each time, and slow every later step down)."""
    from torch._inductor import cudagraph_trees

    from minirl.lora import add_lora, merged_adapters

    recorded, original = [], cudagraph_trees.CUDAGraphTreeManager.record_function
    monkeypatch.setattr(
        cudagraph_trees.CUDAGraphTreeManager,
        "record_function",
        lambda self, *args, **kwargs: recorded.append(1) or original(self, *args, **kwargs),
    )
    config = preset("0.5b", num_hidden_layers=2, vocab_size=4096)
    model = add_lora(
        random_model(config, dtype=torch.bfloat16, device="cuda", seed=1), r=8, alpha=16
    )
    decoder = Decoder(model, compile=True)  # held across calls, as the GRPO loop holds one
    for call in range(
        4
    ):  # as GRPO samples: adapters folded in place, prompts of other lengths each time
        with merged_adapters(model):
            outs = generate(
                model,
                [[5 + call] * (3 + call), [7, 8]],
                max_new_tokens=20,
                temperature=1.0,
                seed=call,
                num_samples=4,
                stop_token_ids=[],
                decoder=decoder,
            )
        assert [len(o.tokens) for o in outs] == [20] * 8
        if call == 0:
            first = len(recorded)
    assert first >= 1 and len(recorded) == first, recorded


def test_memory_plan_within_10_percent_of_a_measured_grpo_step():
    from grpo_step import build, grpo_step, parser, prompts_for

    args = parser().parse_args(
        [
            "--device",
            "cuda",
            "--preset",
            "0.5b",
            "--group",
            "8",
            "--prompts",
            "1",
            "--prompt-len",
            "256",
            "--new-tokens",
            "256",
            "--minibatch",
            "8",
        ]
    )
    model, ref_model, cfg, optimizer, scheduler, device = build(args)
    step = grpo_step(
        model, ref_model, cfg, optimizer, scheduler, device, prompts_for(model, 1, 256, 0), 0, False
    )
    plan = grpo_plan(
        cfg, model.config, prompts_for(model, 1, 256, 0), model.dtype, 10**15, episodes=False,
        cpu=False, fast=ON_A_GPU, gpu=True,
    )  # fmt: skip
    assert plan.learning_at(plan.rows) == pytest.approx(step["learning"].peak, rel=0.1)
    assert plan.sampling_at(plan.group_size) == pytest.approx(step["sampling"].peak, rel=0.1)
