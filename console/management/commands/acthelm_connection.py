"""acthelm_connection add|list|test|prices — model connections, scriptable, with --json output.

`prices NAME [--model M] [--input X] [--output Y] [--cached-input X] [--cache-write X]` shows a
connection's models' prices (US dollars per million tokens) and sets those given ("none" clears
one)."""

import json
from typing import Any

from agents.catalogue.connection_rules import connection_kinds
from agents.catalogue.connections import (
    PRICE_FIELDS,
    connection_add,
    connection_test,
    model_set_prices,
)
from agents.catalogue.providers import get_provider_class
from agents.models import Connection, Model
from agents.states import CostTier
from console.cli import ActionCommand, Actions, Options, emit, person_actor
from core.exceptions import InvalidInput


def connection_as_dict(conn: Connection) -> dict[str, Any]:
    return {
        "name": conn.name,
        "kind": conn.kind,
        "base_url": conn.base_url or None,
        "command": conn.command or None,
        "answer_field": conn.answer_field or None,
        "credential_env": conn.credential_env or None,
        "cost_tier": conn.cost_tier,
        "priority": conn.priority,
        "enabled": conn.enabled,
        "cooldown_until": conn.cooldown_until.isoformat() if conn.cooldown_until else None,
        "last_error_code": conn.last_error_code or None,
        "models": [
            {
                "name": m.name,
                "context_window": m.context_window,
                "supports_tools": m.supports_tools,
                "test_status": m.test_status,
                "test_message": m.test_message or None,
                "streams": m.streams,
                "tools_override_by": str(m.tools_override_by) if m.tools_override_by_id else None,
                "tools_override_at": (
                    m.tools_override_at.isoformat() if m.tools_override_at else None
                ),
            }
            for m in conn.models.all()
        ],
    }


PRICE_FLAGS = dict(
    zip(("input", "output", "cached-input", "cache-write"), PRICE_FIELDS, strict=True)
)


def _prices_of(model: Model) -> dict[str, str | None]:
    return {
        "model": model.name,
        **{f: None if getattr(model, f) is None else str(getattr(model, f)) for f in PRICE_FIELDS},
        "prices_source": model.prices_source or None,
        "currency": "USD",
    }


class Command(ActionCommand):
    person_option = True

    help = "Add, list and test connections to model providers."

    def add_actions(self, sub: Actions) -> None:
        add = sub.add_parser("add")
        add.add_argument("name")
        add.add_argument("--kind", required=True, choices=connection_kinds())
        add.add_argument("--base-url", default="")
        add.add_argument(
            "--command",
            dest="cli_command",
            default="",
            help='JSON argument list, e.g. \'["llm", "-m", "gpt-4o-mini"]\'',
        )
        add.add_argument("--answer-field", default="")
        add.add_argument(
            "--credential-env", default="", help="NAME of the environment variable holding the key"
        )
        add.add_argument("--cost-tier", choices=CostTier.values, default=CostTier.PAID)
        add.add_argument("--priority", type=int, default=0)
        add.add_argument("--timeout", type=float, default=120)
        add.add_argument("--model", action="append", default=[], dest="models")
        add.add_argument("--context-window", type=int)
        add.add_argument("--no-tools", action="store_true", help="the models cannot call tools")
        add.add_argument(
            "--exists-ok",
            action="store_true",
            help="a connection of this name with exactly these settings and models is fine "
            "(nothing changes); one with other settings is still refused",
        )
        sub.add_parser("list")
        prices = sub.add_parser("prices", help="show or set a model's prices (USD per 1M tokens)")
        prices.add_argument("name")
        prices.add_argument("--model", dest="model_name", help="one model (default: every one)")
        for flag, field in PRICE_FLAGS.items():
            prices.add_argument(f"--{flag}", dest=field, help=f"{field} (USD; 'none' clears it)")
        test = sub.add_parser("test", help="make a real request; record pass or fail")
        test.add_argument("name")
        test.add_argument("--model", dest="model_name")
        test.add_argument(
            "--override-tools",
            action="store_true",
            help="count the model(s) as tool-capable even if the probe tool is not called "
            "(recorded with who overrode it)",
        )

    def do_list(self, opts: Options) -> None:
        rows = [connection_as_dict(c) for c in Connection.objects.prefetch_related("models")]
        text = "\n".join(
            f"{r['name']:<24} {r['kind']:<18} {r['cost_tier']:<10} "
            + ", ".join(f"{m['name']} ({m['test_status']})" for m in r["models"])
            for r in rows
        )
        emit(self, rows, as_json=opts["json"], text=text or "no connections")

    def do_add(self, opts: Options) -> None:
        command = []
        if opts["cli_command"]:
            try:
                command = json.loads(opts["cli_command"])
            except json.JSONDecodeError:
                raise InvalidInput("--command must be a JSON list of strings") from None
            if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
                raise InvalidInput("--command must be a JSON list of strings")
        existed = Connection.objects.filter(name=opts["name"]).exists()
        conn = connection_add(
            actor=person_actor(opts["user"]),
            name=opts["name"],
            kind=opts["kind"],
            base_url=opts["base_url"],
            command=command,
            answer_field=opts["answer_field"],
            credential_env=opts["credential_env"],
            cost_tier=opts["cost_tier"],
            priority=opts["priority"],
            timeout_seconds=opts["timeout"],
            models=[
                {
                    "name": m,
                    "context_window": opts["context_window"],
                    "supports_tools": not opts["no_tools"]
                    and get_provider_class(opts["kind"]).supports_tools,
                }
                for m in opts["models"]
            ],
            exist_ok=opts["exists_ok"],
        )
        emit(
            self,
            connection_as_dict(conn),
            as_json=opts["json"],
            text=f"connection {conn.name} "
            + ("exists already with these settings: unchanged" if existed else "added"),
        )

    def do_prices(self, opts: Options) -> None:
        conn = Connection.objects.filter(name=opts["name"]).first()
        if conn is None:
            raise InvalidInput(f"connection {opts['name']!r} does not exist")
        models = list(conn.models.order_by("name"))
        if opts["model_name"]:
            models = [m for m in models if m.name == opts["model_name"]]
            if not models:
                raise InvalidInput(f"connection {conn.name} has no model {opts['model_name']!r}")
        given = {f: opts[f] for f in PRICE_FIELDS if opts.get(f) is not None}
        if given:
            actor = person_actor(opts["user"])
            models = [model_set_prices(actor=actor, model_id=m.pk, prices=given) for m in models]
        rows = [_prices_of(m) for m in models]
        text = "\n".join(
            f"{conn.name}/{r['model']}: input {r['price_input_per_mtok'] or '—'}, output "
            f"{r['price_output_per_mtok'] or '—'}, cached input "
            f"{r['price_cached_input_per_mtok'] or '(input)'}, cache write "
            f"{r['price_cache_write_per_mtok'] or '(input)'} USD per million tokens"
            + (f" ({r['prices_source']})" if r["prices_source"] else "")
            for r in rows
        )
        emit(self, rows, as_json=opts["json"], text=text)

    def do_test(self, opts: Options) -> None:
        results = connection_test(
            actor=person_actor(opts["user"]),
            name=opts["name"],
            model_name=opts["model_name"],
            override_tools=opts["override_tools"],
        )
        failed = [r for r in results if not r["ok"]]
        emit(
            self,
            results,
            as_json=opts["json"],
            text="\n".join(
                f"{r['model']}: {'passed' if r['ok'] else 'FAILED'} — {r['message']}"
                for r in results
            ),
        )
        if failed:
            raise SystemExit(1)
