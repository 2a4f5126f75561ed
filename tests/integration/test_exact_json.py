"""No silent changes to data: what JSON cannot hold exactly is refused with the reason, never altered."""

from __future__ import annotations

import datetime
import enum
import math
import uuid

import httpx
import numpy
import pytest

from streamserve.client import AsyncClient
from streamserve.wire.errors import BadRequestError, RemoteError
from tests.integration.conftest import StartReplica


@pytest.mark.parametrize(
    "body",
    [float("nan"), float("inf"), -math.inf, {"x": [1, {"y": float("nan")}]}, numpy.array([1.0, numpy.nan])],
    ids=["nan", "inf", "-inf", "nested", "numpy"],
)
async def test_the_client_refuses_nan_and_infinity(
    start_replica: StartReplica, client: AsyncClient, body: object
) -> None:
    await start_replica()
    with pytest.raises(BadRequestError, match="NaN and Infinity have no JSON form"):
        await client.call("rec", body)
    assert (await client.call("rec", {"x": None}))["body"] == {"x": None}  # a real null still goes through


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
async def test_a_result_of_nan_is_a_500_that_says_why(
    start_replica: StartReplica, client: AsyncClient, http: httpx.AsyncClient, value: str
) -> None:
    await start_replica(route_prefix="/rec")
    with pytest.raises(RemoteError, match="the handler's result cannot be sent as JSON: NaN and Infinity"):
        await client.call("rec", value, method="as_float")
    assert await client.call("rec", "1.5", method="as_float") == 1.5


async def test_integers_travel_exactly_or_are_refused(start_replica: StartReplica, http: httpx.AsyncClient) -> None:
    await start_replica(route_prefix="/rec")
    edge = b'{"big": 18446744073709551615, "small": -9223372036854775808, "id": "123456789012345678901234567890"}'
    echoed = await http.post("/rec", content=edge)
    assert echoed.status_code == 200
    assert b'"big":18446744073709551615' in echoed.content and b'"small":-9223372036854775808' in echoed.content
    for big in (b"123456789012345678901234567890", b"18446744073709551616", b"-9223372036854775809"):
        refused = await http.post("/rec", content=b'{"n": [1, ' + big + b"]}")
        assert refused.status_code == 400, big
        assert "cannot be carried exactly" in refused.json()["message"]


async def test_nesting_the_replica_could_not_answer_is_refused_at_the_gateway(
    start_replica: StartReplica, http: httpx.AsyncClient, client: AsyncClient
) -> None:
    await start_replica(route_prefix="/rec")
    deep = await http.post("/rec", content=b"[" * 300 + b"]" * 300)
    assert deep.status_code == 400 and "nested deeper than 254 levels" in deep.json()["message"]
    assert (await http.post("/rec", content=b"[" * 200 + b"]" * 200)).status_code == 200
    with pytest.raises(RemoteError, match="the handler's result cannot be sent as JSON: Recursion limit"):
        await client.call("rec", 400, method="nested")


async def test_numbers_are_read_as_floats_and_one_beyond_their_range_is_refused(
    start_replica: StartReplica, http: httpx.AsyncClient
) -> None:
    await start_replica(route_prefix="/rec")
    for beyond in (b"1e400", b"1" * 5000):  # beyond a double's range: orjson says "number is infinity ..."
        refused = await http.post("/rec", content=b'{"x": [' + beyond + b"]}")
        assert refused.status_code == 400, refused.text
        said = refused.json()["message"]
        assert said.startswith("request body is JSON with a number too large to carry (line 1 column 8"), said
        assert said.endswith("send a larger one as a string"), said
    rounded = await http.post("/rec", content=b'{"x": [0.1, 1.5e-400, 2.5e3]}')
    assert rounded.status_code == 200 and rounded.json()["body"] == {"x": [0.1, 0.0, 2500.0]}


async def test_python_values_with_a_json_form_arrive_in_that_form(
    start_replica: StartReplica, client: AsyncClient
) -> None:
    await start_replica()
    moment = datetime.datetime(2026, 11, 29, 23, 30, 5)
    ident = uuid.UUID("cbfeb3b2-2095-45bd-90b3-bd7186cb3607")
    body = {"at": moment, "on": moment.date(), "id": ident, "pair": (1, 2), "level": _Level.HIGH, "xs": numpy.arange(3)}
    got = (await client.call("rec", body))["body"]
    assert got == {
        "at": "2026-11-29T23:30:05",
        "on": "2026-11-29",
        "id": "cbfeb3b2-2095-45bd-90b3-bd7186cb3607",
        "pair": [1, 2],
        "level": "high",
        "xs": [0, 1, 2],
    }


class _Level(enum.Enum):
    HIGH = "high"
