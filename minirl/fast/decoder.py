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
  to call (one per batch size, reused while long enough); the GRPO loop holds one for the run.
- draw: the next-token draw, fast/inverse_cdf.py's by default.
- pack: each call's weights packed for oneDNN on a CPU with bfloat16 instructions
  (fast/cpu_matmul.py's third speed-up), the copy dropped when the call returns.

The shared prefill and the cache rows it and compaction move are fast/prefill.py's; the fixed-shape
cache is fast/static_cache.py's. This module is the decoding loop and what it keeps between calls.

The turn cache is a layer on top (fast/turn_cache.py's TurnCacheDecoder): this class only marks where
it hooks in, `_leaving` (rows about to leave the batch), `_called` (a call's completions) and
`_prefill`, each a no-op or the plain prefill here, and `episodes()`, the sampler for one batch of
episodes, which here is this Decoder itself.

Greedy tokens equal sampling.generate's, and sampled log-probs are those of the sampled tokens
(tests/test_speedups.py, tests/test_sampling.py). docs/speedups.md says what each part buys.
Shapes: L layers, B rows, K kv heads, S slots, D head dim, V vocabulary.
"""

import contextlib
import functools

import torch

from ..kv_cache import KVCache
from ..next_token import sample_next
from ..sampling import Completion, check_prompts, completions, eval_mode, generator, stop_tokens
from .cpu_matmul import packed_weights
from .inverse_cdf import inverse_cdf_draw
from .prefill import prefill, select_rows
from .static_cache import StaticKVCache

# fixed shapes: tokens between the host's checks whether every row has stopped
SYNC_EVERY = 8
# compacting: drop the stopped rows once they are this share of the batch
COMPACT_AT = 0.125
# fixed shapes: caches a Decoder keeps (one per batch size, the least recently used goes)
KEPT_CACHES = 4
# fixed shapes: cache lengths are rounded up to this, so similar calls reuse one step
SLOTS_MULTIPLE = 256


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


class Decoder:
    """Samples from `model` (module docstring), and owns what decoding keeps between calls.

    A fixed-shape Decoder keeps its StaticKVCaches in `caches`, one per batch size, at most
    KEPT_CACHES (the least recently used goes), each reused while it is long enough and never by two
    loops at once: while a stream() on it is unfinished, another call decodes in a fresh cache it
    does not keep. release() gives them back. compile implies static_cache; static_cache turns
    compaction off (it would change the batch's shape).
    """

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
        self.model, self.share_prefill, self.draw = model, share_prefill, draw
        # each call's weights packed for oneDNN (cpu_matmul.packed_weights; where it packs)
        self.pack = pack
        self.static_cache = static_cache or compile
        self.compile = compile
        # all that fixed shapes change in the decoding loop: stopped rows stay, and the host asks
        # whether every row has stopped only every SYNC_EVERY tokens
        self.compacts = compact and not self.static_cache
        self.check_every = SYNC_EVERY if self.static_cache else 1
        # (rows, dtype, device) -> cache, least recently used first
        self.caches: dict[tuple, StaticKVCache] = {}
        # the caches a decoding loop is writing now
        self._busy: set[KVCache] = set()

    def _steps(self, prompts, max_new_tokens, num_samples, stop_ids, random, **options):
        """Prefill, then one token per step. Yields, once per step, (rows, tokens, logprobs, stopped),
        each (B,) over the rows still in the batch: row i holds sequence rows[i] of the
        len(prompts) * num_samples (prompt-major), tokens and logprobs are its draw, stopped says
        whether it has drawn a stop token (at this step or before). Every row is handed to
        _leaving before it leaves the batch."""
        model = self.model
        cache, logits = self._prefilled_cache(prompts, max_new_tokens, num_samples)  # (B, V)
        decode_step = self._decode_step_function()
        rows = torch.arange(cache.batch_size, device=model.device)  # (B,)
        stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=model.device)
        stopped = torch.zeros(len(rows), dtype=torch.bool, device=model.device)  # (B,)
        self._busy.add(cache)
        try:
            for step in range(max_new_tokens):
                tokens, logprobs = sample_next(logits, generator=random, draw=self.draw, **options)
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
                logits = decode_step(model, tokens, cache)  # (B, V)
            self._leaving(cache, torch.arange(len(rows), device=model.device), rows)
        finally:
            self._busy.discard(cache)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        stop_token_ids: list[int] | None = None,
        seed: int | None = None,
        num_samples: int = 1,
    ) -> list[Completion]:
        """sampling.generate's drop-in: the same arguments and completions."""
        model = self.model
        options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        check_prompts(
            model, prompts, max_new_tokens=max_new_tokens, num_samples=num_samples, **options
        )
        stop_ids = stop_tokens(model, stop_token_ids)
        with eval_mode(model), self._packed():
            steps = self._steps(
                prompts, max_new_tokens, num_samples, stop_ids, generator(model, seed), **options
            )
            rows = ((r.tolist(), t, lp) for r, t, lp, _ in steps)
            outs = completions(rows, len(prompts) * num_samples, stop_ids)
        self._called(prompts, num_samples, outs)
        return outs

    @torch.no_grad()
    def stream(
        self,
        prompt: list[int],
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        stop_token_ids: list[int] | None = None,
        seed: int | None = None,
    ):
        """sampling.stream's drop-in: yield one prompt's token ids as they are sampled."""
        model = self.model
        options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        check_prompts(model, [prompt], max_new_tokens=max_new_tokens, num_samples=1, **options)
        stop_ids = stop_tokens(model, stop_token_ids)
        with eval_mode(model), self._packed():
            random = generator(model, seed)
            for _, tokens, _, stopped in self._steps(
                [prompt], max_new_tokens, 1, stop_ids, random, **options
            ):
                yield int(tokens[0])
                if bool(stopped[0]):
                    return

    def _packed(self):
        """The weights packed for this call (pack=True), or nothing."""
        return packed_weights(self.model) if self.pack else contextlib.nullcontext()

    def release(self):
        """Free the StaticKVCaches kept between calls (a loop still running finishes in its own)."""
        self.caches.clear()

    def episodes(self) -> "Decoder":
        """The sampler for one batch of episodes, which rollout.run_episodes calls once per turn on
        each conversation so far: this Decoder, which prefills every conversation whole
        (TurnCacheDecoder's keeps each row's cache from one turn to the next)."""
        return self

    def _leaving(self, cache, index, sequences) -> None:
        """Cache rows `index`, holding the sequences `sequences`, are about to leave the batch."""

    def _called(self, prompts, num_samples, outs) -> None:
        """A generate() call has returned `outs`."""

    def _prefilled_cache(self, prompts, max_new_tokens, num_samples):
        """The cache decoding writes into, holding the len(prompts) * num_samples rows, and their
        next-token logits (B, V). Compacting: the prefill's own cache, with room for the new tokens.
        Fixed shapes: a StaticKVCache the prefill is copied into."""
        model = self.model
        if not self.static_cache:
            cache, logits, group_of_row = self._prefill(
                prompts, max_new_tokens, num_samples, room=max_new_tokens
            )
            # one prefill per distinct prompt, copied into its group's rows
            if len(group_of_row) > cache.batch_size:
                select_rows(cache, group_of_row)
            return cache, logits[group_of_row]
        prefilled, logits, group_of_row = self._prefill(
            prompts, max_new_tokens, num_samples, room=0
        )
        slots = -(-(prefilled.length + max_new_tokens) // SLOTS_MULTIPLE) * SLOTS_MULTIPLE
        slots = min(slots, model.config.max_position_embeddings)
        cache = self._static_cache(len(group_of_row), slots)
        cache.load(prefilled, group_of_row)
        return cache, logits[group_of_row]

    def _prefill(self, prompts, max_new_tokens, num_samples, room):
        """prefill() into a cache with `room` slots after the longest prompt: (cache, logits,
        group_of_row)."""
        longest = max(map(len, prompts))
        return prefill(self.model, prompts, longest + room, num_samples, self.share_prefill)

    def _static_cache(self, rows: int, slots: int) -> StaticKVCache:
        """The kept cache for this batch size, or a new one kept in its place when none is long enough.
        While the kept one is being written (a stream() not yet finished), a fresh one, not kept."""
        model = self.model
        key = (rows, model.dtype, model.device)
        cache = self.caches.pop(key, None)
        if cache is not None and cache in self._busy:
            self.caches[key] = cache
            return StaticKVCache(model.config, rows, slots, model.dtype, model.device)
        if cache is None or cache.max_len < slots:
            # give its memory back before allocating the longer one
            del cache
            cache = StaticKVCache(model.config, rows, slots, model.dtype, model.device)
        # now the most recently used
        self.caches[key] = cache
        idle = [k for k, kept in self.caches.items() if kept not in self._busy]  # oldest first
        for old in idle[: max(0, len(idle) - KEPT_CACHES)]:
            del self.caches[old]
        return cache

    def _decode_step_function(self):
        """_decode_step, or its torch.compile. A CUDA graph writes every replay's logits into the same
        buffer, so the compiled step's are copied out before the next replay overwrites them."""
        if not self.compile:
            return _decode_step
        mode = "reduce-overhead" if self.model.device.type == "cuda" else "default"
        compiled = _compiled_decode_step(mode)
        return lambda model, tokens, cache: compiled(model, tokens, cache).clone()
