"""Waiting on a goal (control/goal_records.py), on fakeredis."""

from __future__ import annotations

import pytest
from fakeredis import FakeAsyncRedis

from streamserve.control.goal_records import GoalStore, new_goal
from streamserve.wire.errors import RequestTimeoutError
from streamserve.wire.keys import Keys


async def test_a_goal_not_reached_in_time_names_the_time_as_given() -> None:
    """The CLI waits with what is left of its --timeout: 0.5 s arrives as 0.4999..., and is said as 0.5 s."""
    store = GoalStore(FakeAsyncRedis(), Keys())
    goal = new_goal("echo", "apply", None, 0)
    await store.save(goal)
    with pytest.raises(RequestTimeoutError, match=r"not reached in 0\.05s$"):
        await store.wait(goal.goal_id, 0.0499994699)
