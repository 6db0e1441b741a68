"""server/admission.py as the coming HTTP API will call it: a user name and password from
a peer address, checked against a real access model (the same function AMQP's PLAIN /
AMQPLAIN and STOMP's CONNECT use; their wire behaviour is tested in test_access.py and
test_stomp_access.py)."""

from __future__ import annotations

import pytest

from ackmq.broker.access import AccessModel
from ackmq.server.admission import (
    BAD_CREDENTIALS,
    LOOPBACK_ONLY,
    Refusal,
    certificate_login,
    is_loopback,
    password_login,
    sasl_credentials,
)

LOOPBACK_USERS = ("guest",)


@pytest.fixture
def access() -> AccessModel:
    model = AccessModel.seeded({"guest": "guest"}, None)
    model.add_user("app", "app-pw")
    return model


@pytest.mark.parametrize("peer", [("127.0.0.1", 5), ("::1", 5, 0, 0),
                                  ("::ffff:127.0.0.1", 5, 0, 0), None])
def test_U1_guest_from_loopback_is_admitted(access: AccessModel, peer: object) -> None:
    assert password_login(access, LOOPBACK_USERS, "guest", "guest", peer) == "guest"


def test_U1_guest_from_another_host_is_refused_as_loopback_only(access: AccessModel) -> None:
    got = password_login(access, LOOPBACK_USERS, "guest", "guest", ("10.1.2.3", 5))
    assert got == Refusal(LOOPBACK_ONLY, "guest")
    # the wrong password from there says nothing about the loopback rule
    got = password_login(access, LOOPBACK_USERS, "guest", "nope", ("10.1.2.3", 5))
    assert got == Refusal(BAD_CREDENTIALS, "guest")


def test_U1_other_users_from_any_host_wrong_password_or_unknown_refused(
        access: AccessModel) -> None:
    assert password_login(access, LOOPBACK_USERS, "app", "app-pw", ("10.1.2.3", 5)) == "app"
    assert password_login(access, LOOPBACK_USERS, "app", "x", ("127.0.0.1", 5)) == \
        Refusal(BAD_CREDENTIALS, "app")
    assert password_login(access, LOOPBACK_USERS, "nobody", "", ("127.0.0.1", 5)) == \
        Refusal(BAD_CREDENTIALS, "nobody")
    assert password_login(access, LOOPBACK_USERS, "", "", ("127.0.0.1", 5)) == \
        Refusal(BAD_CREDENTIALS, "")


def test_U4_certificate_login_needs_a_known_user(access: AccessModel) -> None:
    assert certificate_login(access, LOOPBACK_USERS, "app", ("10.1.2.3", 5)) == "app"
    assert certificate_login(access, LOOPBACK_USERS, "ghost", ("127.0.0.1", 5)) == \
        Refusal(BAD_CREDENTIALS, "ghost")
    assert certificate_login(access, LOOPBACK_USERS, None, ("127.0.0.1", 5)) == \
        Refusal(BAD_CREDENTIALS, "")
    assert certificate_login(access, LOOPBACK_USERS, "guest", ("10.1.2.3", 5)) == \
        Refusal(BAD_CREDENTIALS, "guest")


def test_sasl_plain_and_unreadable_responses() -> None:
    assert sasl_credentials("PLAIN", "\0app\0app-pw") == ("app", "app-pw")
    assert sasl_credentials("PLAIN", b"no-separators") == ("", "")
    assert sasl_credentials("AMQPLAIN", b"\xff\xff") == ("", "")
    assert sasl_credentials("CRAM-MD5", b"x") == ("", "")


def test_is_loopback_is_not_fooled_by_names() -> None:
    assert not is_loopback(("localhost.example.com", 5))
    assert not is_loopback(("192.168.0.1", 5))
