"""Drop-in for sampling.generate: the same sampling, faster, in a `Decoder` that keeps its state.

sampling.generate puts every sequence in one left-padded batch, prefills it whole and decodes until
the last row stops. A Decoder (passed as generate(..., decoder=)) does the same work with less:

- share_prefill: each distinct prompt is prefilled once and its cache copied into the G rows of its
  group; a prefix all prompts share (an agent task's system prompt and tools) is prefilled once for
  all; prompts of mixed lengths run in passes of similar lengths (length_passes.py) placed in one
  cache: 16 chat-templated HumanEval prompts of 126-322 tokens ran 2,986 padded positions in 2
  passes instead of 4,432 in one.
- compact: rows that have stopped leave the batch once they are COMPACT_AT of it. On a CPU a decode
  step costs about what its rows do: 64 real calculator episodes (Qwen2.5-0.5B, float32, 2 cores)
  decoded 1582 row-steps instead of 1971 and sampled in 32 s instead of 40 s.
- static_cache: fixed shapes instead (a StaticKVCache, no compaction, the stop test every
  SYNC_EVERY tokens so the host rarely waits for the device); compile: also torch.compile the decode
  step (CUDA graphs on a GPU: one launch per token instead of hundreds). A CUDA graph replays reads
  and writes at the addresses it was recorded with, so the Decoder keeps its StaticKVCaches from call
  to call in a StaticCachePool (fast/static_cache.py); the GRPO loop holds one Decoder for the run.
- draw: the next-token draw, fast/inverse_cdf.py's by default.
- pack: each call's weights packed for oneDNN on a CPU with bfloat16 instructions
  (fast/cpu_matmul.py's third speed-up), the copy dropped when the call returns.

The shared prefill and the cache rows it and compaction move are fast/prefill.py's; the fixed-shape
cache and the pool of them are fast/static_cache.py's; the packing is fast/cpu_matmul.py's. This
module is the decoding loop.

The turn cache is a layer on top (fast/turn_cache.py's TurnCacheDecoder): this class only marks where
it hooks in, `_leaving` (rows about to leave the batch), `_called` (a call's completions) and
`_prefill`, each a no-op or the plain prefill here, and `episodes()`, the sampler for one batch of
episodes, which here is this Decoder itself.

Greedy tokens equal sampling.generate's, and sampled log-probs are those of the sampled tokens
(tests/test_speedups.py, tests/test_sampling.py). docs/speedups.md says what each part buys.
Shapes: L layers, B rows, K kv heads, S slots, D head dim, V vocabulary.
"""

import functools

import torch

from ..finite import check_drawn
from ..next_token import penalize_repeats, sample_next, seen_tokens
from ..sampling import Completion, check_prompts, completions, eval_mode, generator, stop_tokens
from .cpu_matmul import packed_weights
from .inverse_cdf import inverse_cdf_draw
from .prefill import prefill, select_rows
from .static_cache import StaticCachePool

# sampling.generate's options and their defaults, which a Decoder's generate and stream take
SAMPLING = dict(
    max_new_tokens=64,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    stop_token_ids=None,
    seed=None,
    repetition_penalty=1.0,
)
# fixed shapes: tokens between the host's checks whether every row has stopped
SYNC_EVERY = 8
# compacting: drop the stopped rows once they are this share of the batch
COMPACT_AT = 0.125


def _decode_step(model, tokens, cache):
    """One token for every row: tokens (B,) -> next-token logits (B, V). The part that is compiled."""
    step_mask = torch.ones(tokens.shape[0], 1, dtype=torch.long, device=tokens.device)
    return model(tokens[:, None], step_mask, kv_cache=cache, logits_to_keep=1)[:, -1]


@functools.cache
def _compiled_decode_step(mode: str):
    """torch.compile of _decode_step, built once per mode; the model is an argument, so dynamo keeps
    one compiled graph per model (and batch size) behind it. On a GPU the mode is "reduce-overhead":
    the step is captured as a CUDA graph and replayed for every token."""
    return torch.compile(_decode_step, mode=mode, fullgraph=True)


def decode_step_function(model, compile: bool):
    """_decode_step, or its torch.compile. A CUDA graph writes every replay's logits into the same
    buffer, so the compiled step's are copied out before the next replay overwrites them."""
    if not compile:
        return _decode_step
    compiled = _compiled_decode_step(
        "reduce-overhead" if model.device.type == "cuda" else "default"
    )
    return lambda model, tokens, cache: compiled(model, tokens, cache).clone()


