"""What each speed-up buys: one GRPO step on the real Qwen2.5-0.5B shape, first with the plain versions
only (what the lessons show, `--plain`), then with each drop-in of minirl/fast/ turned on alone, then
with all of them (what the commands run by default).

    python bench/speedups.py                  # 0.5B shape, float32, LoRA r=16: ~40 min on 2 CPU cores
    python bench/speedups.py --tiny           # seconds: the plumbing (tests/test_bench.py runs it)
    python bench/speedups.py --leave-one-out  # all but each one: what it buys among the others
    python bench/speedups.py --dtype bfloat16 --only plain,cpu_matmul --prompts 1 --group 4
                                              # emulated bfloat16 (a CPU without bfloat16 instructions)

A step is minirl's own grpo.grpo_step, as `minirl grpo` runs it: sample G completions for each of P
prompts (fast: through the Decoder that fast.Speedups.decoder builds), score them, group advantages,
the reference log-probs with the adapters off (β = 0.04), one optimizer step (AdamW) of the clipped
loss over minibatches of --minibatch rows. The model has random weights with the published 0.5B
config, LoRA r=16 on every linear layer. The prompts look like an agent task's: every prompt begins
with the same --prefix tokens (a system prompt and tool list; a calculator episode has ~170) and then
its own --question tokens. A sampled token stops its row with probability about 1/--mean-length
(a set of stop ids that large a share of the vocabulary, the weights being random), so rows end at
different steps as real episodes do, capped at --new-tokens.

Every configuration starts from the same adapter weights and a fresh optimizer, and runs the same
seeds, so two configurations that draw tokens the same way sample the same completions; the
inverse-CDF draw samples other (equally distributed) tokens, so its completions' mean length is
printed beside its times. One untimed step warms everything up; then --repeats rounds, each running
every configuration once in turn (the warm-up: one step with the plain products, one with the fast
ones). Printed: per configuration the median seconds of sampling,
learning and the whole step, and plain / configuration (> 1: faster than plain), as a markdown table
(docs/speedups.md holds the measured one).

Not run here: torch.compile with CUDA graphs (grpo --compile on a GPU) needs a GPU; on a CPU the
fixed-shape cache alone ("static cache", a Decoder with static_cache=True and nothing else) is timed.
"""

import argparse
import copy
import dataclasses
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import minirl  # noqa: E402
import minirl.sampling  # noqa: E402
from minirl.config import preset  # noqa: E402
from minirl.fast import FAST, PLAIN, Speedups  # noqa: E402
from minirl.fast.decoder import Decoder  # noqa: E402
from minirl.grpo import grpo_step  # noqa: E402
from minirl.lora import add_lora  # noqa: E402
from minirl.next_token import multinomial_draw  # noqa: E402
from minirl.rollout import Trajectory  # noqa: E402
from minirl.run.grpo import GRPOConfig  # noqa: E402
from minirl.run.grpo_metrics import Clock  # noqa: E402
from minirl.tasks import Task  # noqa: E402
from minirl.toy import tiny_config  # noqa: E402

# turn_cache saves work between the turns of episodes; this step's rollouts are one turn, so it is
# timed by bench/episodes.py instead (it is on in "all", where it changes nothing here)
DROP_INS = [f.name for f in dataclasses.fields(Speedups) if f.name != "turn_cache"]
WHAT = {
    "plain": "the plain versions only (--plain)",
    "cpu_matmul": "few-row float32 products; emulated bfloat16 in float32 blocks",
    "decode_attention": "a one-token step's attention: each kv head's query heads as one sequence",
    "packed_weights": "cpu_matmul's layers, their weights packed for oneDNN while sampling (a CPU "
    "with bfloat16 instructions)",
    "chunked_logprobs": "log-probs in chunks from hidden states, no (rows, Lc, V) logits",
    "prefixes": "shared prefix and each group's question run once; minibatches by length",
    "shared_prefill": "one prefill per distinct prompt and for the shared prefix, in passes",
    "compaction": "stopped rows leave the decoding batch",
    "inverse_cdf": "the next token by inverse CDF instead of torch.multinomial",
    "static_cache": "fixed-shape KV cache, no compile (the CUDA-graph path's cache)",
    "all": "every drop-in (what the commands run by default)",
}


