-- The claim function, acthelm_claim: up to p_limit due ready tasks move to in_progress, each with
-- its run and its claim event, in one statement (agents.engine.store.claim). SKIP LOCKED spreads
-- workers over rows; the UPDATE's status guard decides a race (the loser updates nothing, so it
-- inserts nothing). A task whose connection cools down is not a candidate; a worker started by an
-- evaluation (p_evaluation_only) takes the evaluation's tasks only. The other columns of the run
-- and the event come from the JSON of their defaults (p_run, p_event): a column added later with a
-- default needs no new function. A template: {{name}} is filled at render time
-- (agents.engine.store.functions) from the enums and the models' column lists. These leading
-- comment lines are the template's, not the function's; a change that renders another text needs
-- a migration that applies the new text (agents/migrations/sql/).
CREATE OR REPLACE FUNCTION acthelm_claim(
  p_worker text, p_lease double precision, p_limit integer, p_evaluation_only boolean,
  p_run jsonb, p_event jsonb)
RETURNS TABLE (task_id bigint, run_id bigint, claim_count integer, event_id bigint)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH candidate AS (
    SELECT t.id FROM tasks_task t
    WHERE t.status = {{ready}}
      AND (t.not_before IS NULL OR t.not_before <= now())
      AND NOT EXISTS (
          SELECT 1 FROM tasks_taskdependency d
          JOIN tasks_task dep ON dep.id = d.depends_on_id
          WHERE d.task_id = t.id AND dep.status <> {{done}})
      AND NOT EXISTS (
          SELECT 1 FROM agents_connection k
          WHERE k.id = t.connection_id AND k.cooldown_until > now())
      AND (t.is_evaluation OR NOT p_evaluation_only)
    ORDER BY t.priority DESC, t.id
    LIMIT p_limit
    FOR UPDATE OF t SKIP LOCKED
), claimed AS (
    UPDATE tasks_task t
    SET status = {{in_progress}}, claim_count = t.claim_count + 1, lease_owner = p_worker,
        lease_expires_at = now() + make_interval(secs => p_lease), not_before = NULL,
        updated_at = now()
    FROM candidate WHERE t.id = candidate.id AND t.status = {{ready}}
    RETURNING t.id, t.claim_count, t.connection_id, t.model_id, t.priority
), previous AS (
    SELECT DISTINCT ON (r.task_id) r.task_id, r.id, r.number
    FROM agents_agentrun r JOIN claimed c ON r.task_id = c.id
    ORDER BY r.task_id, r.number DESC
), ids AS (
    SELECT c.id AS task_id,
           nextval('agents_agentrun_id_seq'::regclass) AS run_id,
           nextval('tasks_taskevent_id_seq'::regclass) AS event_id
    FROM claimed c
), run AS (
    INSERT INTO agents_agentrun ({{run_columns}})
    SELECT {{run_values}}
    FROM claimed c JOIN ids ON ids.task_id = c.id LEFT JOIN previous p ON p.task_id = c.id,
      jsonb_populate_record(NULL::agents_agentrun, p_run) AS run_default
    RETURNING id
), event AS (
    INSERT INTO tasks_taskevent ({{event_columns}})
    SELECT {{event_values}}
    FROM claimed c JOIN ids ON ids.task_id = c.id LEFT JOIN previous p ON p.task_id = c.id,
      jsonb_populate_record(NULL::tasks_taskevent, p_event) AS event_default
    RETURNING id
)
SELECT c.id::bigint, ids.run_id::bigint, c.claim_count::integer, ids.event_id::bigint
FROM claimed c JOIN ids ON ids.task_id = c.id
WHERE (SELECT count(*) FROM run) = (SELECT count(*) FROM claimed)
  AND (SELECT count(*) FROM event) = (SELECT count(*) FROM claimed)
ORDER BY c.priority DESC, c.id;
END
$fn$
