"""The files `up` leaves for the commands beside it: a private token kept across restarts, the running farm."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.farm_files import (
    FarmRecord,
    UnsafeFileError,
    ensure_api_key,
    ensure_redis_password,
    keep_private,
    read_api_key,
    remove_farm,
    running_farm,
    write_farm,
)
from streamserve.runtime.processes import process_ref
from streamserve.runtime.settings import redis_url_problem
from streamserve.wire.errors import ConfigError


def test_the_token_is_made_private_once_and_kept(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    token = ensure_api_key(data_dir)
    assert len(token) >= 40  # 256 random bits, url-safe
    assert (data_dir / "api_key").stat().st_mode & 0o777 == 0o600
    assert data_dir.stat().st_mode & 0o777 == 0o700
    assert ensure_api_key(data_dir) == token == read_api_key(data_dir)
    assert ensure_api_key(tmp_path / "other") != token


def test_the_embedded_redis_password_is_made_private_once_and_kept_apart_from_the_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    password = ensure_redis_password(data_dir)
    assert len(password) >= 40 and password.replace("-", "").replace("_", "").isalnum()  # URL-safe as it is
    assert (data_dir / "redis_password").stat().st_mode & 0o777 == 0o600
    assert ensure_redis_password(data_dir) == password != ensure_api_key(data_dir)


@pytest.mark.parametrize("password", ["pass word", 'a"b', "it's", "back\\slash", "caf\u00e9"])
def test_a_password_put_in_by_hand_that_redis_server_would_misread_is_refused_naming_the_file(
    tmp_path: Path, password: str
) -> None:
    (tmp_path / "redis_password").write_text(password + "\n")
    (tmp_path / "redis_password").chmod(0o600)
    with pytest.raises(ConfigError, match="redis_password: the password holds a space, a quote"):
        ensure_redis_password(tmp_path)


def test_a_token_put_in_by_hand_that_no_header_carries_is_refused_naming_the_file(tmp_path: Path) -> None:
    """`up` started Redis and the scheduler on it, then the gateway exited 2 naming STREAMSERVE_API_KEY, which the
    user never set (found by a review)."""
    (tmp_path / "api_key").write_text("caf\u00e9-token\n")
    (tmp_path / "api_key").chmod(0o600)
    with pytest.raises(ConfigError, match=r"api_key: the token has characters an HTTP header does not carry"):
        ensure_api_key(tmp_path)


def test_a_password_put_in_by_hand_with_url_characters_is_percent_encoded_in_the_url(tmp_path: Path) -> None:
    (tmp_path / "redis_password").write_text("p@ss/w?rd#%:1\n")
    (tmp_path / "redis_password").chmod(0o600)
    password = ensure_redis_password(tmp_path)
    url = EmbeddedRedis(port=6399, password=password).url  # (nothing started)
    assert redis.connection.parse_url(url)["password"] == "p@ss/w?rd#%:1"
    assert redis_url_problem(url) is None


def test_a_data_dir_others_may_read_is_made_private(tmp_path: Path) -> None:
    """It holds the embedded Redis's files (requests, replies, configs) beside the secrets."""
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o777)
    keep_private(data_dir)
    assert data_dir.stat().st_mode & 0o777 == 0o700


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    ensure_api_key(tmp_path)
    os.chmod(tmp_path / "api_key", 0o644)
    with pytest.raises(UnsafeFileError, match="other users"):
        ensure_api_key(tmp_path)


def test_only_a_running_farm_is_found(tmp_path: Path) -> None:
    assert running_farm(tmp_path) is None
    me = process_ref(os.getpid())
    assert me is not None
    write_farm(tmp_path, FarmRecord(me, "redis://127.0.0.1:48889/0", "http://127.0.0.1:8000"))
    assert (tmp_path / "farm.json").stat().st_mode & 0o777 == 0o600
    found = running_farm(tmp_path)
    assert found is not None and found.redis_url == "redis://127.0.0.1:48889/0"

    gone_ref = f"{os.getpid()}:0"  # this pid, but another process's start: an `up` gone and its pid reused
    write_farm(tmp_path, FarmRecord(gone_ref, "redis://127.0.0.1:1/0", "http://127.0.0.1:1"))
    assert running_farm(tmp_path) is None, "a farm whose `up` is gone is not the one to use"

    remove_farm(tmp_path, me)  # not this supervisor's file any more: kept
    assert (tmp_path / "farm.json").exists()
    remove_farm(tmp_path, gone_ref)
    assert not (tmp_path / "farm.json").exists()
