"""PrefixStore: longest-prefix lookup, the minimum hit, the memory budget and its eviction
order, and dropping entries a newer one extends."""

from __future__ import annotations

import pytest
import torch

from agentrl.engine.prefix_cache import PrefixStore

pytestmark = pytest.mark.unit

LAYERS, HEADS, DIM = 2, 1, 4
PER_TOKEN = 2 * LAYERS * HEADS * DIM * 4  # keys and values, float32


def kv(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys that encode their token ids, so a hit's content can be checked."""
    k = torch.tensor(tokens, dtype=torch.float32)[None, :, None, None].expand(LAYERS, -1, HEADS, DIM)
    return k.clone(), -k.clone()


def store(budget_tokens: int = 1000, min_tokens: int = 3) -> PrefixStore:
    return PrefixStore(budget_tokens * PER_TOKEN, min_tokens=min_tokens)


def test_the_longest_common_prefix_wins_and_one_token_is_always_left_to_compute():
    s = store()
    s.add([1, 2, 3, 4, 5], *kv([1, 2, 3, 4, 5]))
    s.add([1, 2, 9, 9, 9, 9], *kv([1, 2, 9, 9, 9, 9]))
    hit = s.lookup([1, 2, 3, 4, 7, 8])
    assert hit.length == 4 and hit.k[0, :, 0, 0].tolist() == [1, 2, 3, 4]
    assert torch.equal(hit.v, -hit.k)
    assert s.lookup([1, 2, 3, 4, 5]).length == 4  # the request's last token is computed
    assert s.lookup([1, 2, 3, 4, 5, 6]).length == 5


def test_hits_below_the_minimum_are_misses():
    s = store(min_tokens=3)
    s.add([1, 2, 3, 4], *kv([1, 2, 3, 4]))
    assert s.lookup([1, 2, 7, 7, 7]) is None  # 2 common tokens
    assert s.lookup([1, 2, 3]) is None  # too short to leave a token after the minimum
    assert s.lookup([5, 6, 7, 8]) is None


def test_a_newer_sequence_replaces_its_stored_prefixes():
    s = store()
    s.add([1, 2, 3], *kv([1, 2, 3]))
    s.add([1, 2, 3, 4, 5], *kv([1, 2, 3, 4, 5]))  # the next turn of the same episode
    assert len(s) == 1 and s.nbytes == 5 * PER_TOKEN


def test_the_budget_drops_the_least_recently_used_first():
    s = store(budget_tokens=10)
    s.add([1] * 4, *kv([1] * 4))
    s.add([2] * 4, *kv([2] * 4))
    assert s.lookup([1] * 4 + [0]).length == 4  # entry 1 used: entry 2 is now the oldest
    s.add([3] * 4, *kv([3] * 4))  # 12 tokens > 10: one entry goes
    assert s.nbytes == 8 * PER_TOKEN
    assert s.lookup([2] * 4 + [0]) is None and s.lookup([1] * 4 + [0]) is not None
    s.add(list(range(11)), *kv(list(range(11))))  # larger than the whole budget: not stored
    assert s.lookup(list(range(11)) + [0]) is None
    s.clear()
    assert len(s) == 0 and s.nbytes == 0


def test_a_zero_budget_stores_nothing():
    s = PrefixStore(0)
    s.add(list(range(40)), *kv(list(range(40))))
    assert len(s) == 0 and s.lookup(list(range(41))) is None


def test_sglangs_flag_turns_the_embedded_engines_reuse_off():
    from agentrl.rollout.config import RolloutConfig
    from agentrl.run.serving import prefix_cache_bytes

    on = RolloutConfig(env="calc")
    off = RolloutConfig(env="calc", sglang_args={"disable-radix-cache": None})
    off.validate()  # an --sglang-* flag the embedded engine honours
    assert prefix_cache_bytes(on) > 0 and prefix_cache_bytes(off) == 0


def test_the_entry_count_is_bounded_too():
    s = PrefixStore(1 << 30, min_tokens=3, max_entries=2)
    for first in (1, 2, 3):
        s.add([first] * 4, *kv([first] * 4))
    assert len(s) == 2 and s.lookup([1] * 4 + [0]) is None and s.nbytes == 8 * PER_TOKEN
