"""The web UI's policies page (Policies in the navigation, SPEC M5/M6): the policies and operator
policies of the vhosts the user sees, a form to add (or replace) one and a button to
delete each. A client of the same operations as the API and `ackmq ctl`
(server/policy_ops.py), with the API's rules: policies need the policymaker tag,
operator policies administrator; a refused policy shows RabbitMQ's text."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ackmq.broker.policy_check import APPLY_TO, PolicyError
from ackmq.server import policy_ops
from ackmq.server.http.app import has_tag
from ackmq.server.http.common import parse_json
from ackmq.server.http.ui import back, render, ui_server, user_vhosts
from ackmq.server.http.ui_html import as_json, e, form, hidden, policy_anchor, table
from ackmq.server.ops import OpError

KINDS = (("policy", "Policy"), ("operator", "Operator policy"))


def _rows(request: web.Request, operator: bool, may_change: bool) -> list[list[str]]:
    broker = ui_server(request).broker
    rows = []
    for v in user_vhosts(request):
        for p in policy_ops.list_policies(broker, v, operator):
            kind = "operator" if operator else "policy"
            anchor = policy_anchor(kind, p["vhost"], p["name"])
            cells = [e(p["vhost"]), f'<a id="{e(anchor)}">{e(p["name"])}</a>',
                     e(p["pattern"]), e(p["apply-to"]), as_json(p["definition"]),
                     e(p["priority"])]
            cells.append(form("/policies/delete", hidden(vhost=p["vhost"], name=p["name"],
                                                         kind=kind),
                              "Delete", confirm=f"Delete {p['name']}?", cls="inline")
                         if may_change else "")
            rows.append(cells)
    return rows


async def policies_page(request: web.Request) -> web.Response:
    user = request["user"]
    policymaker, admin = has_tag(user, "policymaker"), has_tag(user, "administrator")
    heads = ["Vhost", "Name", "Pattern", "Apply to", "Definition", "Priority", ""]
    live = ("<h2>Policies</h2>" + table(heads, _rows(request, False, policymaker),
                                        "policies", "no policies")
            + "<h2>Operator policies</h2>" + table(heads, _rows(request, True, admin),
                                                   "operator-policies",
                                                   "no operator policies"))
    static = ""
    if policymaker:
        vhosts = "".join(f'<option value="{e(v)}">{e(v)}</option>'
                         for v in user_vhosts(request))
        kinds = "".join(f'<option value="{k}">{t}</option>' for k, t in KINDS
                        if k == "policy" or admin)
        apply = "".join(f'<option value="{a}">{a}</option>' for a in APPLY_TO)
        fields = (f'<label>Kind <select name="kind">{kinds}</select></label> '
                  f'<label>Vhost <select name="vhost">{vhosts}</select></label> '
                  '<label>Name <input name="name" required></label> '
                  '<label>Pattern <input name="pattern" required value="^"></label> '
                  f'<label>Apply to <select name="apply-to">{apply}</select></label> '
                  '<label>Priority <input name="priority" value="0" size="4"></label> '
                  '<label>Definition (JSON) <textarea name="definition" rows="3" '
                  'cols="50" required>{"max-length": 1000}</textarea></label>')
        static = "<h2>Add / update a policy</h2>" + form("/policies/add", fields,
                                                         "Add / update policy")
    return render(request, "Policies", "/policies", live, static)


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text  # refused with RabbitMQ's text by the check


async def add_policy(request: web.Request) -> web.StreamResponse:
    data = await request.post()
    operator = data.get("kind") == "operator"
    user = request["user"]
    if not has_tag(user, "administrator" if operator else "policymaker"):
        raise back("/policies", "Not administrator user" if operator
                   else "Not policymaker user", True)
    vhost, name = str(data.get("vhost", "/")), str(data.get("name", ""))
    if vhost not in user_vhosts(request):
        raise back("/policies", f"no vhost {vhost}", True)
    try:
        definition = parse_json(str(data.get("definition", "")))
    except OpError as err:
        raise back("/policies", f"the definition is not JSON ({err.reason})", True
                   ) from None
    body = {"pattern": str(data.get("pattern", "")), "definition": definition,
            "apply-to": str(data.get("apply-to", "all")),
            "priority": _number(str(data.get("priority", "0")))}
    try:
        policy_ops.set_policy(ui_server(request).broker, vhost, name, body, operator)
    except PolicyError as err:
        raise back("/policies", err.text.strip(), True) from None
    note = policy_ops.no_effect_note(body)
    raise back("/policies", f"Policy {name} set" + (f" ({note})" if note else ""))


async def delete_policy(request: web.Request) -> web.StreamResponse:
    data = await request.post()
    operator = data.get("kind") == "operator"
    if not has_tag(request["user"], "administrator" if operator else "policymaker"):
        raise back("/policies", "Not administrator user" if operator
                   else "Not policymaker user", True)
    vhost, name = str(data.get("vhost", "/")), str(data.get("name", ""))
    if vhost not in user_vhosts(request) or not policy_ops.clear_policy(
            ui_server(request).broker, vhost, name, operator):
        raise back("/policies", f"no policy {name} in vhost {vhost}", True)
    raise back("/policies", f"Policy {name} deleted")


def register(app: web.Application) -> None:
    app.router.add_get("/policies", policies_page)
    app.router.add_post("/policies/add", add_policy)
    app.router.add_post("/policies/delete", delete_policy)
