from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0012_task_dependency_plural"),
    ]

    operations = [
        migrations.AddField(
            model_name="goal",
            name="acceptance_checks",
            field=models.JSONField(blank=True, default=list, editable=False),
        ),
    ]
