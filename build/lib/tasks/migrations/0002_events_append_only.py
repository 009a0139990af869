from django.db import migrations

SQL = """
CREATE FUNCTION tasks_taskevent_append_only() RETURNS trigger AS $$
BEGIN
    -- Only the nulling of a reference whose row was deleted (ON DELETE SET NULL) is allowed.
    IF NEW.task_id = OLD.task_id AND NEW.kind = OLD.kind AND NEW.data = OLD.data
       AND NEW.actor_kind = OLD.actor_kind AND NEW.actor_label = OLD.actor_label
       AND NEW.from_status = OLD.from_status AND NEW.to_status = OLD.to_status
       AND NEW.created_at = OLD.created_at
       AND (NEW.run_id IS NOT DISTINCT FROM OLD.run_id OR NEW.run_id IS NULL)
       AND (NEW.actor_user_id IS NOT DISTINCT FROM OLD.actor_user_id OR NEW.actor_user_id IS NULL)
    THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'task events are append-only: an update was refused';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER tasks_taskevent_no_update BEFORE UPDATE ON tasks_taskevent
    FOR EACH ROW EXECUTE FUNCTION tasks_taskevent_append_only();
"""

REVERSE = """
DROP TRIGGER IF EXISTS tasks_taskevent_no_update ON tasks_taskevent;
DROP FUNCTION IF EXISTS tasks_taskevent_append_only();
"""


class Migration(migrations.Migration):
    """A timeline row, once written, is never changed (deletion stays possible for pruning)."""

    dependencies = [("tasks", "0001_initial")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
