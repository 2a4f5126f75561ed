"""Priority levels as data: parsing, the entry refs that keep ids of several streams apart, the read orders."""

from __future__ import annotations

import pytest

from streamserve.cli.parser import build_parser
from streamserve.wire.errors import BadRequestError, ProtocolError
from streamserve.wire.keys import Keys
from streamserve.wire.messages import Request
from streamserve.wire.models import routed_lane
from streamserve.wire.priorities import (
    FAIR_TURNS,
    PRIORITIES,
    READ_ORDERS,
    Priority,
    entry_ref,
    group_refs,
    lane_priority,
    lane_ref,
    parse_priority,
    priority_lane,
    queue_full,
    split_ref,
)


@pytest.mark.parametrize(
    ("given", "level"), [(None, "normal"), ("high", "high"), (" LOW ", "low"), ("Normal", "normal")]
)
def test_a_priority_is_one_of_three_names_in_any_case(given: str | None, level: str) -> None:
    assert parse_priority(given) is Priority(level)


@pytest.mark.parametrize("given", ["HIGH", " high ", "High\t"])
def test_the_cli_takes_a_level_in_any_case_and_spacing_too(given: str) -> None:
    assert build_parser().parse_args(["call", "echo", "--priority", given]).priority == "high"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["call", "echo", "--priority", "urgent"])


@pytest.mark.parametrize("given", ["", "urgent", "0", "high,low", "highest"])
def test_anything_else_is_a_bad_request_naming_the_levels(given: str) -> None:
    with pytest.raises(BadRequestError, match=f"unknown priority {given!r}: use one of high, normal, low"):
        parse_priority(given)


def test_refs_keep_apart_entries_with_one_id_in_two_streams() -> None:
    same_id = b"1700000000000-0"
    refs = [entry_ref(p, same_id) for p in PRIORITIES]
    assert len(set(refs)) == 3
    assert entry_ref(Priority.NORMAL, same_id) == same_id  # a deployment without priorities names entries by id
    assert [split_ref(ref) for ref in refs] == [(priority_lane(p), same_id) for p in PRIORITIES]
    assert [lane_priority(split_ref(ref)[0]) for ref in refs] == list(PRIORITIES)
    grouped = group_refs([refs[2], refs[1], refs[0], entry_ref(Priority.LOW, b"2-0")])
    assert grouped == {b"low": [same_id, b"2-0"], b"": [same_id], b"high": [same_id]}
    assert group_refs([b"1-0", b"2-0"]) == {b"": [b"1-0", b"2-0"]}


def test_a_replicas_routed_lane_names_its_stream_and_its_entries_are_normal() -> None:
    lane = routed_lane("adapters#1f2e3d4c")
    ref = lane_ref(lane, b"5-1")
    assert ref == b"to:adapters#1f2e3d4c/5-1"
    assert Keys().lane_stream("adapters", lane) == Keys().routed_requests("adapters", "adapters#1f2e3d4c")
    assert split_ref(ref) == (lane, b"5-1")
    assert lane_priority(lane) is Priority.NORMAL
    assert group_refs([ref, b"6-0"]) == {lane: [b"5-1"], b"": [b"6-0"]}


def test_every_level_comes_first_at_least_once_a_cycle_and_high_on_the_other_turns() -> None:
    assert len(READ_ORDERS) == FAIR_TURNS
    firsts = [order[0] for order in READ_ORDERS]
    assert firsts.count(Priority.NORMAL) == firsts.count(Priority.LOW) == 1
    assert firsts.count(Priority.HIGH) == FAIR_TURNS - 2
    assert firsts[0] is Priority.HIGH  # a replica's first contended read takes high
    assert all(sorted(order) == sorted(PRIORITIES) for order in READ_ORDERS)
    # A level that is first only when a lower one comes first still gets its turns ahead of the lowest.
    assert all(
        order.index(Priority.HIGH) < order.index(Priority.LOW) or order[0] is Priority.LOW for order in READ_ORDERS
    )


def test_each_level_has_its_stream_in_the_deployments_slot() -> None:
    keys = Keys()
    streams = keys.request_streams("d")
    assert list(streams) == list(PRIORITIES)
    assert streams[Priority.NORMAL] == "streamserve:{d}:requests"  # the stream every deployment always had
    assert streams[Priority.HIGH] == "streamserve:{d}:requests:high"
    assert set(streams.values()) <= set(keys.deployment_keys("d"))


def test_a_request_keeps_its_priority_on_the_wire_and_normal_adds_nothing() -> None:
    request = Request("r1", "replies", 0, b"1", priority=Priority.LOW)
    fields = {k.encode(): str(v).encode() if not isinstance(v, bytes) else v for k, v in request.encode().items()}
    assert fields[b"priority"] == b"low"
    assert Request.decode(fields).priority is Priority.LOW
    assert "priority" not in Request("r2", "replies", 0, b"1").encode()
    with pytest.raises(ProtocolError, match="malformed request message"):
        Request.decode({**fields, b"priority": b"urgent"})


def test_a_full_queue_names_its_level() -> None:
    assert queue_full("d", 5, Priority.NORMAL) == "deployment 'd' has 5 requests queued (max_queued_requests)"
    assert queue_full("d", 1, Priority.LOW) == "deployment 'd' has 1 low-priority request queued (max_queued_requests)"
    assert (
        queue_full("d", 5, Priority.HIGH) == "deployment 'd' has 5 high-priority requests queued (max_queued_requests)"
    )
