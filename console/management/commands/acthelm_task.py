"""acthelm_task create|show|list|pending|artifact|pause|withdraw-pause|resume|cancel|approve|deny|
run-again|skip|close|reopen|retry|accept|edit|limits|delete|stats — every console action,
scriptable, with --json output.

`show` prints the answer, the verdict, the artifacts and input files, and the open operations with
the id and hash that approve/deny/run-again/skip take (as `pending` does across tasks); `artifact`
downloads an artifact or an input file."""

import re
import shutil
from argparse import ArgumentTypeError
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.actions import task as person_task
from agents.actions import task_change
from agents.engine.verdict.acceptance import check_text, kind_names
from agents.models import Model
from agents.scorecard import model_scorecard, scorecard_window
from agents.selectors import (
    RunDict,
    task_cost_subquery,
    task_file,
    task_read,
    task_result,
    task_with_history,
)
from agents.states import RunState
from approvals.models import Approval, ReviewDecision
from approvals.selectors import decided_as_dict, open_operations, operations_as_text
from console.actions import REGISTRY, ConsoleAction, by_slug
from console.cli import Actions, Options, emit, fail, person_actor
from console.templatetags.console_time import seconds, usd
from core.actors import Actor
from core.commands import CHECKS
from core.exceptions import ActhelmError, InvalidInput
from tasks.limits import LIMIT_FIELDS
from tasks.models import Task
from tasks.selectors import attempts_text, task_as_dict
from tasks.states import TaskStatus


def _pairs(values: list[str], what: str) -> dict[str, str]:
    result = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(f"{what} must look like name=value, not {item!r}")
        result[key.strip()] = value.strip()
    return result


def _count(value: str) -> int:
    """A --limit: a whole number from 1 to 10000 (argparse reports anything else)."""
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"a whole number, not {value!r}") from None
    if not 1 <= number <= 10_000:
        raise ArgumentTypeError("must be between 1 and 10000")
    return number


def _acceptance_lines(task: Task) -> list[str]:
    """The task's acceptance checks, for `show` (the verdict is in the result's lines)."""
    checks = [check_text(c) for c in task.acceptance_checks or []]
    return ["acceptance checks: " + ("; ".join(checks) if checks else "none (defaults only)")]


def _edits(opts: Options) -> dict[str, Any]:
    """`edit`'s options as `task_update` takes them: only what is given changes."""
    changes: dict[str, Any] = {}
    if opts["instruction"] is not None:
        changes["instruction"] = opts["instruction"]
    if opts["expect"] is not None or opts["no_expect"]:
        changes["acceptance_checks"] = [] if opts["no_expect"] else opts["expect"]
    if opts["tools"] is not None or opts["no_tools"]:
        changes["tools"] = [] if opts["no_tools"] else opts["tools"]
    if opts["policy"]:
        changes["tool_policies"] = _pairs(opts["policy"], "--policy")
    changes |= _pairs(opts["limit"], "--limit")
    if not changes and not opts["retry"]:
        raise InvalidInput("say what to change: --instruction, --expect, --tool, --limit, …")
    return changes


LIMIT_HELP = "NAME=VALUE, repeatable; NAME one of " + ", ".join(LIMIT_FIELDS)
# What a model wrote reaches a terminal: no control characters but newlines and tabs.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    return _CONTROL.sub("\ufffd", text)


def _result_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    if result["verdict_words"]:
        lines.append(f"verdict: {result['verdict_words']}")
    if result["answer"]:
        lines += ["answer:", *("  " + line for line in result["answer"].splitlines())]
    for title, rows in (("artifacts", result["artifacts"]), ("input files", result["input_files"])):
        names = ", ".join(f"{r['name']} ({r['size']} bytes)" for r in rows)
        lines.append(f"{title}: {names or 'none'}")
    return [_printable(line) for line in lines]


