"""acthelm_notify add|list|test|remove|deliver — notification targets and the outbox, scriptable."""

from console.cli import ActionCommand, Actions, Options, emit
from core.exceptions import ErrorCode, InvalidInput
from tasks.notify.channels import channel_kinds, get_channel
from tasks.notify.delivery import deliver_due
from tasks.notify.models import NotificationTarget
from tasks.notify.states import NotifyEvent
from tasks.notify.targets import (
    target_add,
    target_remove,
    target_summary,
    target_test,
)


class Command(ActionCommand):
    help = (
        f"Manage notification targets ({', '.join(channel_kinds())}) and deliver the outbox once."
    )

    def add_actions(self, sub: Actions) -> None:

        add = sub.add_parser("add", help="add a target")
        add.add_argument("name")
        where = add.add_mutually_exclusive_group(required=True)
        for kind in channel_kinds():  # one option per registered channel: --email, --webhook
            where.add_argument(
                f"--{kind.replace('_', '-')}", dest=kind, help=get_channel(kind).address_help
            )
        add.add_argument(
            "--secret-env",
            default="",
            help="NAME of the environment variable holding the webhook's (or the Slack app's) "
            "signing secret",
        )
        add.add_argument(
            "--token-env",
            default="",
            help="Slack: NAME of the environment variable holding the bot token",
        )
        add.add_argument(
            "--event",
            action="append",
            dest="events",
            choices=NotifyEvent.values,
            help="repeatable; default: every event",
        )

        sub.add_parser("list", help="list targets and their state")
        test = sub.add_parser("test", help="send a sample through the target's channel now")
        test.add_argument("name")
        remove = sub.add_parser("remove", help="remove a target (its pending rows fail)")
        remove.add_argument("name")
        deliver = sub.add_parser("deliver", help="one delivery pass over the due notifications")
        deliver.add_argument("--limit", type=int, help="at most this many sends")

    def do_add(self, opts: Options) -> None:
        as_json = opts["json"]
        kind = next(k for k in channel_kinds() if opts[k] is not None)
        address = opts[kind]
        if NotificationTarget.objects.filter(name=opts["name"]).exists():
            raise InvalidInput(
                f"a target named {opts['name']!r} exists", code=ErrorCode.TARGET_EXISTS
            )
        target = target_add(
            name=opts["name"],
            kind=kind,
            address=address,
            secret_env=opts["secret_env"],
            token_env=opts["token_env"],
            events=opts["events"],
        )
        emit(
            self,
            {"ok": True, "target": target_summary(target)},
            as_json=as_json,
            text=f"added {target.name}: {target.kind} {target.address} "
            f"for {', '.join(target.events)}",
        )

    def do_list(self, opts: Options) -> None:
        as_json = opts["json"]
        rows = [target_summary(t) for t in NotificationTarget.objects.order_by("name")]
        lines = [
            f"{r['name']:<20} {r['kind']:<8} {r['state']:<9} "
            f"{','.join(r['events'])}  {r['address']}"
            + (f"  last error: {r['last_error_code']}" if r["last_error_code"] else "")
            for r in rows
        ]
        emit(self, rows, as_json=as_json, text="\n".join(lines) or "no notification targets")

    def do_test(self, opts: Options) -> None:
        as_json = opts["json"]
        receipt = target_test(name=opts["name"])
        emit(
            self,
            {"ok": True, "target": opts["name"], "receipt": receipt},
            as_json=as_json,
            text=f"sent a test notification to {opts['name']}: {receipt}",
        )

    def do_remove(self, opts: Options) -> None:
        as_json = opts["json"]
        dropped = target_remove(name=opts["name"])
        emit(
            self,
            {"ok": True, "removed": opts["name"], "pending_dropped": dropped},
            as_json=as_json,
            text=f"removed {opts['name']} ({dropped} pending notification(s) marked failed)",
        )

    def do_deliver(self, opts: Options) -> None:
        as_json = opts["json"]
        report = deliver_due(limit=opts["limit"])
        data = {
            "delivered": report.delivered,
            "retrying": report.retrying,
            "failed": report.failed,
            "results": report.results,
        }
        text = "\n".join(
            [
                f"#{r['id']} {r['event']} → {r['target']}: {r['status']}"
                + (f" ({r['code']}: {r['error']})" if r["code"] else "")
                for r in report.results
            ]
            + [f"delivered {report.delivered}, retrying {report.retrying}, failed {report.failed}"]
        )
        emit(self, data, as_json=as_json, text=text)
