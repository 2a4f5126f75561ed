"""The autoscaling policy alone: observations in, replica counts out, on a fake clock."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from streamserve.scheduler.autoscaler import AutoscalePolicy, Decision, Load
from streamserve.wire.config import AutoscalingConfig

TICK_MS = 200


def config(**fields: object) -> AutoscalingConfig:
    base: dict[str, object] = {
        "min_replicas": 0,
        "max_replicas": 4,
        "target_ongoing_requests": 2,
        "upscale_delay_s": 1,
        "downscale_delay_s": 10,
    }
    return AutoscalingConfig.model_validate({**base, **fields})


class Run:
    """Feeds a policy one observation per tick and applies its decisions, as the scheduler does."""

    def __init__(self, cfg: AutoscalingConfig, replicas: int, look_back_ms: int = 2_000) -> None:
        self.cfg = cfg
        self.policy = AutoscalePolicy(look_back_ms)
        self.replicas = replicas
        self.now = 1_000_000
        self.decisions: list[tuple[int, Decision]] = []

    def tick(self, ongoing: int, arrived: bool = False) -> Decision | None:
        self.now += TICK_MS
        decision = self.policy.decide(self.cfg, ongoing, self.replicas, self.now, arrived)
        if decision is not None:
            self.decisions.append((self.now, decision))
            self.replicas = decision.replicas
        return decision

    def ticks(self, ongoing: Iterable[int]) -> None:
        for value in ongoing:
            self.tick(value)

    def hold(self, ongoing: int, seconds: float) -> None:
        self.ticks([ongoing] * int(seconds * 1000 / TICK_MS))


def test_scales_up_once_the_load_has_lasted_upscale_delay() -> None:
    run = Run(config(upscale_delay_s=1), replicas=1)
    first_tick = run.now + TICK_MS
    run.hold(6, 2.0)
    assert run.replicas == 3  # ceil(6 / 2)
    [(when, decision)] = run.decisions
    assert 1_000 <= when - first_tick < 1_000 + TICK_MS  # wanted from the first tick, granted a second later
    assert decision.reason == "ongoing 6.0 on 1 replica(s), target 2 each, for 1.0s"


def test_no_scale_up_before_the_delay() -> None:
    run = Run(config(upscale_delay_s=5), replicas=1)
    run.hold(8, 4.0)
    assert run.replicas == 1 and run.decisions == []
    run.hold(8, 2.0)
    assert run.replicas == 4


def test_scales_down_only_after_downscale_delay_and_to_zero_when_idle() -> None:
    run = Run(config(downscale_delay_s=10), replicas=3)
    run.hold(0, 9.0)
    assert run.replicas == 3  # 9 s of quiet is not 10
    run.hold(0, 4.0)
    assert run.replicas == 0
    assert [d.replicas for _, d in run.decisions] == [0]


def test_downscale_goes_to_the_count_wanted_at_the_end_of_the_wait() -> None:
    run = Run(config(downscale_delay_s=2, target_ongoing_requests=1), replicas=4, look_back_ms=TICK_MS)
    run.ticks([3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1])  # fewer than 4 wanted for 2 s, from the first tick
    assert [d.replicas for _, d in run.decisions] == [1]


def test_a_wish_interrupted_by_the_current_count_starts_over() -> None:
    run = Run(config(upscale_delay_s=1, target_ongoing_requests=1), replicas=2, look_back_ms=TICK_MS)
    run.ticks([4, 4, 4, 2, 4, 4, 4, 2, 4, 4, 4, 2])  # never 1 s in a row above 2
    assert run.decisions == []


def test_clamped_to_min_and_max() -> None:
    run = Run(config(min_replicas=1, max_replicas=3, upscale_delay_s=0, downscale_delay_s=0), replicas=1)
    run.hold(100, 3.0)
    assert run.replicas == 3
    run.hold(0, 3.0)
    assert run.replicas == 1


def test_count_outside_new_bounds_is_clamped_at_once() -> None:
    run = Run(config(min_replicas=0, max_replicas=4), replicas=4)
    run.cfg = config(min_replicas=0, max_replicas=2)
    decision = run.tick(8)
    assert decision is not None and decision.replicas == 2
    run.cfg = config(min_replicas=3, max_replicas=4)
    decision = run.tick(0)
    assert decision is not None and decision.replicas == 3


@pytest.mark.parametrize("queued", [1, 50])
def test_from_zero_one_replica_starts_at_once_when_anything_is_queued(queued: int) -> None:
    run = Run(config(upscale_delay_s=30), replicas=0)
    run.hold(0, 5.0)
    assert run.decisions == []
    decision = run.tick(queued)
    assert decision is not None and decision.replicas == 1
    assert "waiting and no replica" in decision.reason


def test_more_than_one_replica_from_zero_still_waits_for_the_upscale_delay() -> None:
    run = Run(config(upscale_delay_s=1), replicas=0)
    run.tick(8)
    assert run.replicas == 1
    run.hold(8, 0.6)
    assert run.replicas == 1
    run.hold(8, 1.4)
    assert run.replicas == 4


@pytest.mark.parametrize("noise", [[8, 0, 4, 0], [7, 0, 3, 1, 5, 0], [9, 0, 0, 0]])
def test_noisy_load_scales_once_to_its_mean_and_does_not_flap(noise: list[int]) -> None:
    # Sampled queue lengths jump between 0 and 9; their mean (2-3 requests) asks for 2 replicas of target 2.
    run = Run(config(upscale_delay_s=1, downscale_delay_s=10), replicas=1)
    run.ticks(noise * 75)  # 60 s
    assert [d.replicas for _, d in run.decisions] == [2]
    # Unsmoothed, the zeros keep interrupting the wish: the same load would never get its second replica.
    raw = Run(config(upscale_delay_s=1, downscale_delay_s=10), replicas=1, look_back_ms=TICK_MS)
    raw.ticks(noise * 75)
    assert raw.decisions == []


def test_steady_load_settles_and_stays() -> None:
    run = Run(config(upscale_delay_s=1, downscale_delay_s=10), replicas=1)
    run.hold(5, 10.0)  # ceil(5 / 2) = 3
    assert run.replicas == 3
    settled = len(run.decisions)
    run.hold(5, 30.0)
    assert len(run.decisions) == settled


def trickle(run: Run, seconds: float, every_ticks: int, ongoing: int = 0) -> None:
    """A request that comes and goes between two ticks every ``every_ticks`` ticks: no tick finds it queued."""
    for i in range(int(seconds * 1000 / TICK_MS)):
        run.tick(ongoing, arrived=i % every_ticks == 0)


@pytest.mark.parametrize(("delay_s", "every_ticks"), [(10, 7), (4, 5), (4, 10)])
def test_a_trickle_of_requests_between_ticks_keeps_one_replica(delay_s: int, every_ticks: int) -> None:
    """A request every 1-2 s that lasts less than a tick: not scaled to zero while it goes on, then scaled to zero
    downscale_delay_s (up to the 2 s look-back more) after the last one."""
    run = Run(config(downscale_delay_s=delay_s), replicas=1)
    trickle(run, 45.0, every_ticks)
    assert run.decisions == []
    last = run.now - (int(45_000 / TICK_MS) - 1) % every_ticks * TICK_MS
    run.hold(0, delay_s + 3.0)
    [(when, decision)] = run.decisions
    assert decision.replicas == 0 and delay_s * 1000 <= when - last <= delay_s * 1000 + 2_000


def test_a_trickle_keeps_the_replicas_it_needs_not_more() -> None:
    run = Run(config(target_ongoing_requests=1, downscale_delay_s=4), replicas=3)
    trickle(run, 30.0, every_ticks=2)
    [(_, decision)] = run.decisions
    assert decision == Decision(1, "ongoing 0.5 on 3 replica(s), target 1 each, for 4.0s")


def test_requests_between_ticks_never_scale_up() -> None:
    """Scale-up follows the queue as the ticks find it, arrivals or none."""
    up = Run(config(target_ongoing_requests=1, upscale_delay_s=1), replicas=1)
    for _ in range(100):
        up.tick(2, arrived=True)
        up.tick(0, arrived=True)  # counted as 1 this would make the mean 1.5: 2 replicas
    assert up.decisions == []
    idle = Run(config(upscale_delay_s=0), replicas=0)
    trickle(idle, 10.0, every_ticks=1)  # (came and went with no replica: none waits, none is started)
    assert idle.decisions == []


def test_a_load_tells_a_request_read_since_an_earlier_look() -> None:
    first = Load(0, ((5, 0), (7, 1), (0, 0)))
    assert not first.read_since(Load())  # the first look says nothing
    assert not first.read_since(first)
    assert Load(0, ((5, 0), (7, 2), (0, 0))).read_since(first)
    assert Load(0, ((5, 0), (7, 1), (0, 0), (3, 0))).read_since(first.plus(0, (2, 9)))  # the routed lane
    assert not Load(0, ((5, 0), (7, 1), (0, 0), (1, 0))).read_since(first.plus(0, (2, 9)))  # its stream gone
    assert first.plus(4, (1, 0)) == Load(4, ((5, 0), (7, 1), (0, 0), (1, 0)))