def _rejection_lines(rejection: dict[str, Any] | None) -> list[str]:
    """The supervisor's rejection of the newest run, its failed checks, and who accepted it."""
    if rejection is None:
        return []
    lines = [f"rejected run {rejection['run']}: {rejection['reason']}"]
    lines += [
        f"  failed {c['source']}: {c['check']}: {c['detail']}" for c in rejection["failed_checks"]
    ]
    if accepted := rejection["accepted"]:
        lines.append(f"accepted into review by {accepted['by']}: {accepted['reason']}")
    return [_printable(line) for line in lines]


def _add_edit(sub: Actions) -> None:
    """`edit`: change a task that is not running; only what is given changes."""
    edit = sub.add_parser(
        "edit",
        help="change a task that is not running: instruction, checks, tools, limits "
        "(--retry: then run it again now)",
    )
    edit.add_argument("task", type=int)
    edit.add_argument("--instruction")
    which_checks = edit.add_mutually_exclusive_group()
    which_checks.add_argument(
        "--expect",
        action="append",
        metavar="KIND=VALUE",
        help="an acceptance check, repeatable: the new list replaces the task's",
    )
    which_checks.add_argument(
        "--no-expect", action="store_true", help="remove the task's acceptance checks"
    )
    edit_tools = edit.add_mutually_exclusive_group()
    edit_tools.add_argument(
        "--tool", action="append", dest="tools", help="repeatable: the new tool list"
    )
    edit_tools.add_argument("--no-tools", action="store_true", help="take every tool away")
    edit.add_argument("--policy", action="append", default=[], help="TOOL=allow|ask")
    edit.add_argument("--limit", action="append", default=[], help=LIMIT_HELP)
    edit.add_argument(
        "--retry",
        action="store_true",
        help="then retry now (a failed task, or a ready one that drops its wait): the model "
        "continues its conversation and is told, in one message, the task as changed",
    )
    edit.add_argument(
        "--start-over",
        action="store_true",
        help="with --retry: a fresh conversation from the new instruction instead (the earlier "
        "runs stay on record)",
    )


def _run_lines(runs: list[RunDict]) -> list[str]:
    """The runs as the task page's Runs table reads them (`agents.selectors.run_as_dict`)."""
    lines = []
    for run in runs:
        if run["verdict_words"]:
            outcome = run["verdict_words"]
        elif run["error_code"]:
            outcome = f"{run['error_words']} ({run['error_code']})"
        else:
            outcome = ""
        cost = usd(Decimal(run["cost"]) if run["cost"] is not None else None)
        parts = [
            f"run {run['number']}",
            f"attempt {run['attempt']}",
            str(RunState(run["state"]).label),
            f"{run['connection']}/{run['model']}" if run["model"] else "no model",
            f"started {run['started_at']}",
            f"{seconds(run['duration_seconds'])}" if run["finished_at"] else "running",
            f"{run['model_turns']} turns",
            f"{run['input_tokens']}/{run['output_tokens']} tokens",
            cost,
            outcome,
        ]
        lines.append("  " + " · ".join(part for part in parts if part))
    return [_printable(line) for line in (["runs:", *lines] if lines else [])]


