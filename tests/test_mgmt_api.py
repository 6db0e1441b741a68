"""M1: the management HTTP API, each call made against ackmq and RabbitMQ alike."""

from __future__ import annotations

import pytest
from mgmthelp import REALM_HEADER, Target


def test_M1_overview_keys(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/overview")
    assert r.status == 200
    assert r.headers["content-type"].startswith("application/json")
    for key in ("management_version", "rates_mode", "exchange_types", "product_version",
                "product_name", "rabbitmq_version", "cluster_name", "erlang_version",
                "message_stats", "queue_totals", "object_totals", "node", "listeners",
                "contexts"):
        assert key in r.body, key
    assert set(r.body["object_totals"]) == {"channels", "connections", "consumers",
                                            "exchanges", "queues"}
    assert {"messages", "messages_ready", "messages_unacknowledged"} <= set(
        r.body["queue_totals"])
    assert {"amqp", "http"} <= {x["protocol"] for x in r.body["listeners"]}


def test_M1_no_credentials_401_with_challenge(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/overview", auth=None)
    assert r.status == 401
    assert r.headers["www-authenticate"] == REALM_HEADER
    assert r.raw == b""


def test_M1_wrong_password_401_login_failed(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/overview", auth=("guest", "not-the-password"))
    assert r.status == 401
    assert r.headers["www-authenticate"] == REALM_HEADER
    assert r.body == {"error": "not_authorized", "reason": "Login failed"}


@pytest.mark.parametrize("header,status", [
    ("Basic !!!notbase64", 400), ("Basic " + "Z3Vlc3Q=", 400), ("Basic", 400),
    ("Bearer abc", 401)])
def test_M1_malformed_authorization(mgmt: Target, header: str, status: int) -> None:
    """A Basic header that is not user:password is a 400 with no body; another scheme
    is a failed login (RabbitMQ tries it as an OAuth 2 token)."""
    r = mgmt.call("GET", "/api/overview", auth=None, headers={"Authorization": header})
    assert r.status == status
    if status == 400:
        assert r.raw == b""
    else:
        assert r.body == {"error": "not_authorized", "reason": "Login failed"}


def test_M1_whoami(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/whoami")
    assert r.status == 200
    assert r.body == {"name": "guest", "tags": ["administrator"]}
