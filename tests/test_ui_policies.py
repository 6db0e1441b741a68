"""M2/M5: the web UI's policies page (Policies in the navigation): list, add, refuse with
RabbitMQ's text, delete; policymaker for policies, administrator for operator policies."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from test_ui_http import call, follow, user

import ackmq


@pytest.fixture(scope="module")
def broker() -> Iterator[ackmq.EmbeddedBroker]:
    with ackmq.EmbeddedBroker(persistent=False) as b:
        yield b


def _api(b: ackmq.EmbeddedBroker, path: str) -> list[dict[str, object]]:
    return json.loads(call(b, "GET", path)[2])


def test_M5_ui_policies_page_add_refuse_delete(broker: ackmq.EmbeddedBroker) -> None:
    status, _, body = call(broker, "GET", "/policies")
    assert status == 200 and 'id="policies"' in body and "Add / update policy" in body
    assert 'href="/policies"' in call(broker, "GET", "/admin")[2]
    form = {"kind": "policy", "vhost": "/", "name": "ui-cap", "pattern": "^ui-cap",
            "apply-to": "queues", "priority": "2", "definition": '{"max-length": 5}'}
    page = follow(broker, call(broker, "POST", "/policies/add", form=form))
    assert "Policy ui-cap set" in page
    assert '{"max-length": 5}' in page
    assert _api(broker, "/api/policies/%2F/ui-cap") == {
        "vhost": "/", "name": "ui-cap", "pattern": "^ui-cap", "apply-to": "queues",
        "definition": {"max-length": 5}, "priority": 2}
    page = follow(broker, call(broker, "POST", "/policies/add",
                               form={**form, "definition": '{"max-length": "x"}'}))
    assert 'Validation failed\n\n<<"x">> is not a valid maximum length' in page
    page = follow(broker, call(broker, "POST", "/policies/add",
                               form={**form, "kind": "operator", "name": "ui-op",
                                     "definition": '{"message-ttl": 1000}'}))
    assert "Policy ui-op set" in page
    assert _api(broker, "/api/operator-policies/%2F/ui-op")["definition"] == {  # type: ignore[index]
        "message-ttl": 1000}
    page = follow(broker, call(broker, "POST", "/policies/delete",
                               form={"kind": "policy", "vhost": "/", "name": "ui-cap"}))
    assert "Policy ui-cap deleted" in page
    assert call(broker, "GET", "/api/policies/%2F/ui-cap")[0] == 404
    follow(broker, call(broker, "POST", "/policies/delete",
                        form={"kind": "operator", "vhost": "/", "name": "ui-op"}))
    assert _api(broker, "/api/operator-policies") == []


def test_M5_ui_policies_need_policymaker(broker: ackmq.EmbeddedBroker) -> None:
    mgmt = user(broker, ["management"], (".*", ".*", ".*"))
    body = call(broker, "GET", "/policies", mgmt)[2]
    assert "Add / update policy" not in body
    form = {"kind": "policy", "vhost": "/", "name": "ui-no", "pattern": "^x",
            "apply-to": "all", "priority": "0", "definition": '{"max-length": 5}'}
    page = follow(broker, call(broker, "POST", "/policies/add", mgmt, form), mgmt)
    assert "Not policymaker user" in page
    maker = user(broker, ["policymaker"], (".*", ".*", ".*"))
    page = follow(broker, call(broker, "POST", "/policies/add", maker,
                               {**form, "kind": "operator"}), maker)
    assert "Not administrator user" in page
    page = follow(broker, call(broker, "POST", "/policies/add", maker, form), maker)
    assert "Policy ui-no set" in page
    follow(broker, call(broker, "POST", "/policies/delete", maker,
                        {"kind": "policy", "vhost": "/", "name": "ui-no"}), maker)
    assert call(broker, "GET", "/api/policies/%2F/ui-no")[0] == 404
