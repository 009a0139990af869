from django.db import migrations

SQL = """
CREATE FUNCTION tasks_task_claim_count_monotonic() RETURNS trigger AS $$
BEGIN
    IF NEW.claim_count < OLD.claim_count THEN
        RAISE EXCEPTION 'a task''s claim counter never decreases (% -> %)',
            OLD.claim_count, NEW.claim_count;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER tasks_task_claim_count_monotonic BEFORE UPDATE OF claim_count ON tasks_task
    FOR EACH ROW EXECUTE FUNCTION tasks_task_claim_count_monotonic();
"""

REVERSE = """
DROP TRIGGER IF EXISTS tasks_task_claim_count_monotonic ON tasks_task;
DROP FUNCTION IF EXISTS tasks_task_claim_count_monotonic();
"""


class Migration(migrations.Migration):
    """The fencing counter is what makes a late write of an old attempt detectable; a bug that
    lowered it would silently let such a write through, so PostgreSQL refuses it."""

    dependencies = [("tasks", "0003_hot_heartbeats")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
