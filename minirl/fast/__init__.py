"""The speed-ups: each a drop-in for a plain version that the chapter modules and the lessons show.

| drop-in | the plain version it replaces | what it saves |
|---|---|---|
| cpu_matmul.py | F.linear in model.py, lora.py, trainable_tokens.py | CPU products of a few float32 rows; emulated bfloat16 |
| decode_attention.py | Attention.attend in model.py | a one-token bfloat16 step's attention on a CPU (10x) |
| chunked_logprobs.py | losses.token_logprobs / sft_loss on lm_head logits | the (B, T, V) logits |
| prefix_learner.py, prefixes.py, length_passes.py | learner.py; sft.batch_losses | shared prompt tokens run once; less padding |
| decoder.py | sampling.generate | one prefill per distinct prompt; stopped rows leave the batch; fixed shapes |
| turn_cache.py | run_episodes' turns, each prefilling its whole conversation | earlier turns re-read: each episode's cache is kept |
| inverse_cdf.py | next_token.multinomial_draw | one uniform number per row instead of one per vocabulary entry |

Each computes what its plain version computes, up to the order of a sum (tests/test_speedups.py,
tests/test_turn_cache.py); docs/speedups.md says what each buys in a GRPO step on the real 0.5B
shape, and the turn cache in a batch of episodes (bench/episodes.py). A run picks them with a
`Speedups`: all on by default (FAST), all off with --plain (PLAIN), one at a time in the benchmark.
`generate` and `stream` below are what `minirl.generate` and `minirl.stream` are: the plain
sampler's call with every drop-in on, for a library user who calls it on a model of their own.
"""

from contextlib import contextmanager
from dataclasses import dataclass, fields

from .. import learner as plain_learner
from .. import sampling
from ..learner import Learner, lm_head_logprobs
from ..next_token import multinomial_draw
from ..sampling import Completion
from ..sft import SFTPasses, batch_losses, lm_head_sft_loss
from . import prefix_learner, prefix_sft
from .chunked_logprobs import chunked_sft_loss, chunked_token_logprobs
from .cpu_matmul import use_fast_products, use_plain_products
from .decode_attention import use_decode_attention
from .decoder import Decoder
from .inverse_cdf import inverse_cdf_draw
from .turn_cache import TurnCacheDecoder


@dataclass(frozen=True)
class Speedups:
    cpu_matmul: bool = True  # cpu_matmul.py, on every layer of the model
    decode_attention: bool = True  # decode_attention.py, on every attention layer
    # cpu_matmul.packed_weights while the Decoder samples (the weights of cpu_matmul's layers)
    packed_weights: bool = True
    chunked_logprobs: bool = True  # chunked_logprobs.py, in the learner and SFT
    prefixes: bool = True  # prefix_learner.py and SFT's shared prefix, in passes of similar lengths
    shared_prefill: bool = True  # decoder.py: one prefill per distinct prompt and shared prefix
    compaction: bool = True  # decoder.py: stopped rows leave the batch
    inverse_cdf: bool = True  # inverse_cdf.py, the next-token draw
    turn_cache: bool = True  # turn_cache.py: each episode's cache kept from turn to turn

    def apply(self, model):
        """The model's layers with the fast products and attention, or the plain ones (each as its
        flag says). In place; returns it."""
        (use_fast_products if self.cpu_matmul else use_plain_products)(model)
        return use_decode_attention(model, on=self.decode_attention)

    def learner(self) -> Learner:
        """What grpo_step computes its log-probs with: the shared-prefix layout and passes
        (prefix_learner.py) and the chunked head (chunked_logprobs.py) where on, else learner.py's."""
        layout = prefix_learner if self.prefixes else plain_learner
        head = chunked_token_logprobs if self.chunked_logprobs else lm_head_logprobs
        return Learner(layout.learning_batch, layout.logprobs, head)

    def sft_passes(self) -> SFTPasses:
        """What sft_step computes its losses with: the shared-prefix passes (prefix_sft.py) and the
        chunked loss (chunked_logprobs.py) where on, else sft.py's."""
        passes = prefix_sft.batch_losses if self.prefixes else batch_losses
        head = chunked_sft_loss if self.chunked_logprobs else lm_head_sft_loss
        return SFTPasses(passes, head)

    def decoder(self, model, compile: bool = False) -> Decoder | None:
        """The sampler for `model`: a Decoder with the decoding drop-ins that are on (compile: fixed
        shapes and a compiled step; turn_cache: a TurnCacheDecoder), or None for the plain
        sampling.generate."""
        decoding = (
            self.shared_prefill,
            self.compaction,
            self.inverse_cdf,
            self.turn_cache,
            self.packed_weights,
        )
        if not (any(decoding) or compile):
            return None
        draw = inverse_cdf_draw if self.inverse_cdf else multinomial_draw
        return (TurnCacheDecoder if self.turn_cache else Decoder)(
            model,
            share_prefill=self.shared_prefill,
            compact=self.compaction,
            compile=compile,
            draw=draw,
            # a compiled step keeps the plain products (the packed ones are not traced)
            pack=self.packed_weights and not compile,
        )


