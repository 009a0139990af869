"""The permissions of the ledger, named once: the console, the API, the CLI, the admin and the
services check these names. `Task.Meta` declares `operate_task` and `close_task`; the others are
Django's default model permissions of `Task`, `Goal` and the notification models."""

VIEW_TASK = "tasks.view_task"
ADD_TASK = "tasks.add_task"
# Pause, withdraw a pause, resume, retry, cancel, edit, change limits, delete.
OPERATE_TASK = "tasks.operate_task"
# Close a task in review, or reopen it with feedback.
CLOSE_TASK = "tasks.close_task"

VIEW_GOAL = "tasks.view_goal"
ADD_GOAL = "tasks.add_goal"
CHANGE_GOAL = "tasks.change_goal"

VIEW_NOTIFICATION = "tasks.view_notification"
CHANGE_NOTIFICATION_TARGET = "tasks.change_notificationtarget"
