"""acthelm_schedule add|list|show|pause|resume|run-now|remove|tick — schedules, scriptable, with
--json output. A schedule is named by its id or its name."""

from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from agents.engine.verdict.acceptance import kind_names
from console.cli import ActionCommand, Actions, Options, emit, person_actor
from core.exceptions import InvalidInput
from schedules import services
from schedules.models import Schedule
from schedules.selectors import schedule_as_dict, schedules_with_last
from schedules.states import CatchUpPolicy, OverlapPolicy, ScheduleTarget
from tasks.limits import LIMIT_FIELDS

SHOW_SLOTS = 50


def _pairs(values: list[str], what: str) -> dict[str, str]:
    result = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(f"{what} must look like name=value, not {item!r}")
        result[key.strip()] = value.strip()
    return result


def _when(value: str | None) -> datetime | None:
    if not value:
        return None
    parsed = parse_datetime(value)
    if parsed is None or parsed.tzinfo is None:
        raise InvalidInput(
            f"--ends-at must be an ISO 8601 time with its offset, e.g. "
            f"2027-01-31T18:00+01:00, not {value!r}",
            field="ends_at",
        )
    return parsed


def _line(data: dict[str, object]) -> str:
    state = "paused" if data["paused"] else "ended" if data["ended"] else "active"
    runs = data["next_runs"]
    following = runs[0] if isinstance(runs, list) and runs else "—"
    last = data["last_result"]
    result = "—"
    if isinstance(last, dict):
        result = str(last["outcome"])
        if last["task_id"]:
            result += f" task #{last['task_id']}"
        if last["reason"]:
            result += f" ({last['reason']})"
    return (
        f"#{data['id']:<4} {data['name']:<24} {state:<7} {data['cron']:<16} "
        f"{data['timezone']:<18} next {following}  last {result}"
    )


