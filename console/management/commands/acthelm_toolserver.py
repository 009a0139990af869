"""acthelm_toolserver add|list|test|remove — MCP tool servers, scriptable, with --json output."""

import json
import shlex

from agents.catalogue.toolservers import (
    toolserver_add,
    toolserver_as_dict,
    toolserver_remove,
    toolserver_test,
)
from agents.models import ToolServer
from agents.states import ToolServerTransport
from console.cli import ActionCommand, Actions, Options, emit, person_actor
from core.exceptions import InvalidInput


class Command(ActionCommand):
    person_option = True

    help = "Add, list, test and remove MCP tool servers (their tools are named SERVER__TOOL)."

    def add_actions(self, sub: Actions) -> None:
        add = sub.add_parser("add")
        add.add_argument("name")
        add.add_argument("--transport", required=True, choices=ToolServerTransport.values)
        add.add_argument(
            "--command",
            dest="server_command",
            default="",
            help='stdio: JSON argument list (\'["npx", "-y", "server"]\') or a shell-quoted line',
        )
        add.add_argument("--url", default="", help="http: the streamable-HTTP endpoint")
        add.add_argument(
            "--credential-env", default="", help="NAME of the environment variable to pass"
        )
        add.add_argument(
            "--trusted",
            action="store_true",
            help="rely on the server's readOnlyHint/idempotentHint annotations",
        )
        add.add_argument("--timeout", type=float, default=60, help="seconds per call (1 to 86400)")
        sub.add_parser("list")
        test = sub.add_parser(
            "test",
            help="connect, list the server's tools and record them (run it on a worker host: "
            "a stdio server's command starts here)",
        )
        test.add_argument("name")
        remove = sub.add_parser("remove")
        remove.add_argument("name")

    def do_add(self, opts: Options) -> None:
        command = []
        raw = opts["server_command"].strip()
        if raw.startswith("["):
            try:
                command = json.loads(raw)
            except json.JSONDecodeError:
                raise InvalidInput("--command must be a JSON list of strings") from None
            if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
                raise InvalidInput("--command must be a JSON list of strings")
        elif raw:
            command = shlex.split(raw)
        server = toolserver_add(
            actor=person_actor(opts["user"]),
            name=opts["name"],
            transport=opts["transport"],
            command=command,
            url=opts["url"],
            credential_env=opts["credential_env"],
            trusted=opts["trusted"],
            timeout_seconds=opts["timeout"],
        )
        emit(
            self,
            toolserver_as_dict(server),
            as_json=opts["json"],
            text=f"tool server {server.name} added; run `acthelm_toolserver test {server.name}`",
        )

    def do_list(self, opts: Options) -> None:
        rows = [toolserver_as_dict(s) for s in ToolServer.objects.all()]
        text = "\n".join(
            f"{r['name']:<20} {r['transport']:<6} {'trusted' if r['trusted'] else 'untrusted':<10}"
            f" {r['test_status']:<9} " + ", ".join(t["name"] for t in r["tools"])
            for r in rows
        )
        emit(self, rows, as_json=opts["json"], text=text or "no tool servers")

    def do_test(self, opts: Options) -> None:
        result = toolserver_test(actor=person_actor(opts["user"]), name=opts["name"])
        text = f"{result['name']}: {'passed' if result['ok'] else 'FAILED'} — "
        text += result["test_message"] or ""
        for tool in result["tools"]:
            text += f"\n  {tool['name']}"
        emit(self, result, as_json=opts["json"], text=text)
        if not result["ok"]:
            raise SystemExit(1)

    def do_remove(self, opts: Options) -> None:
        toolserver_remove(actor=person_actor(opts["user"]), name=opts["name"])
        emit(
            self,
            {"ok": True, "removed": opts["name"]},
            as_json=opts["json"],
            text=f"tool server {opts['name']} removed",
        )