class Decoder:
    """Samples from `model` (module docstring). A fixed-shape Decoder decodes in the caches of its
    `pool` (decoder.pool.release() frees them). compile implies static_cache; static_cache turns
    compaction off (it would change the batch's shape)."""

    def __init__(
        self,
        model,
        *,
        share_prefill: bool = True,
        compact: bool = True,
        static_cache: bool = False,
        compile: bool = False,
        draw=inverse_cdf_draw,
        pack: bool = False,
    ):
        self.model, self.share_prefill, self.draw, self.pack = model, share_prefill, draw, pack
        self.static_cache, self.compile = static_cache or compile, compile
        # all that fixed shapes change in the decoding loop: stopped rows stay, and the host asks
        # whether every row has stopped only every SYNC_EVERY tokens
        self.compacts = compact and not self.static_cache
        self.check_every = SYNC_EVERY if self.static_cache else 1
        self.pool = StaticCachePool()

    @torch.no_grad()
    def _steps(self, prompts, max_new_tokens, num_samples, stop_ids, seed, options):
        """Prefill, then one token per step, the model in eval mode, its weights packed (pack).
        Yields, once per step, (rows, tokens, logprobs, stopped), each (B,) over the rows still in
        the batch: row i holds sequence rows[i] of the len(prompts) * num_samples (prompt-major),
        tokens and logprobs are its draw, stopped says whether it has drawn a stop token (at this
        step or before). Every row is handed to _leaving before it leaves the batch."""
        model, random = self.model, generator(self.model, seed)
        with eval_mode(model), packed_weights(model, on=self.pack):
            # compacting: the prefill's own cache; fixed shapes: one of the pool's, the prefill in it
            room = 0 if self.static_cache else max_new_tokens
            cache, logits, group_of_row = self._prefill(prompts, max_new_tokens, num_samples, room)
            if self.static_cache:
                cache = self.pool.loaded(model, cache, group_of_row, max_new_tokens)
            elif len(group_of_row) > cache.batch_size:
                # one prefill per distinct prompt, copied into its group's rows
                select_rows(cache, group_of_row)
            logits = logits[group_of_row]  # (B, V)
            decode_step = decode_step_function(model, self.compile)
            rows = torch.arange(cache.batch_size, device=model.device)  # (B,)
            penalty = options.pop("repetition_penalty", 1.0)
            sequences = [prompts[s // num_samples] for s in range(len(rows))]
            V = model.config.vocab_size
            seen = seen_tokens(sequences, V, model.device) if penalty != 1 else None  # (B, V)
            stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=model.device)
            stopped = torch.zeros(len(rows), dtype=torch.bool, device=model.device)  # (B,)
            with self.pool.writing(cache):
                for step in range(max_new_tokens):
                    if seen is not None:
                        logits = penalize_repeats(logits, seen, penalty)
                    tokens, logprobs = sample_next(
                        logits, generator=random, draw=self.draw, **options
                    )
                    if seen is not None:
                        seen[torch.arange(len(rows), device=model.device), tokens] = True
                    stopped |= torch.isin(tokens, stop_ids)
                    yield rows, tokens, logprobs, stopped
                    # bool() waits for the device: with fixed shapes only every few tokens
                    last = step == max_new_tokens - 1
                    if last or ((step + 1) % self.check_every == 0 and bool(stopped.all())):
                        break
                    # a stopped row costs a full step: drop the stopped ones once there are enough
                    if self.compacts and int(stopped.sum()) >= COMPACT_AT * len(rows):
                        keep = (~stopped).nonzero()[:, 0]
                        self._leaving(cache, stopped.nonzero()[:, 0], rows[stopped])
                        select_rows(cache, keep)
                        rows, tokens, stopped = rows[keep], tokens[keep], stopped[keep]
                        seen = None if seen is None else seen[keep]
                    logits = decode_step(model, tokens, cache)  # (B, V)
                self._leaving(cache, torch.arange(len(rows), device=model.device), rows)

    def generate(self, prompts: list[list[int]], *, num_samples: int = 1, **options):
        """sampling.generate's drop-in: the same options (SAMPLING) and completions."""
        steps, stop_ids = self._sampling(prompts, num_samples, options)
        rows = ((r.tolist(), t, lp) for r, t, lp, _ in steps)
        outs: list[Completion] = completions(rows, len(prompts) * num_samples, stop_ids)
        self._called(prompts, num_samples, outs)
        return outs

    def stream(self, prompt: list[int], **options):
        """sampling.stream's drop-in: yield one prompt's token ids as they are sampled."""
        steps, _ = self._sampling([prompt], 1, options)
        for step, (_, tokens, logprobs, stopped) in enumerate(steps):
            check_drawn([float(logprobs[0])], step, [0])
            yield int(tokens[0])
            if bool(stopped[0]):
                return

    def episodes(self) -> "Decoder":
        """The sampler rollout.run_episodes calls on each turn's conversations: this one, prefilling
        them whole (a TurnCacheDecoder keeps each row's cache from one turn to the next)."""
        return self

    def _sampling(self, prompts, num_samples, options):
        """A call's steps (_steps) and stop ids, its options (SAMPLING's defaults) checked first."""
        options = {**SAMPLING, **options}
        max_new_tokens, seed = options.pop("max_new_tokens"), options.pop("seed")
        stop_ids = stop_tokens(self.model, options.pop("stop_token_ids"))
        check_prompts(
            self.model, prompts, max_new_tokens=max_new_tokens, num_samples=num_samples, **options
        )
        return self._steps(prompts, max_new_tokens, num_samples, stop_ids, seed, options), stop_ids

    def _leaving(self, cache, index, sequences) -> None:
        """Cache rows `index`, holding the sequences `sequences`, are about to leave the batch."""

    def _called(self, prompts, num_samples, outs) -> None:
        """A generate() call has returned `outs`."""

    def _prefill(self, prompts, max_new_tokens, num_samples, room):
        """prefill() with `room` slots after the longest prompt: (cache, logits, group_of_row)."""
        longest = max(map(len, prompts))
        return prefill(self.model, prompts, longest + room, num_samples, self.share_prefill)