FAST = Speedups()
PLAIN = Speedups(**{f.name: False for f in fields(Speedups)})
# what a GPU run computes with: the CPU's products, decode attention and packed weights are CPU-only
ON_A_GPU = Speedups(cpu_matmul=False, decode_attention=False, packed_weights=False)


PLAIN_HELP = "run the plain versions only, none of the drop-ins in minirl/fast/ (docs/speedups.md)"


def speedups(plain: bool) -> Speedups:
    """What a run's `plain` flag (--plain) means: PLAIN, or FAST."""
    return PLAIN if plain else FAST


@contextmanager
def fast_layers(model):
    """The model's layers with their fast twins (FAST.apply) while the block runs, then each back to
    the class it had (a model already fast stays fast): how minirl.generate speeds up a model it was
    handed without changing it for the caller. (FAST's Decoder packs the weights for each call.)"""
    classes = [(layer, type(layer)) for layer in model.modules()]
    FAST.apply(model)
    try:
        yield model
    finally:
        for layer, cls in classes:
            layer.__class__ = cls


def generate(
    model, prompts: list[list[int]], *, decoder: Decoder | None = None, **options
) -> list[Completion]:
    """minirl.generate: sampling.generate (same arguments, same completions) with every drop-in on
    for this call. The model's layers compute with cpu_matmul's products and decode_attention's
    attention while it runs and are handed back as they were; a Decoder samples (each distinct
    prompt prefilled once, prompts in passes of similar lengths, stopped rows leave the batch, the
    inverse-CDF draw, the weights packed for oneDNN where the CPU has bfloat16 instructions). Greedy tokens are the plain loop's; a seed draws another stream than the
    plain loop's (another draw).
    decoder: one you hold instead, e.g. Decoder(model, compile=True) kept across calls; options:
    sampling.generate's (max_new_tokens, temperature, top_k, top_p, stop_token_ids, seed,
    num_samples, repetition_penalty). Like sampling.generate it reads no generation_config.json:
    weights.generation_settings(folder) gives a folder's settings as these arguments."""
    with fast_layers(model):
        decoder = FAST.decoder(model) if decoder is None else decoder
        return sampling.generate(model, prompts, decoder=decoder, **options)


def stream(model, prompt: list[int], *, decoder: Decoder | None = None, **options):
    """minirl.stream: sampling.stream with every drop-in on, as generate above (options:
    sampling.stream's). The model computes with the fast products until the stream ends (or is
    dropped)."""
    with fast_layers(model):
        decoder = FAST.decoder(model) if decoder is None else decoder
        yield from sampling.stream(model, prompt, decoder=decoder, **options)
