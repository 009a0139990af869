-- The step function, acthelm_step: the common step's write as one statement (agents.engine.store.
-- statement). A template: {{name}} is filled at render time (agents.engine.store.functions) from
-- the enums (statuses, as quoted literals), the SQLSTATEs the store raises, and the models'
-- column lists. These leading comment lines are the template's, not the function's.
-- A change here that renders another text needs a migration that applies the new text
-- (agents/migrations/sql/, tests/agents/test_store_functions.py).
CREATE OR REPLACE FUNCTION acthelm_step(
  p_task bigint, p_run bigint, p_texts text[], p_marks integer[],
  p_answer text, p_now timestamptz, p_step jsonb,
  OUT task_status varchar, OUT new_call_ids bigint[], OUT handed_off boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
  v_usage jsonb := p_step->'usage';
  v_turns bigint[];
  v_calls bigint[];
  v_text text;
  m record;
  v_handoff jsonb := p_step->'handoff';
BEGIN
  {{fence}}
    INTO task_status;
  IF task_status IS NULL THEN
    RETURN;
  END IF;
  IF v_handoff IS NOT NULL THEN
    -- Declined, nothing written: the task is not in the status the run's end was decided for,
    -- or a notification target wants the move (its outbox rows are written in Python).
    IF task_status IS DISTINCT FROM v_handoff->>'from' OR (
        v_handoff->>'notify' IS NOT NULL AND EXISTS (
          SELECT 1 FROM tasks_notificationtarget n
          WHERE n.enabled AND n.events @> ARRAY[v_handoff->>'notify']::varchar[])) THEN
      handed_off := false;
      RETURN;
    END IF;
  END IF;
  v_turns := ARRAY(SELECT nextval('agents_turn_id_seq'::regclass)
    FROM jsonb_array_elements(p_step->'turns'));
  v_calls := ARRAY(SELECT nextval('agents_toolcall_id_seq'::regclass)
    FROM jsonb_array_elements(p_step->'calls'));
  v_text := p_texts[1];
  FOR i IN 1 .. coalesce(array_length(p_marks, 1), 0) LOOP
    v_text := v_text || v_calls[p_marks[i]]::text || p_texts[i + 1];
  END LOOP;
  UPDATE agents_agentrun SET
      {{usage}},
      checkpoint = v_text::jsonb,
      answer = coalesce(p_answer, answer),
      answer_stored_at = CASE WHEN p_answer IS NULL THEN answer_stored_at ELSE p_now END
    WHERE id = p_run AND agents_agentrun.status = {{started}};
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % is not started', p_run USING ERRCODE = {{not_started}};
  END IF;
  IF p_step ? 'conversation' THEN
{{insert_conversation}}
  END IF;
  IF v_turns <> '{}' THEN
{{insert_turns}}
  END IF;
  IF v_calls <> '{}' THEN
{{insert_calls}}
  END IF;
  FOR m IN SELECT * FROM jsonb_to_recordset(p_step->'moves') AS x(
      id bigint, status varchar, result text, rfm text, code varchar,
      finished timestamptz, started timestamptz, runs integer, arguments jsonb,
      hash varchar, sources varchar[])
  LOOP
    UPDATE agents_toolcall c SET
          status = m.status,
          result = coalesce(m.result, c.result),
          result_for_model = coalesce(m.rfm, c.result_for_model),
          error_code = coalesce(m.code, c.error_code),
          finished_at = coalesce(m.finished, c.finished_at),
          started_at = coalesce(m.started, c.started_at),
          run_count = c.run_count + m.runs,
          arguments = coalesce(m.arguments, c.arguments),
          arguments_hash = coalesce(m.hash, c.arguments_hash),
          run_id = p_run
        WHERE c.id = m.id AND c.status = ANY(m.sources);
    IF NOT FOUND THEN
      RAISE EXCEPTION 'tool call % cannot become %', m.id, m.status USING ERRCODE = {{refused}};
    END IF;
  END LOOP;
{{insert_events}}
  new_call_ids := v_calls;
  IF v_handoff IS NOT NULL THEN
    UPDATE agents_agentrun r SET
      {{run_end}}
      FROM jsonb_populate_record(NULL::agents_agentrun, v_handoff->'run') v
      WHERE r.id = p_run AND r.status = {{started}};
    IF NOT FOUND THEN
      RAISE EXCEPTION 'run % is not started', p_run USING ERRCODE = {{not_started}};
    END IF;
    UPDATE tasks_task t SET
      {{task_move}}
      FROM jsonb_populate_record(NULL::tasks_task, v_handoff->'task') v
      WHERE t.id = p_task;
    task_status := v_handoff->'task'->>'status';
    handed_off := true;
  END IF;
END
$fn$
