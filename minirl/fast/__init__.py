"""The speed-ups: each a drop-in for a plain version that the chapter modules and the lessons show.

| drop-in | the plain version it replaces | what it saves |
|---|---|---|
| cpu_matmul.py | F.linear in model.py, lora.py, trainable_tokens.py | CPU products of a few float32 rows; emulated bfloat16 |
| chunked_logprobs.py | losses.token_logprobs / sft_loss on lm_head logits | the (B, T, V) logits |
| prefix_learner.py, prefixes.py, length_passes.py | learner.py; sft.batch_losses | shared prompt tokens run once; less padding |
| decoder.py | sampling.generate | one prefill per distinct prompt; stopped rows leave the batch; fixed shapes |
| turn_cache.py | run_episodes' turns, each prefilling its whole conversation | earlier turns re-read: each episode's cache is kept |
| inverse_cdf.py | next_token.multinomial_draw | one uniform number per row instead of one per vocabulary entry |

Each computes what its plain version computes, up to the order of a sum (tests/test_speedups.py,
tests/test_turn_cache.py); docs/speedups.md says what each buys in a GRPO step on the real 0.5B
shape, and the turn cache in a batch of episodes (bench/episodes.py). A run picks them with a
`Speedups`: all on by default (FAST), all off with --plain (PLAIN), one at a time in the benchmark.
"""

from dataclasses import dataclass, fields

from ..next_token import multinomial_draw
from .cpu_matmul import use_fast_products, use_plain_products
from .decoder import Decoder
from .inverse_cdf import inverse_cdf_draw


@dataclass(frozen=True)
class Speedups:
    cpu_matmul: bool = True  # cpu_matmul.py, on every layer of the model
    chunked_logprobs: bool = True  # chunked_logprobs.py, in the learner and SFT
    prefixes: bool = True  # prefix_learner.py and SFT's shared prefix, in passes of similar lengths
    shared_prefill: bool = True  # decoder.py: one prefill per distinct prompt and shared prefix
    compaction: bool = True  # decoder.py: stopped rows leave the batch
    inverse_cdf: bool = True  # inverse_cdf.py, the next-token draw
    turn_cache: bool = True  # turn_cache.py: each episode's cache kept from turn to turn

    def apply(self, model):
        """The model's layers with the fast products, or the plain ones. In place; returns it."""
        return use_fast_products(model) if self.cpu_matmul else use_plain_products(model)

    def decoder(self, model, compile: bool = False) -> Decoder | None:
        """The sampler for `model`: a Decoder with the decoding drop-ins that are on (compile: fixed
        shapes and a compiled step), or None for the plain sampling.generate."""
        decoding = (self.shared_prefill, self.compaction, self.inverse_cdf, self.turn_cache)
        if not (any(decoding) or compile):
            return None
        draw = inverse_cdf_draw if self.inverse_cdf else multinomial_draw
        return Decoder(
            model,
            share_prefill=self.shared_prefill,
            compact=self.compaction,
            compile=compile,
            draw=draw,
            turn_cache=self.turn_cache,
        )


FAST = Speedups()
PLAIN = Speedups(**{f.name: False for f in fields(Speedups)})


PLAIN_HELP = "run the plain versions only, none of the drop-ins in minirl/fast/ (docs/speedups.md)"


def speedups(plain: bool) -> Speedups:
    """What a run's `plain` flag (--plain) means: PLAIN, or FAST."""
    return PLAIN if plain else FAST
