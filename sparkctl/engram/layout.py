"""The Engram row layout: bucket sizes (primes), each layer's hash heads, and each rank's rows.

Pure arithmetic, no I/O. The rule is the model's own:

* A layer has one *hash head* per (n-gram order, head): orders ``2..engram_max_ngram_size``,
  ``engram_n_heads`` heads per order, so ``H = (max_ngram_size - 1) * n_heads`` per layer.
* Each hash head owns a bucket range whose size is the smallest prime ``>= engram_vocab_size``
  not used before; primes are drawn layer by layer, order by order, head by head, and never reused.
* A layer's table is its bucket ranges concatenated in that order.
* Ranks get whole heads, contiguous, by the engine's rule: with ``H`` heads and ``S`` ranks each
  rank takes ``ceil(H / S)`` consecutive heads, the last may take fewer, and a layout that leaves a
  rank with no head is refused. (On every ``H % S == 0`` case this is the simple ``H / S`` split.)

With the published config this reproduces the TP4 vLLM report Appendix B exactly (see tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Deterministic Miller-Rabin: these bases decide every n < 3.3e24, far beyond any vocab size.
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


class LayoutError(ValueError):
    """The config and the tensor-parallel size do not give a valid layout (the CLI exits 2)."""


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_prime(n: int) -> int:
    """The smallest prime >= n."""
    candidate = max(n, 2)
    while not is_prime(candidate):
        candidate += 1
    return candidate


@dataclass(frozen=True)
class EngramConfig:
    """The Engram keys of ``config.json``; ``num_embeddings`` maps layer id -> rows the config states."""

    layer_ids: tuple[int, ...]
    num_embeddings: dict[int, int]
    max_ngram_size: int
    n_heads: int
    vocab_size: int
    head_dim: int | None = None
    source: str = "config.json"  # for messages

    @property
    def heads_per_layer(self) -> int:
        return (self.max_ngram_size - 1) * self.n_heads


@dataclass(frozen=True)
class RowRange:
    """Rows ``[start, end)`` of a layer's table, and the hash heads ``[first_head, end_head)`` they hold."""

    start: int
    end: int
    first_head: int
    end_head: int

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class LayerLayout:
    layer: int
    heads: tuple[int, ...]  # bucket-range size of every hash head, in table order
    ranks: tuple[RowRange, ...]

    @property
    def rows(self) -> int:
        return sum(self.heads)


@dataclass(frozen=True)
class EngramLayout:
    tp: int
    layers: tuple[LayerLayout, ...] = field(default=())

    def layer(self, layer_id: int) -> LayerLayout:
        for item in self.layers:
            if item.layer == layer_id:
                return item
        raise KeyError(layer_id)


def bucket_sizes(config: EngramConfig) -> dict[int, list[int]]:
    """Layer id -> the bucket size of each hash head (order by order, head by head)."""
    out: dict[int, list[int]] = {}
    last = None
    for layer in config.layer_ids:
        sizes = []
        for _order in range(2, config.max_ngram_size + 1):
            for _head in range(config.n_heads):
                # "smallest prime above vocab_size - 1 not used before": primes only grow, so the
                # next unused one is the next prime after the last one drawn.
                prime = next_prime(config.vocab_size if last is None else max(config.vocab_size, last + 1))
                sizes.append(prime)
                last = prime
        out[layer] = sizes
    return out


def split_heads(n_heads: int, tp: int) -> list[tuple[int, int]]:
    """The engine's rule: rank r takes heads ``[r*k, min((r+1)*k, H))`` with ``k = ceil(H/S)``.

    Raises LayoutError when a rank would get no head.
    """
    if tp < 1:
        raise LayoutError(f"tensor_parallel must be at least 1, got {tp}")
    per_rank = -(-n_heads // tp)
    spans = []
    for rank in range(tp):
        first, end = rank * per_rank, min((rank + 1) * per_rank, n_heads)
        if first >= end:
            used = -(-n_heads // per_rank)
            raise LayoutError(
                f"TP{tp} leaves rank {rank} without an Engram head: {n_heads} hash heads per layer at "
                f"ceil({n_heads}/{tp}) = {per_rank} per rank fill only {used} rank(s); "
                f"use a tensor_parallel size that gives every rank a head (e.g. one dividing {n_heads})"
            )
        spans.append((first, end))
    return spans


def plan_layout(config: EngramConfig, tp: int) -> EngramLayout:
    """Every layer's heads and every rank's row range; checks the config's stated row counts."""
    if config.max_ngram_size < 2:
        raise LayoutError(f"{config.source}: engram_max_ngram_size must be at least 2 (n-gram orders start at 2), got {config.max_ngram_size}")
    if config.n_heads < 1:
        raise LayoutError(f"{config.source}: engram_n_heads must be at least 1, got {config.n_heads}")
    if config.vocab_size < 1:
        raise LayoutError(f"{config.source}: engram_vocab_size must be at least 1, got {config.vocab_size}")
    sizes = bucket_sizes(config)
    spans = split_heads(config.heads_per_layer, tp)
    layers = []
    for layer in config.layer_ids:
        heads = sizes[layer]
        bounds = [0]
        for size in heads:
            bounds.append(bounds[-1] + size)
        stated = config.num_embeddings.get(layer)
        if stated is not None and stated != bounds[-1]:
            raise LayoutError(
                f"{config.source}: engram_num_embeddings for layer {layer} is {stated}, but the layout rule "
                f"({config.max_ngram_size - 1} n-gram orders x {config.n_heads} heads, primes >= {config.vocab_size}) "
                f"gives {bounds[-1]} rows; the config and the rule disagree"
            )
        ranks = tuple(RowRange(bounds[a], bounds[b], a, b) for a, b in spans)
        layers.append(LayerLayout(layer=layer, heads=tuple(heads), ranks=ranks))
    return EngramLayout(tp=tp, layers=tuple(layers))


def shard_name(layer: int, rank: int, tp: int) -> str:
    return f"engram-l{layer}-r{rank}of{tp}.bin"
