"""Drop-in for re-reading the conversation every turn: each episode's KV cache kept between turns.

rollout.run_episodes samples all unfinished episodes turn after turn, and each turn hands the
sampler the whole conversation so far (the prompt, the earlier turns, the tool results): the
plain sampler prefills all of it again, so an episode of 4 turns reads its prompt 4 times and its
first turn 3 times. Here a TurnCacheDecoder gives each batch of episodes (episodes()) a
Decoder of its own that holds a `KeptRows`: when a row leaves the decoding batch (it stopped and is compacted away, or the turn is
over) the keys and values of its real tokens are copied out, with the ids of those tokens. At the
next call each prompt starts from the kept row it shares the longest prefix with, and only the rest
runs through the model: the stop token that ended the turn if it was never fed back, then the
tool results and the next generation prompt (chat.tool_turn_text).

The match is checked token by token, so a prompt that continues nothing kept is prefilled whole:
what is sampled never depends on the match, only the work does. Greedy episodes are token for
token the plain ones, and the draws use the random stream as the same Decoder without kept rows
does (tests/test_turn_cache.py).

Layout of a later turn's cache: row i's n_i kept slots end at slot P = max n_i, its s_i new tokens
are left-padded into slots [P, P + T), T = max s_i, and the decoded tokens follow; the padding
holes between are masked out (key_mask), and positions count real tokens only (model.py). The
cache is allocated for this turn (P + T + max_new_tokens slots), never for the whole context. A
turn whose layout would need more slots than the model's context prefills its prompts whole.

Memory: a kept row holds only its real slots. While rows are copied out at the end of a turn, and
while the next turn's cache is filled from them, both exist: sampling an episode batch peaks at
about twice its cache (run/memory.py counts it), where the plain sampler's peak is the prefill of
every whole conversation. Kept rows live as long as the Decoder of the batch, i.e. one
run_episodes call. Shapes: L layers, B rows, K kv heads, n kept slots, D head dim, V vocabulary.
"""

import copy
from dataclasses import dataclass

import torch

from ..kv_cache import KVCache
from .decoder import Decoder
from .prefill import run_prompts


@dataclass
class KeptRow:
    # the tokens whose keys and values the row holds: slot s is token s, at position s
    tokens: list[int]
    keys: torch.Tensor  # (L, K, n, D)
    values: torch.Tensor  # (L, K, n, D)


