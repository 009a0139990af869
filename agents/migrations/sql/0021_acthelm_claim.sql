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
    WHERE t.status = 'ready'
      AND (t.not_before IS NULL OR t.not_before <= now())
      AND NOT EXISTS (
          SELECT 1 FROM tasks_taskdependency d
          JOIN tasks_task dep ON dep.id = d.depends_on_id
          WHERE d.task_id = t.id AND dep.status <> 'done')
      AND NOT EXISTS (
          SELECT 1 FROM agents_connection k
          WHERE k.id = t.connection_id AND k.cooldown_until > now())
      AND (t.is_evaluation OR NOT p_evaluation_only)
    ORDER BY t.priority DESC, t.id
    LIMIT p_limit
    FOR UPDATE OF t SKIP LOCKED
), claimed AS (
    UPDATE tasks_task t
    SET status = 'in_progress', claim_count = t.claim_count + 1, lease_owner = p_worker,
        lease_expires_at = now() + make_interval(secs => p_lease), not_before = NULL,
        updated_at = now()
    FROM candidate WHERE t.id = candidate.id AND t.status = 'ready'
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
    INSERT INTO agents_agentrun (id, task_id, number, claim_count, claim_event_id, status, connection_id, model_id, worker_id, started_at, heartbeat_at, finished_at, model_turns, input_tokens, output_tokens, network_requests, active_seconds, mcp_calls, cost, checkpoint, answer, answer_stored_at, verdict, verdict_reason, error_code, error_message)
    SELECT ids.run_id, c.id, coalesce(p.number, 0) + 1, c.claim_count, ids.event_id, 'started', c.connection_id, c.model_id, p_worker, now(), run_default."heartbeat_at", run_default."finished_at", run_default."model_turns", run_default."input_tokens", run_default."output_tokens", run_default."network_requests", run_default."active_seconds", run_default."mcp_calls", run_default."cost", run_default."checkpoint", run_default."answer", run_default."answer_stored_at", run_default."verdict", run_default."verdict_reason", run_default."error_code", run_default."error_message"
    FROM claimed c JOIN ids ON ids.task_id = c.id LEFT JOIN previous p ON p.task_id = c.id,
      jsonb_populate_record(NULL::agents_agentrun, p_run) AS run_default
    RETURNING id
), event AS (
    INSERT INTO tasks_taskevent (id, task_id, run_id, kind, actor_kind, actor_user_id, actor_label, from_status, to_status, data, created_at)
    SELECT ids.event_id, c.id, ids.run_id, 'claimed', 'worker', NULL, p_worker, 'ready', 'in_progress', jsonb_build_object('run_id', ids.run_id, 'newest_run_id_before', p.id, 'claim_count', c.claim_count), now()
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
