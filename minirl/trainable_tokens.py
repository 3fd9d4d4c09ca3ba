"""Trainable token rows: new values for a few rows of the embedding, trained beside LoRA (PEFT's
`trainable_token_indices`, whose saved layout this follows).

Why: LoRA adapts the linear layers and leaves the embedding frozen. A token the pretrained model never
used keeps its initial row, and a checkpoint's unused rows are often all the same vector. Qwen2.5-Coder-
0.5B-Instruct's <tool_call> and </tool_call> rows are each identical in direction to 2,251 other rows (396
of them bit for bit): the model has never written a tool call in Qwen's format. With tied embeddings
the output layer reads the same rows, so whatever hidden state LoRA learns, the logit of <tool_call> is
that of 2,251 other tokens: sampling picks one of them (a Thai word, a stray CJK piece) nearly every time,
and no amount of LoRA training can single the tag out. Training the tag's own row (input and, tied,
output) can.

    add_trainable_tokens(model, [151657, 151658])      # <tool_call>, </tool_call>
    untrained_tokens(model, candidate_ids)              # which of these rows are such placeholders

The row values start as the originals (nothing changes until training moves them), or as given: SFT
starts a placeholder row at the mean embedding of the token's text spelled in ordinary tokens ("<",
"tool", "_call", ">"), the usual start for a new token, which sets it apart from its clones at once.
They are kept in float32. In a forward pass the embedding looks up the new rows for those ids; the output layer adds
h · (new − old)ᵀ to those ids' logits, k columns instead of a new (V, C) weight. Shapes: V vocab,
C hidden, k trained rows.
"""

import torch
import torch.nn.functional as F
from torch import nn

NEAR_DUPLICATE_COSINE = 0.999  # rows this close in direction are the same vector up to quantization
UNTRAINED_NEIGHBOURS = 8  # a row with at least this many near-duplicates is an unused placeholder


class TokenAdapter(nn.Module):
    """The new values of k rows of a (V, C) weight: `trainable_tokens_delta` (k, C), PEFT's name.
    They start as the rows themselves, or as `init` (k, C)."""

    def __init__(
        self, weight: torch.Tensor, token_ids: list[int], init: torch.Tensor | None = None
    ):
        super().__init__()
        self.token_ids = list(token_ids)
        start = weight.detach()[self.token_ids] if init is None else init
        start = start.detach().float().clone().to(weight.device)  # (k, C)
        self.trainable_tokens_delta = nn.Parameter(start)
        self.enabled = True
        self.merged = False  # the new values have been written into the weight itself

    def index(self, device) -> torch.Tensor:
        return torch.tensor(self.token_ids, device=device)

    def delta(self, weight: torch.Tensor) -> torch.Tensor:
        """new − old (k, C), float32: what the output layer adds to the trained ids' logits."""
        return self.trainable_tokens_delta - weight[self.index(weight.device)].float()

    @property
    def active(self) -> bool:
        return self.enabled and not self.merged


class TokenEmbedding(nn.Embedding):
    """nn.Embedding (same `weight`, same state_dict key) that looks up the adapter's rows for its ids."""

    def __init__(self, base: nn.Embedding, token_ids: list[int], init: torch.Tensor | None = None):
        nn.Module.__init__(self)  # not Embedding.__init__: that would allocate a new weight
        self.num_embeddings, self.embedding_dim = base.num_embeddings, base.embedding_dim
        self.padding_idx, self.max_norm, self.norm_type = (
            base.padding_idx,
            base.max_norm,
            base.norm_type,
        )
        self.scale_grad_by_freq, self.sparse = base.scale_grad_by_freq, base.sparse
        self.weight = base.weight
        self.token_adapter = TokenAdapter(base.weight, token_ids, init)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = F.embedding(ids, self.weight)  # (B, T, C)
        adapter = self.token_adapter
        if not adapter.active:
            return out
        slot = torch.full((self.num_embeddings,), -1, dtype=torch.long, device=ids.device)
        slot[adapter.index(ids.device)] = torch.arange(len(adapter.token_ids), device=ids.device)
        which = slot[ids]  # (B, T): the adapter row of each token, -1 for the others
        rows = adapter.trainable_tokens_delta[which.clamp(min=0)].to(out.dtype)  # (B, T, C)
        return torch.where((which >= 0)[..., None], rows, out)


