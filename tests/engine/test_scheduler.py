"""The scheduler's prefill order, on sequences whose prompt calls are recorded instead of run."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from onnxsample.engine._scheduler import _PATIENCE, Scheduler


def _scheduler(chunk: int) -> tuple[Scheduler, list[tuple[str, int]]]:
    """A scheduler whose prefill calls only move a prompt on (and are recorded by name)."""
    calls: list[tuple[str, int]] = []
    scheduler = Scheduler.__new__(Scheduler)
    scheduler.chunk, scheduler.prefilling = chunk, []

    def prefill(seq, end):
        calls.append((seq.name, end - seq.computed))
        seq.computed = end
        if seq.computed >= len(seq.prompt):
            scheduler.prefilling.remove(seq)

    scheduler.layout = SimpleNamespace(prefill=prefill)
    scheduler._run = lambda call: None
    return scheduler, calls


class _Seq(SimpleNamespace):
    prefilled = property(lambda s: s.computed >= len(s.prompt))


def _seq(name: str, n: int) -> _Seq:
    return _Seq(name=name, prompt=[0] * n, computed=0, finish=None, passed_over=0)


@pytest.mark.parametrize(
    ("prompts", "first_steps"),
    [
        # a short prompt beside a long one goes first, whatever came first
        ([("long", 100), ("short", 5)], [[("short", 5)], [("long", 16)]]),
        ([("short", 5), ("long", 100)], [[("short", 5)], [("long", 16)]]),
        # tails that fit the budget together run in one step, the fewest tokens left first
        ([("a", 7), ("b", 3), ("c", 40)], [[("b", 3), ("a", 7)], [("c", 16)]]),
    ],
)
def test_the_prompt_with_the_fewest_tokens_left_goes_first(prompts, first_steps):
    scheduler, calls = _scheduler(16)
    scheduler.prefilling = [_seq(name, n) for name, n in prompts]
    for step in first_steps:
        calls.clear()
        scheduler._prefill()
        assert calls == step


@pytest.mark.parametrize("short", [10, 13, 16])
def test_a_stream_of_short_prompts_cannot_starve_a_long_one(short):
    """A new short prompt every step would always go first; the long one gets its chunks once it
    has waited `_PATIENCE` steps in a row, the longest waiting first, to its last."""
    scheduler, calls = _scheduler(16)
    long = _seq("long", 160)
    scheduler.prefilling = [long]
    steps_of_long = []
    for step in range(200):
        scheduler.prefilling.append(_seq(f"short{step}", short))
        calls.clear()
        scheduler._prefill()
        if any(name == "long" for name, _ in calls):
            steps_of_long.append(step)
    assert long.prefilled and len(steps_of_long) == 160 // 16, steps_of_long
    gaps = [b - a for a, b in itertools.pairwise(steps_of_long)]
    assert steps_of_long[0] == _PATIENCE and min(gaps) >= _PATIENCE + 1, steps_of_long