class RandomPromptsTask(Task):
    """Items are token-id prompts; a completion's reward is its share of even token ids (cheap, and
    different within a group). Its rollout samples the items through `generate` as Task.rollout does
    for chat prompts, stopping on `stop_ids`."""

    name = "random-prompts"

    def __init__(self, prompts, stop_ids):
        self.prompts, self.stop_ids = prompts, stop_ids
        self.reward_functions = {"even": (self.even_share, 1.0)}

    @staticmethod
    def even_share(t):
        return sum(token % 2 == 0 for token in t.completion_ids) / max(1, len(t.completion_ids))

    def rollout(self, model, tokenizer, items, group_size, max_new_tokens, **options):
        options.pop("wrap_env", None)
        outs = minirl.sampling.generate(
            model,
            items,
            max_new_tokens=max_new_tokens,
            num_samples=group_size,
            stop_token_ids=self.stop_ids,
            **options,
        )
        return [
            Trajectory(
                prompt={},
                prompt_ids=items[i // group_size],
                completion_ids=o.tokens,
                action_mask=[1] * len(o.tokens),
                logprobs=o.logprobs,
                finish_reason=o.finish_reason,
            )
            for i, o in enumerate(outs)
        ]

    def sample(self, n, rng):
        return self.prompts[:n]

    def eval_items(self):
        return []

    def accuracy(self, trajectory):
        return {"strict": False, "lenient": False}


def configurations(only, leave_one_out=False) -> dict[str, tuple[Speedups, bool]]:
    """name -> (the drop-ins, whether the decoder keeps fixed shapes): plain, each alone, all; or
    with leave_one_out plain, all, and all but each one."""
    configs = {"plain": (PLAIN, False)}
    if leave_one_out:
        for name in DROP_INS:
            configs[f"all but {name}"] = (dataclasses.replace(FAST, **{name: False}), False)
    else:
        configs.update({n: (dataclasses.replace(PLAIN, **{n: True}), False) for n in DROP_INS})
        # the packed weights are the fast layers' (cpu_matmul's): alone, they come with them
        configs["packed_weights"] = (
            dataclasses.replace(PLAIN, cpu_matmul=True, packed_weights=True),
            False,
        )
        configs["static_cache"] = (PLAIN, True)
    configs["all"] = (FAST, False)
    if only:
        unknown = set(only) - set(configs)
        if unknown:
            raise SystemExit(f"--only: unknown {sorted(unknown)}; choose from {list(configs)}")
        configs = {name: configs[name] for name in only}
    return configs


def build(args):
    dtype = getattr(torch, args.dtype)
    config = tiny_config(512) if args.tiny else preset(args.preset)
    model = minirl.random_model(config, dtype=dtype, seed=0)
    torch.manual_seed(0)
    add_lora(model, r=16, alpha=32)
    g = torch.Generator().manual_seed(1)
    V = config.vocab_size
    prefix = torch.randint(2, V, (args.prefix,), generator=g).tolist()
    prompts = [
        prefix + torch.randint(2, V, (args.question,), generator=g).tolist()
        for _ in range(args.prompts)
    ]
    stop_ids = torch.randperm(V, generator=g)[: max(1, V // args.mean_length)].tolist()
    cfg = GRPOConfig(
        model="",
        group_size=args.group,
        prompts_per_step=args.prompts,
        max_new_tokens=args.new_tokens,
        minibatch_size=args.minibatch,
        beta=0.04,
        lr=1e-5,
    )
    return model, prompts, RandomPromptsTask(prompts, stop_ids), cfg


def run_step(model, adapters, prompts, task, cfg, fast, static, seed) -> dict:
    """One grpo_step from the saved adapter weights with a fresh AdamW: seconds per phase."""
    model.load_state_dict(adapters, strict=False)
    fast.apply(model)
    if static:
        plain = dict(share_prefill=False, compact=False, draw=multinomial_draw)
        decoder = Decoder(model, static_cache=True, **plain)
    else:
        decoder = fast.decoder(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    tokenizer = SimpleNamespace(pad_token_id=0)
    start = time.perf_counter()
    # the harness's clock (grpo_step keeps none): it notes when the rollout and the scoring return
    clock = Clock(task)
    done = grpo_step(
        model,
        tokenizer,
        clock,
        prompts,
        optimizer,
        scheduler,
        cfg,
        seed=seed,
        decoder=decoder,
        learner=fast.learner(),
    )
    seconds = clock.stop() - start
    lengths = [len(t.completion_ids) for t in done.trajectories]
    timing = clock.timing()
    return {
        "sample": timing["t_sample"],
        "learn": timing["t_learn"],
        "step": seconds,
        "length": sum(lengths) / len(lengths),
        "loss": done.loss,
    }


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tiny", action="store_true", help="a tiny model and batch: seconds")
    p.add_argument("--preset", default="0.5b")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--prompts", type=int, default=2, help="P prompts per step")
    p.add_argument("--group", type=int, default=4, help="G completions per prompt")
    p.add_argument("--prefix", type=int, default=170, help="tokens every prompt begins with")
    p.add_argument("--question", type=int, default=30, help="each prompt's own tokens")
    p.add_argument("--new-tokens", type=int, default=48, help="at most this many sampled tokens")
    p.add_argument(
        "--mean-length", type=int, default=40, help="1 / the chance a token stops its row"
    )
    p.add_argument("--minibatch", type=int, default=8, help="rows per forward and backward")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default=None, help="comma-separated configurations (default: all)")
    p.add_argument(
        "--leave-one-out",
        action="store_true",
        help="plain, all, and all but each drop-in: what each buys among the others",
    )
    args = p.parse_args(argv)
    if args.tiny:
        args.prefix, args.question, args.new_tokens, args.group, args.repeats = 20, 6, 8, 4, 1
    model, prompts, task, cfg = build(args)
    adapters = copy.deepcopy({k: v for k, v in model.state_dict().items() if "lora_" in k})
    configs = configurations(args.only.split(",") if args.only else None, args.leave_one_out)
    print(
        f"one GRPO step, {'tiny' if args.tiny else args.preset} shape, {args.dtype}, LoRA r=16: "
        f"{args.prompts} prompts x {args.group} samples, {args.prefix} shared + {args.question} own "
        f"prompt tokens, up to {args.new_tokens} new tokens, minibatch {args.minibatch}, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    # one untimed step with the plain products and one with the fast ones warms both up
    for name in dict.fromkeys([next(iter(configs)), list(configs)[-1]]):
        fast, static = configs[name]
        seconds = run_step(model, adapters, prompts, task, cfg, fast, static, seed=1000)["step"]
        print(f"  warm-up {name}: {seconds:.1f} s", flush=True)
    runs = {name: [] for name in configs}
    for repeat in range(args.repeats):
        for name, (fast, static) in configs.items():
            runs[name].append(run_step(model, adapters, prompts, task, cfg, fast, static, repeat))
            print(f"  round {repeat + 1} {name}: {runs[name][-1]['step']:.1f} s", flush=True)
    median = {
        name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        for name, rs in runs.items()
    }
    base = median.get("plain")
    print(
        "\n| configuration | what it changes | sample s | learn s | step s | plain / this | mean "
        "completion |\n|---|---|---|---|---|---|---|"
    )
    for name, m in median.items():
        ratio = f"{base['step'] / m['step']:.2f}x" if base else "-"
        dropped = name.removeprefix("all but ")
        what = WHAT[name] if name in WHAT else f"all but: {WHAT[dropped]}"
        times = f"{m['sample']:.1f} | {m['learn']:.1f} | {m['step']:.1f}"
        print(f"| {name} | {what} | {times} | {ratio} | {m['length']:.1f} |")
    return median


if __name__ == "__main__":
    main()