class TokenHead(nn.Linear):
    """The tied output layer (same `weight`) with the embedding's adapter: logits of the trained ids
    get h · (new − old)ᵀ added. The adapter is held in a list so it is not a second state_dict entry."""

    def __init__(self, base: nn.Linear, adapter: TokenAdapter):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self._adapter = [adapter]

    @property
    def token_adapter(self) -> TokenAdapter:
        return self._adapter[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.with_trained_rows(x, F.linear(x, self.weight, self.bias))

    def with_trained_rows(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y = x Wᵀ (..., V), with h · (new − old)ᵀ added to the trained ids' logits."""
        adapter = self.token_adapter
        if not adapter.active:
            return y
        extra = (x.float() @ adapter.delta(self.weight).T).to(y.dtype)  # (..., k)
        # y is the product's fresh output: autograd allows adding in place
        return y.index_add_(-1, adapter.index(y.device), extra)


def add_trainable_tokens(
    model, token_ids: list[int], init: torch.Tensor | None = None
) -> TokenAdapter:
    """Make the embedding rows of `token_ids` trainable (and the output rows, which are the same
    weight when the embeddings are tied), starting from the rows or from `init` (k, C), in the order
    of sorted(token_ids). In place; returns the adapter."""
    if isinstance(model.model.embed_tokens, TokenEmbedding):
        raise ValueError("the model already has trainable token rows")
    V = model.config.vocab_size
    bad = [t for t in token_ids if not (isinstance(t, int) and 0 <= t < V)]
    if bad or not token_ids or len(set(token_ids)) != len(token_ids):
        raise ValueError(
            f"trainable token ids must be distinct ints in [0, {V}), got {list(token_ids)}"
        )
    if init is not None and tuple(init.shape) != (len(token_ids), model.config.hidden_size):
        raise ValueError(
            f"init must be ({len(token_ids)}, {model.config.hidden_size}), got {tuple(init.shape)}"
        )
    embedding = TokenEmbedding(model.model.embed_tokens, sorted(token_ids), init)
    model.model.embed_tokens = embedding
    if model.config.tie_word_embeddings:
        model.lm_head = TokenHead(model.lm_head, embedding.token_adapter)
    embedding.token_adapter.trainable_tokens_delta.requires_grad_(True)
    return embedding.token_adapter


def token_adapter(model) -> TokenAdapter | None:
    embedding = model.model.embed_tokens
    return embedding.token_adapter if isinstance(embedding, TokenEmbedding) else None


def output_rows(model) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(ids (k,), new − old (k, C)) for the chunked log-prob functions (losses.py), which multiply by the
    output weight themselves; None when the output layer has no active trained rows."""
    head = model.lm_head
    if not isinstance(head, TokenHead) or not head.token_adapter.active:
        return None
    return head.token_adapter.index(head.weight.device), head.token_adapter.delta(head.weight)


@torch.no_grad()
def write_rows(model):
    """Write the adapter's rows into the embedding weight itself (merge) and mark it merged."""
    adapter = token_adapter(model)
    if adapter is not None and not adapter.merged:
        weight = model.model.embed_tokens.weight
        weight[adapter.index(weight.device)] = adapter.trainable_tokens_delta.to(weight.dtype)
        adapter.merged = True


def remove_trainable_tokens(model):
    """Write the rows in, then put plain modules back (the merged rows become part of the model)."""
    adapter = token_adapter(model)
    if adapter is None:
        return model
    write_rows(model)
    embedding = nn.Embedding(model.config.vocab_size, model.config.hidden_size, device="meta")
    embedding.weight = model.model.embed_tokens.weight
    model.model.embed_tokens = embedding
    if isinstance(model.lm_head, TokenHead):
        head = nn.Linear(
            model.config.hidden_size, model.config.vocab_size, bias=False, device="meta"
        )
        head.weight = model.lm_head.weight
        model.lm_head = head
    return model


@torch.no_grad()
def spelled_rows(model, tokenizer, token_ids: list[int]) -> torch.Tensor:
    """(k, C): for each token, the mean embedding row of its text written in ordinary tokens."""
    weight = model.model.embed_tokens.weight
    rows = []
    for token in token_ids:
        pieces = [t for t in tokenizer.spell(tokenizer.decode([token])) if t != token]
        rows.append(weight[pieces].float().mean(dim=0) if pieces else weight[token].float())
    return torch.stack(rows)


@torch.no_grad()
def untrained_tokens(model, token_ids) -> dict[int, int]:
    """Of `token_ids`, those whose embedding row is an unused placeholder: {id: how many other rows
    share its direction (cosine >= 0.999)}, for the ids with at least UNTRAINED_NEIGHBOURS of them."""
    ids = sorted(set(token_ids))
    if not ids:
        return {}
    weight = model.model.embed_tokens.weight.float()  # (V, C)
    rows = weight[ids]  # (n, C)
    norms = (weight.norm(dim=1)[:, None] * rows.norm(dim=1)[None]).clamp(min=1e-12)  # (V, n)
    cosine = (weight @ rows.T) / norms  # (V, n)
    # not counting the row itself
    neighbours = (cosine >= NEAR_DUPLICATE_COSINE).sum(dim=0) - 1  # (n,)
    return {t: int(n) for t, n in zip(ids, neighbours.tolist()) if n >= UNTRAINED_NEIGHBOURS}