class Command(ActionCommand):
    person_option = True

    help = "Add, list, show, pause, resume, run now and remove schedules; tick runs one pass."

    def add_actions(self, sub: Actions) -> None:
        add = sub.add_parser("add", help="add a schedule")
        add.add_argument("--name", required=True)
        add.add_argument("--cron", required=True, help="five fields, e.g. '0 8 * * 1-5'")
        add.add_argument("--timezone", default="UTC", help="an IANA name, e.g. Europe/Berlin")
        add.add_argument("--title", required=True, help="what each task (or goal) is called")
        add.add_argument("--instruction", required=True, help="the task's instruction")
        add.add_argument("--target", choices=ScheduleTarget.values, default=ScheduleTarget.TASK)
        add.add_argument("--goal", type=int, help="the goal each task is for")
        add.add_argument("--connection", help="the connection's name")
        add.add_argument("--model", help="the model's name on the connection")
        which_tools = add.add_mutually_exclusive_group()
        which_tools.add_argument("--tool", action="append", dest="tools", help="repeatable")
        which_tools.add_argument("--no-tools", action="store_true")
        add.add_argument("--policy", action="append", default=[], help="TOOL=allow|ask")
        add.add_argument("--allow-domain", action="append", default=[], dest="domains")
        add.add_argument("--tag", action="append", default=[])
        add.add_argument(
            "--limit",
            action="append",
            default=[],
            help="NAME=VALUE, repeatable; NAME one of " + ", ".join(LIMIT_FIELDS),
        )
        add.add_argument(
            "--expect",
            action="append",
            default=[],
            metavar="KIND=VALUE",
            help="an acceptance check, repeatable; kinds: " + kind_names(),
        )
        add.add_argument("--priority", type=int, default=0)
        add.add_argument("--overlap", choices=OverlapPolicy.values, default=OverlapPolicy.SKIP)
        add.add_argument("--catch-up", choices=CatchUpPolicy.values, default=CatchUpPolicy.LATEST)
        add.add_argument("--ends-at", help="no slot after this time (ISO 8601 with offset)")
        sub.add_parser("list", help="every schedule with its next run and last result")
        show = sub.add_parser("show", help="a schedule with its newest slots")
        show.add_argument("schedule", help="id or name")
        for name, text in (
            ("pause", "decide no slot until resumed"),
            ("resume", "run again from the next slot (the paused ones are recorded, not run)"),
            ("run-now", "create its task (or goal) now"),
            ("remove", "remove it (the tasks it created stay)"),
        ):
            sub.add_parser(name, help=text).add_argument("schedule", help="id or name")
        sub.add_parser("tick", help="one pass: decide every due slot (the worker does this)")

    def handle(self, *args: Any, **opts: Any) -> str | None:
        opts["action"] = opts["action"].replace("-", "_")  # run-now: do_run_now
        return super().handle(*args, **opts)

    def _id(self, ref: str) -> int:
        found = Schedule.objects.filter(**{"pk": int(ref)} if ref.isdigit() else {"name": ref})
        pk = found.values_list("pk", flat=True).first()
        if pk is None:
            raise services.ScheduleNotFound(f"schedule {ref!r} does not exist")
        return pk

    def _show(self, pk: int, opts: Options, text: str, slots: int = 0) -> None:
        data = schedule_as_dict(Schedule.objects.get(pk=pk), with_slots=slots)
        emit(self, data, as_json=opts["json"], text=text or _line(data))

    def do_add(self, opts: Options) -> None:
        schedule = services.schedule_create(
            actor=person_actor(opts["user"]),
            name=opts["name"],
            cron=opts["cron"],
            timezone=opts["timezone"],
            title=opts["title"],
            instruction=opts["instruction"],
            target=opts["target"],
            goal=opts["goal"],
            connection=opts["connection"],
            model=opts["model"],
            tools=[] if opts["no_tools"] else opts["tools"],
            tool_policies=_pairs(opts["policy"], "--policy"),
            allowed_domains=opts["domains"],
            tags=opts["tag"],
            limits=_pairs(opts["limit"], "--limit"),
            acceptance_checks=opts["expect"],
            priority=opts["priority"],
            overlap=opts["overlap"],
            catch_up=opts["catch_up"],
            ends_at=_when(opts["ends_at"]),
        )
        self._show(schedule.pk, opts, f"schedule {schedule.pk} added: {schedule.name}")

    def do_list(self, opts: Options) -> None:
        rows = [schedule_as_dict(s) for s in schedules_with_last()]
        emit(
            self,
            rows,
            as_json=opts["json"],
            text="\n".join(_line(r) for r in rows) or "no schedules",
        )

    def do_show(self, opts: Options) -> None:
        pk = self._id(opts["schedule"])
        data = schedule_as_dict(Schedule.objects.get(pk=pk), with_slots=SHOW_SLOTS)
        lines = [_line(data), f"  {data['cron_text']}; cost so far ${data['cost']}"]
        lines += [
            f"  {s['slot_at']}  {s['kind']:<9} {s['outcome']:<8} "
            + (f"task #{s['task_id']} " if s["task_id"] else "")
            + (f"goal #{s['goal_id']} " if s["goal_id"] else "")
            + (f"{s['reason']}: {s['detail']}" if s["reason"] else "")
            for s in data["slots"]
        ]
        emit(self, data, as_json=opts["json"], text="\n".join(lines))

    def do_pause(self, opts: Options) -> None:
        pk = self._id(opts["schedule"])
        services.schedule_pause(actor=person_actor(opts["user"]), schedule_id=pk)
        self._show(pk, opts, f"schedule {pk} paused")

    def do_resume(self, opts: Options) -> None:
        pk = self._id(opts["schedule"])
        services.schedule_resume(actor=person_actor(opts["user"]), schedule_id=pk)
        self._show(pk, opts, f"schedule {pk} resumed")

    def do_run_now(self, opts: Options) -> None:
        pk = self._id(opts["schedule"])
        slot = services.schedule_run_now(actor=person_actor(opts["user"]), schedule_id=pk)
        what = f"task #{slot.task_id}" if slot.task_id else f"goal #{slot.goal_id}"
        data = schedule_as_dict(Schedule.objects.get(pk=pk)) | {
            "created": {"task_id": slot.task_id, "goal_id": slot.goal_id}
        }
        emit(self, data, as_json=opts["json"], text=f"schedule {pk}: {what} created")

    def do_remove(self, opts: Options) -> None:
        pk = self._id(opts["schedule"])
        services.schedule_delete(actor=person_actor(opts["user"]), schedule_id=pk)
        emit(self, {"deleted": pk}, as_json=opts["json"], text=f"schedule {pk} removed")

    def do_tick(self, opts: Options) -> None:
        report = services.schedules_tick()
        data = report.as_dict()
        emit(
            self,
            data,
            as_json=opts["json"],
            text=", ".join(f"{k} {v}" for k, v in data.items()),
        )
