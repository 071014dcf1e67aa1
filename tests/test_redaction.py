"""Secrets in Redis, database and proxy URLs never reach a message, whatever the password holds."""

from __future__ import annotations

import pytest

from crawler.errors import ConfigError
from crawler.http.proxies import parse_proxies
from crawler.settings import redact_url, url_error, url_secrets

SECRET = "TOPSECRET"


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("redis://u:s3#TOPSECRET@cache:6379/0", "redis://***@cache:6379/0"),
        ("redis://u:s3/TOPSECRET@cache:6379/0", "redis://***@cache:6379/0"),
        ("redis://u:s3?TOPSECRET@cache:6379/0", "redis://***@cache:6379/0"),
        ("redis://u:s3@TOPSECRET@cache:6379/0", "redis://***@cache:6379/0"),
        ("redis://:a/b?c#d@TOPSECRET@[::1]:6379/0?password=TOPSECRET", "redis://***@[::1]:6379/0?password=***"),
        ("redis://u:s3%23TOPSECRET@cache", "redis://***@cache"),
        ("redis://TOPSECRET@cache", "redis://***@cache"),  # a user alone (an ACL token)
        ("redis+sentinel://:TOPSECRET#x@h1:26379,h2:26379/main", "redis+sentinel://***@h1:26379,h2:26379/main"),
        ("http://u:p#TOPSECRET@proxy:8080", "http://***@proxy:8080"),
        ("postgresql+psycopg://u:s3/TOPSECRET@db/crawl", "postgresql+psycopg://***@db/crawl"),
        ("u:TOPSECRET@cache:6379", "***@cache:6379"),  # no scheme: not a URL, still hidden
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("sqlite:////tmp/a@b/crawl.db", "sqlite:////tmp/a@b/crawl.db"),  # an @ in a path is no user
    ],
)
def test_redact_url_hides_the_whole_userinfo_whatever_the_password_holds(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted
    assert SECRET not in redact_url(url)


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("redis://u:s3#TOPSECRET@cache/0", "s3#TOPSECRET"),
        ("redis://u:s3/TOPSECRET@cache/0", "s3/TOPSECRET"),
        ("redis://u:s3@TOPSECRET@cache/0", "s3@TOPSECRET"),
        ("redis://u:s3%23TOPSECRET@cache/0", "s3#TOPSECRET"),
    ],
)
def test_url_secrets_finds_the_whole_password(url: str, secret: str) -> None:
    assert secret in url_secrets(url)


@pytest.mark.parametrize("url", ["redis://u:s3#TOPSECRET@cache:6379/0", "redis://:ab/TOPSECRET@cache:x/0"])
def test_why_a_url_does_not_parse_quotes_no_piece_of_its_password(url: str) -> None:
    from redis import Redis

    with pytest.raises(ValueError) as parse:
        Redis.from_url(url)
    assert "s3" in str(parse.value) or "ab" in str(parse.value)  # redis-py quotes the password's start
    why = url_error(url, parse.value)
    assert "percent-encode" in why and "s3" not in why and "ab" not in why


def test_a_bad_proxy_is_named_without_its_password() -> None:
    with pytest.raises(ConfigError) as error:
        parse_proxies("http://u:s3#TOPSECRET@proxy:x", "proxies")
    assert SECRET not in str(error.value) and "s3" not in str(error.value)