class KeptRows:
    """The rows of one Decoder's last call, kept for its next (module docstring). A call goes:
    start() places the kept rows in a cache for the new prompts (and lets them go), keep() copies
    out each row as it leaves the batch, label() names the tokens the copied rows hold once the
    call's completions are known."""

    def __init__(self):
        self.rows: list[KeptRow] = []
        # sequence -> (keys, values) of the rows that left the batch in this call
        self.leaving: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(self, cache: KVCache, index: torch.Tensor, sequences: torch.Tensor) -> None:
        """Copy out the real slots of the cache rows `index` (holding the sequences `sequences`),
        in slot order, which is token order in every cache the Decoder fills."""
        for row, sequence in zip(index.tolist(), sequences.tolist()):
            real = cache.key_mask[row].nonzero()[:, 0]  # (n,)
            keys = cache.keys[:, row][:, :, real]  # (L, K, n, D)
            self.leaving[sequence] = keys, cache.values[:, row][:, :, real]

    def label(self, prompts: list[list[int]], num_samples: int, outs) -> None:
        """After the call: each copied row's tokens, its prompt and then the sampled tokens it was
        fed. A row that kept decoding after its stop token holds tokens its completion does not
        have; those slots are cut."""
        for sequence, (keys, values) in self.leaving.items():
            tokens = list(prompts[sequence // num_samples]) + outs[sequence].tokens
            tokens = tokens[: keys.shape[2]]
            n = len(tokens)
            self.rows.append(KeptRow(tokens, keys[:, :, :n], values[:, :, :n]))
        self.leaving = {}

    def start(self, model, prompts, num_samples: int, max_new_tokens: int, room: int):
        """Every sequence (prompt-major) started from its best kept row: a cache holding each
        row's kept slots, with room for the tokens that row does not hold and `room` more, and
        those tokens, which the caller runs on top (B lists). None when nothing is kept (a first
        turn) or the layout would not fit the model's context: the caller then prefills the
        prompts whole. The kept rows are let go either way, and so is whatever an unfinished call
        copied out."""
        kept, self.rows, self.leaving = self.rows, [], {}
        rows = [list(p) for p in prompts for _ in range(num_samples)]
        if not kept:
            return None
        starts = best_starts(kept, rows)
        # from here on a kept row's memory goes once the last row starting from it is placed
        del kept
        lengths = [n for _, n in starts]
        P = max(lengths)
        T = max(len(row) - n for row, n in zip(rows, lengths))
        if P + T + max_new_tokens > model.config.max_position_embeddings:
            return None
        cache = KVCache(model.config, len(rows), P + T + room, model.dtype, model.device)
        for i, n in enumerate(lengths):
            source, starts[i] = starts[i][0], None
            if n:
                cache.keys[:, i, :, P - n : P] = source.keys[:, :, :n]
                cache.values[:, i, :, P - n : P] = source.values[:, :, :n]
                cache.key_mask[i, P - n : P] = True
                cache.next_pos[i] = n
            del source
        cache.length = P
        return cache, [row[n:] for row, n in zip(rows, lengths)]


def best_starts(kept: list[KeptRow], rows: list[list[int]]) -> list[tuple[KeptRow, int]]:
    """For each row of tokens, the kept row sharing the longest prefix with it, and how many of its
    slots to use: that prefix, short of the row's last token (its logits start the decoding)."""
    M = max(len(k.tokens) for k in kept)
    kept_ids = torch.full((len(kept), M), -1, dtype=torch.long)  # (R, M)
    for r, k in enumerate(kept):
        kept_ids[r, : len(k.tokens)] = torch.tensor(k.tokens)
    starts = []
    for tokens in rows:
        m = min(len(tokens) - 1, M)
        same = kept_ids[:, :m] == torch.tensor(tokens[:m], dtype=torch.long)  # (R, m)
        shared = same.long().cumprod(1).sum(1)  # (R,)
        best = int(shared.argmax())
        starts.append((kept[best], int(shared[best])))
    return starts


class TurnCacheDecoder(Decoder):
    """A Decoder (fast/decoder.py) whose episodes() sampler keeps each row's cache from one call (turn)
    to the next and prefills only the tokens it does not hold (module docstring). Its caches and
    settings are the Decoder's; the kept rows, `kept`, belong to one batch of episodes (None on the
    Decoder a run holds)."""

    def __init__(self, model, **options):
        super().__init__(model, **options)
        self.kept: KeptRows | None = None

    def episodes(self) -> "TurnCacheDecoder":
        """A Decoder like this one (sharing its kept StaticKVCaches) with kept rows of its own."""
        episodes = copy.copy(self)
        episodes.kept = KeptRows()
        return episodes

    def _leaving(self, cache, index, sequences) -> None:
        if self.kept is not None:
            self.kept.keep(cache, index, sequences)

    def _called(self, prompts, num_samples, outs) -> None:
        if self.kept is not None:
            self.kept.label(prompts, num_samples, outs)

    def _prefill(self, prompts, max_new_tokens, num_samples, room):
        """Each sequence started from its kept row when one fits (KeptRows.start), and only the
        tokens that row does not hold run, left-padded into one batch; else the plain prefill."""
        if self.kept is not None:
            started = self.kept.start(self.model, prompts, num_samples, max_new_tokens, room)
            if started is not None:
                cache, new_tokens = started
                logits = run_prompts(self.model, new_tokens, cache)  # (B, V)
                return cache, logits, torch.arange(len(new_tokens), device=self.model.device)
        return super()._prefill(prompts, max_new_tokens, num_samples, room)
