"""Drop-in part of fast/decoder.py: the prefill that runs each distinct prompt once (share_prefill).

`prefill` runs each distinct prompt once (its G samples copy its cache rows), a prefix every prompt
begins with once for all of them, and prompts of mixed lengths in passes of similar lengths placed
in one cache; sampling.generate prefills every row whole. `select_rows` keeps or repeats a cache's
rows in place: the copy of a prompt into its group's rows, and the Decoder's compaction (stopped
rows leave the batch). Shapes: L layers, B rows, K kv heads, S slots, D head dim, V vocabulary.
"""

import torch

from ..kv_cache import KVCache
from ..sampling import left_padded
from .length_passes import passes
from .prefixes import common_prefix_length
from .static_cache import StaticKVCache

# tokens every prompt must share before their prefill is shared
MIN_SHARED_PREFIX = 16


def place(cache: KVCache, part: KVCache, rows: torch.Tensor, offset: int):
    """Copy `part`'s filled slots into rows `rows` of `cache`, part's slot s to slot offset + s (a
    one-row part goes to every row). Attention reads keys by the mask, not by their order, so a
    row's slots need not be where a single left-padded batch would have put them. The caller sets
    cache.length."""
    S = part.length
    cache.keys[:, rows, :, offset : offset + S] = part.keys[:, :, :, :S]
    cache.values[:, rows, :, offset : offset + S] = part.values[:, :, :, :S]
    cache.key_mask[rows, offset : offset + S] = part.key_mask[:, :S]
    cache.next_pos[rows] = part.next_pos


def select_rows(cache: KVCache, rows: torch.Tensor):
    """Keep (or repeat) a KVCache's rows by index, in place: drop finished sequences, or copy a
    prefilled prompt into the G rows of its group. Only the filled slots are copied, one layer at a
    time; the others are left unset (torch.empty: nothing reads a slot before it is written).
    Dropping rows (`rows` ascending, fewer than the cache holds) moves the kept ones to the front of
    the same buffers, so the cache never exists twice: the peak is the cache and one layer's copy
    of the kept rows (counted in run/memory.py), where a new cache would add up to 2.3 times its
    own size. A StaticKVCache keeps its rows (its shapes are fixed): load() refills it."""
    if isinstance(cache, StaticKVCache):
        raise RuntimeError(
            "a StaticKVCache keeps its rows (its shapes are fixed); load() refills it"
        )
    S, n = cache.length, len(rows)
    dropping = n <= cache.batch_size and bool((rows[1:] > rows[:-1]).all())
    # repeating each row in a run of its own (a prompt into its group): copied without a gather
    runs = None
    if not dropping and bool((rows[1:] >= rows[:-1]).all()):
        sources, counts = torch.unique_consecutive(rows, return_counts=True)
        runs = list(zip(sources.tolist(), counts.cumsum(0).tolist(), counts.tolist()))
    if dropping:
        keys, values = cache.keys, cache.values
    else:
        shape = (cache.keys.shape[0], n, *cache.keys.shape[2:])
        keys = torch.empty(shape, dtype=cache.keys.dtype, device=cache.keys.device)
        values = torch.empty_like(keys)
    for layer in range(keys.shape[0]):
        if runs is not None:
            for source, end, count in runs:
                keys[layer, end - count : end, :, :S] = cache.keys[layer, source, :, :S]
                values[layer, end - count : end, :, :S] = cache.values[layer, source, :, :S]
            continue
        # row i <- row rows[i]: the right side is gathered (one layer's copy) before it is written
        keys[layer, :n, :, :S] = cache.keys[layer, rows, :, :S]
        values[layer, :n, :, :S] = cache.values[layer, rows, :, :S]
    cache.keys, cache.values = keys[:, :n], values[:, :n]
    cache.key_mask = cache.key_mask[rows]
    cache.next_pos = cache.next_pos[rows]


def prefill(model, prompts, max_len, num_samples, share: bool):
    """Run the prompts through the model into a KVCache of max_len slots. Returns the cache, the
    logits of each cache row's last position (B, V) and, for each of the len(prompts) * num_samples
    sequences (prompt-major), the cache row it starts from. share: one row per distinct prompt, a
    prefix every prompt begins with run once for all rows, and passes of similar lengths, placed in
    one cache with every row's last token in the same slot; else one row per sequence, one pass."""
    device = model.device
    if not share:
        rows = [list(p) for p in prompts for _ in range(num_samples)]
        cache = KVCache(model.config, len(rows), max_len, model.dtype, device)
        return cache, run_prompts(model, rows, cache), torch.arange(len(rows), device=device)
    distinct = list(dict.fromkeys(map(tuple, prompts)))
    first_row = {p: i for i, p in enumerate(distinct)}
    group_of_row = torch.tensor([first_row[tuple(p)] for p in prompts], device=device)
    group_of_row = group_of_row.repeat_interleave(num_samples)
    shared = 0
    if len(distinct) > 1:
        shared = common_prefix_length(distinct, limit=min(map(len, distinct)) - 1)
    shared = shared if shared >= MIN_SHARED_PREFIX else 0
    prefix = None
    if shared:
        prefix = KVCache(model.config, 1, shared, model.dtype, device)
        model.model(torch.tensor([distinct[0][:shared]], device=device), kv_cache=prefix)
    rest = [p[shared:] for p in distinct]
    longest = max(len(p) for p in rest)
    groups = passes([len(p) for p in rest], len(rest))
    if len(groups) == 1:
        cache = _cache_after(model, prefix, len(rest), max_len)
        return cache, run_prompts(model, rest, cache), group_of_row
    cache = KVCache(model.config, len(rest), max_len, model.dtype, device)
    logits = torch.empty(len(rest), model.config.vocab_size, dtype=model.dtype, device=device)
    for rows in groups:
        part_len = max(len(rest[i]) for i in rows)
        part = _cache_after(model, prefix, len(rows), shared + part_len)
        index = torch.tensor(rows, device=device)
        logits[index] = run_prompts(model, [rest[i] for i in rows], part)
        # every row's last token in slot shared + longest - 1
        place(cache, part, index, longest - part_len)
    cache.length = shared + longest
    return cache, logits, group_of_row


def _cache_after(model, prefix: KVCache | None, rows: int, max_len: int) -> KVCache:
    """A cache of `rows` rows that starts with the shared prefix's slots (or empty without one)."""
    cache = KVCache(model.config, rows, max_len, model.dtype, model.device)
    if prefix is not None:
        place(cache, prefix, torch.arange(rows, device=model.device), 0)
        cache.length = prefix.length
    return cache


def run_prompts(model, prompts: list[list[int]], cache: KVCache) -> torch.Tensor:
    """The prompts, left-padded into one batch, run on top of `cache`: the logits of each one's last
    position (B, V)."""
    ids, mask = left_padded(prompts, model.device)
    return model(ids, mask, kv_cache=cache, logits_to_keep=1)[:, -1]
