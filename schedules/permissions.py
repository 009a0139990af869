"""The schedules' permissions, named once: Django's default model permissions of `Schedule`.
Pause, resume and run now change a schedule; remove deletes it."""

VIEW_SCHEDULE = "schedules.view_schedule"
ADD_SCHEDULE = "schedules.add_schedule"
CHANGE_SCHEDULE = "schedules.change_schedule"
DELETE_SCHEDULE = "schedules.delete_schedule"