class Command(BaseCommand):
    help = "Create, inspect and act on tasks (the console's actions, scriptable)."
    requires_system_checks = CHECKS

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument("--user", help="act as this person (default: $ACTHELM_USER)")
        sub = parser.add_subparsers(dest="action", required=True)

        create = sub.add_parser("create", help="create a task")
        create.add_argument("--title", required=True)
        create.add_argument("--instruction", required=True)
        create.add_argument("--goal", type=int)
        create.add_argument("--priority", type=int, default=0)
        which_tools = create.add_mutually_exclusive_group()
        which_tools.add_argument(
            "--tool",
            action="append",
            dest="tools",
            help="repeatable (default: ACTHELM_DEFAULT_TOOLS)",
        )
        which_tools.add_argument(
            "--no-tools",
            action="store_true",
            help="a task without tools: it may run on a model CLI (llm, claude -p, codex exec)",
        )
        create.add_argument("--policy", action="append", default=[], help="TOOL=allow|ask")
        create.add_argument("--allow-domain", action="append", default=[], dest="domains")
        create.add_argument(
            "--connection",
            help="connection name (default: the best tested, zero-cost model's; tool-capable "
            "unless --no-tools)",
        )
        create.add_argument("--model", help="model name on the connection")
        create.add_argument("--depends-on", type=int, action="append", default=[])
        create.add_argument("--tag", action="append", default=[])
        create.add_argument("--limit", action="append", default=[], help=LIMIT_HELP)
        create.add_argument("--file", action="append", default=[], help="input file to attach")
        create.add_argument(
            "--expect",
            action="append",
            default=[],
            metavar="KIND=VALUE",
            help="an acceptance check, repeatable (e.g. artifact=summary.md, "
            "answer_contains=42, tool_ran=read_file, answer_not_echo); kinds: " + kind_names(),
        )

        lst = sub.add_parser("list", help="list tasks")
        lst.add_argument("--status", choices=TaskStatus.values)
        lst.add_argument("--limit", type=_count, default=50)
        lst.add_argument(
            "--evaluation", action="store_true", help="list the evaluation suite's tasks instead"
        )

        pending = sub.add_parser(
            "pending", help="every operation a person can decide now, across tasks"
        )
        pending.add_argument("--limit", type=_count, default=200)

        stats = sub.add_parser("stats", help="the model scorecard for a period")
        stats.add_argument("--period", choices=["day", "week", "month"], default="week")
        stats.add_argument("--since", help="a date (YYYY-MM-DD); overrides --period")

        show = sub.add_parser("show", help="the task: answer, verdict, artifacts, operations")
        show.add_argument("task", type=int)
        artifact = sub.add_parser("artifact", help="download an artifact or an input file")
        artifact.add_argument("task", type=int)
        artifact.add_argument("name")
        artifact.add_argument("-o", "--output", help="write the file here (default: print it)")
        artifact.add_argument(
            "--input", action="store_true", help="an input file (default: an artifact, else one)"
        )
        limits = sub.add_parser("limits", help="change a task's limits")
        limits.add_argument("task", type=int)
        limits.add_argument("--limit", action="append", required=True, help=LIMIT_HELP)
        _add_edit(sub)
        # One subcommand per console action (console.actions).
        for entry in REGISTRY.values():
            p = sub.add_parser(entry.slug, help=entry.cli_help)
            p.add_argument("task", type=int)
            if entry.target != "task":
                p.add_argument("op", type=int, help=f"the {entry.target}'s id")
                p.add_argument("--hash", required=True, dest="op_hash")
            for item in entry.inputs:
                if item.kind == "model":
                    p.add_argument("--connection", help="the model's connection name")
                    p.add_argument("--model", help=item.help)
                elif item.kind == "raised_limit":
                    p.add_argument(
                        "--raised-limit",
                        help="a new value for the limit it stopped at (an amount for limit_cost)",
                    )
                else:
                    p.add_argument(f"--{item.name}", required=item.required, help=item.help)

    def handle(self, *args: Any, **opts: Any) -> None:
        as_json = opts["json"]
        try:
            return self._dispatch(opts, as_json)
        except ActhelmError as exc:
            fail(self, exc, as_json=as_json)

    def _model(self, opts: Options) -> Model | None:
        """The model of --model (on --connection when given), for resume and retry."""
        if not opts.get("model"):
            return None
        connection = person_task.connection_named(opts.get("connection") or None)
        return person_task.model_named(opts["model"], connection)

    def _dispatch(self, opts: Options, as_json: bool) -> None:
        action = opts["action"]
        if action == "list":
            qs = (
                Task.objects.select_related("connection", "model")
                .prefetch_related("dependency_links")  # one query for all tasks' dependencies
                .annotate(cost_total=task_cost_subquery())
                .order_by("-id")
            )
            if opts["status"]:
                qs = qs.filter(status=opts["status"])
            qs = qs.filter(is_evaluation=opts["evaluation"])
            rows = [task_as_dict(t) for t in qs[: opts["limit"]]]
            text = "\n".join(f"#{r['id']:<6} {r['status']:<18} {r['title']}" for r in rows)
            return emit(self, rows, as_json=as_json, text=text or "no tasks")
        if action == "show":
            read = task_read(opts["task"], transcript=False, all_events=True)
            if read is None:
                raise CommandError(f"task {opts['task']} does not exist [task_not_found]")
            task = read.task
            data = task_with_history(read)
            data["open_operations"] = open_operations(task_id=task.pk)
            result = task_result(read)
            data |= result
            lines = [f"#{task.pk} {task.status} {_printable(task.title)}"]
            if task.failure_code:
                lines.append(_printable(f"failure: {task.failure_code}: {task.failure_message}"))
            if task.failed_attempts:
                lines.append(attempts_text(task.failed_attempts))
            lines += _acceptance_lines(task)
            lines += _result_lines(result)
            data["rejection"] = read.rejection.as_dict() if read.rejection else None
            lines += _rejection_lines(data["rejection"])
            lines += _run_lines(data["runs"])
            lines += ["open operations:", operations_as_text(data["open_operations"])]
            text = "\n".join(lines)
            return emit(self, data, as_json=as_json, text=text)
        if action == "artifact":
            return self._artifact(opts, as_json)
        if action == "pending":
            pending = open_operations(limit=opts["limit"])
            return emit(self, pending, as_json=as_json, text=operations_as_text(pending))
        if action == "stats":
            return self._stats(opts, as_json)

        actor = person_actor(opts["user"])
        if action == "create":
            task = self._create(actor, opts)
        elif action == "edit":
            task = task_change.task_change_and_retry(
                actor=actor,
                task_id=opts["task"],
                changes=_edits(opts),
                retry=opts["retry"],
                start_over=opts["start_over"],
            )
        elif action == "limits":
            task = person_task.task_set_limits(
                actor=actor, task_id=opts["task"], **_pairs(opts["limit"], "--limit")
            )
        else:
            acted = self._act(actor, by_slug(action), opts)
            if isinstance(acted, Approval):
                return self._decided(acted, as_json)
            if acted is None:  # deleted
                return emit(
                    self,
                    {"ok": True, "deleted": opts["task"]},
                    as_json=as_json,
                    text=f"task {opts['task']} deleted",
                )
            task = acted
        task = self._task(task.pk)
        return emit(
            self, task_as_dict(task), as_json=as_json, text=f"task {task.pk}: {task.status}"
        )

    def _decided(self, approval: Approval, as_json: bool) -> None:
        """The task after an approval's decision, and the decision: an edit's new hash (the
        operation that runs), a denial's message."""
        task = self._task(approval.task_id)
        decision = decided_as_dict(approval)
        lines = [f"task {task.pk}: {task.status}", f"approval {approval.pk}: {approval.status}"]
        if approval.edited_arguments_hash:
            lines.append(f"runs with the edited arguments, hash {approval.edited_arguments_hash}")
        if approval.message:
            lines.append(_printable(f"message: {approval.message}"))
        data = task_as_dict(task) | {"decision": decision}
        return emit(self, data, as_json=as_json, text="\n".join(lines))

    def _stats(self, opts: Options, as_json: bool) -> None:
        card = model_scorecard(window=scorecard_window(period=opts["period"], since=opts["since"]))
        lines = [f"{card.window.label} ({card.window.since:%Y-%m-%d %H:%M} to now)"]
        for s in [*card.models, card.totals]:
            cost = "—" if s.cost is None else f"{s.cost:.4f}"
            lines.append(
                f"{s.label:<40} tasks {s.tasks_run:>4}  approved {s.approvals:>4}  "
                f"rejected {s.rejections:>4}  closed {s.closed:>4}  reopened {s.reopened:>4}  "
                f"limits {s.limit_failures:>3}  loops {s.loops:>3}  "
                f"tokens {s.input_tokens}/{s.output_tokens}  cost {cost}"
            )
        return emit(self, card.as_dict(), as_json=as_json, text="\n".join(lines))

    def _artifact(self, opts: Options, as_json: bool) -> None:
        task = self._task(opts["task"])
        kinds = ["input"] if opts["input"] else ["artifact", "input"]
        found = next(
            (f for kind in kinds if (f := task_file(task.pk, opts["name"], kind=kind))), None
        )
        if found is None:
            what = "input file" if opts["input"] else "artifact or input file"
            raise CommandError(f"task {task.pk} has no {what} {opts['name']!r} [not_found]")
        info = {"task": task.pk, "name": found.name, "kind": found.kind,
                "size": found.path.stat().st_size, "content_type": found.content_type}  # fmt: skip
        if opts["output"]:
            with found.path.open("rb") as src, open(opts["output"], "wb") as dst:
                shutil.copyfileobj(src, dst)
            text = f"{found.kind} {found.name} ({info['size']} bytes) written to {opts['output']}"
            return emit(self, info | {"output": opts["output"]}, as_json=as_json, text=text)
        content = found.path.read_bytes().decode("utf-8", errors="replace")
        if as_json:
            return emit(self, info | {"content": content}, as_json=True)
        self.stdout.write(_printable(content.replace("\r\n", "\n")), ending="")
        return None

    def _task(self, task_id: int) -> Task:
        try:
            return Task.objects.select_related("connection", "model").get(pk=task_id)
        except Task.DoesNotExist:
            raise CommandError(f"task {task_id} does not exist [task_not_found]") from None

    def _create(self, actor: Actor, opts: Options) -> Task:
        files = [Path(f) for f in opts["file"]]
        for f in files:
            if not f.is_file():
                raise InvalidInput(f"--file {f} is not a readable file")
        return person_task.task_create_by_name(
            actor=actor,
            files=[(f.name, f) for f in files],  # each counted against the caps as it is copied
            title=opts["title"],
            instruction=opts["instruction"],
            goal=opts["goal"],
            priority=opts["priority"],
            tools=[] if opts["no_tools"] else opts["tools"],
            tool_policies=_pairs(opts["policy"], "--policy"),
            allowed_domains=opts["domains"],
            connection=opts["connection"],
            model=opts["model"],
            depends_on=opts["depends_on"],
            tags=opts["tag"],
            limits=_pairs(opts["limit"], "--limit"),
            acceptance_checks=opts["expect"],
        )

    def _act(self, actor: Actor, entry: ConsoleAction, opts: Options) -> Task | Approval | None:
        """A console action: its inputs from the options, then its service."""
        inputs = {}
        for item in entry.inputs:
            if item.kind == "model":
                inputs[item.name] = self._model(opts)
            elif opts.get(item.name) is not None:
                inputs[item.name] = opts[item.name]
        if entry.target == "task":
            done: Task | None = entry.call(actor=actor, target_id=opts["task"], **inputs)
            return done
        op = opts["op"]
        model = Approval if entry.target == "approval" else ReviewDecision
        owner = model.objects.filter(pk=op).values_list("task_id", flat=True).first()
        if owner is None:
            raise InvalidInput(f"operation {op} does not exist")
        if owner != opts["task"]:
            raise InvalidInput(f"operation {op} belongs to task {owner}, not {opts['task']}")
        decided: Approval | ReviewDecision = entry.call(
            actor=actor, target_id=op, arguments_hash=opts["op_hash"], **inputs
        )
        return decided if isinstance(decided, Approval) else decided.task
