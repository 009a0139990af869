"""acthelm_goal create|list|show|deactivate — goals, scriptable, with --json output."""

from agents.actions import goal as goal_actions
from agents.engine.verdict.acceptance import check_text, kind_names
from console.cli import ActionCommand, Actions, Options, emit, person_actor
from core.exceptions import GoalNotFound
from tasks.models import Goal
from tasks.selectors import goal_as_dict

SHOW_TASKS = 100


class Command(ActionCommand):
    person_option = True

    help = "Create, list, show and deactivate goals (the reconciler plans active goals)."

    def add_actions(self, sub: Actions) -> None:
        create = sub.add_parser("create", help="create an active goal")
        create.add_argument("--title", required=True)
        create.add_argument("--description", default="")
        create.add_argument(
            "--expect",
            action="append",
            default=[],
            metavar="KIND=VALUE",
            help="an acceptance check of the goal's work, repeatable: the default of a person's "
            "task with this goal, added to a follow-up that inherits its parent's checks; "
            "kinds: " + kind_names(),
        )
        lst = sub.add_parser("list", help="list goals, newest first")
        state = lst.add_mutually_exclusive_group()
        state.add_argument("--active", action="store_true", help="only active goals")
        state.add_argument("--inactive", action="store_true", help="only inactive goals")
        show = sub.add_parser("show", help="a goal with its newest tasks")
        show.add_argument("goal", type=int)
        deactivate = sub.add_parser("deactivate", help="the reconciler stops planning it")
        deactivate.add_argument("goal", type=int)

    def _goal(self, goal_id: int) -> Goal:
        goal = Goal.objects.select_related("created_by").filter(pk=goal_id).first()
        if goal is None:
            raise GoalNotFound(f"goal {goal_id} does not exist")
        return goal

    def do_create(self, opts: Options) -> None:
        as_json = opts["json"]
        actor = person_actor(opts["user"])
        goal = goal_actions.goal_create(
            actor=actor,
            title=opts["title"],
            description=opts["description"],
            acceptance_checks=opts["expect"],
        )
        data = goal_as_dict(self._goal(goal.pk))
        emit(self, data, as_json=as_json, text=f"goal {goal.pk} created: {goal.title}")

    def do_list(self, opts: Options) -> None:
        as_json = opts["json"]
        goals = Goal.objects.select_related("created_by").order_by("-id")
        if opts["active"]:
            goals = goals.filter(active=True)
        elif opts["inactive"]:
            goals = goals.filter(active=False)
        rows = [goal_as_dict(g) for g in goals]
        text = "\n".join(
            f"#{r['id']:<5} {'active' if r['active'] else 'inactive':<9} "
            f"open {r['open_tasks']:<4} "
            f"{r['title']}"
            for r in rows
        )
        emit(self, rows, as_json=as_json, text=text or "no goals")

    def do_show(self, opts: Options) -> None:
        as_json = opts["json"]
        data = goal_as_dict(self._goal(opts["goal"]), with_tasks=SHOW_TASKS)
        lines = [
            f"goal {data['id']}: {data['title']} ({'active' if data['active'] else 'inactive'})"
        ]
        if data["description"]:
            lines.append(data["description"])
        if data["acceptance_checks"]:
            checks = "; ".join(check_text(c) for c in data["acceptance_checks"])
            lines.append(f"acceptance checks: {checks}")
        lines += [f"  #{t['id']:<6} {t['status']:<18} {t['title']}" for t in data["tasks"]]
        emit(self, data, as_json=as_json, text="\n".join(lines))

    def do_deactivate(self, opts: Options) -> None:
        as_json = opts["json"]
        actor = person_actor(opts["user"])
        goal_actions.goal_deactivate(actor=actor, goal_id=opts["goal"])
        data = goal_as_dict(self._goal(opts["goal"]))
        emit(self, data, as_json=as_json, text=f"goal {opts['goal']} deactivated")
