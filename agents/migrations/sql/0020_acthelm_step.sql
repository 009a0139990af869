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
  SELECT t.status FROM tasks_task t JOIN agents_agentrun r ON r.task_id = t.id
    WHERE t.id = p_task AND r.id = p_run
      AND t.status IN ('in_progress', 'pause_requested')
      AND t.claim_count = r.claim_count
      AND r.status = 'started'
      AND (t.last_person_event_id IS NULL OR t.last_person_event_id < r.claim_event_id)
    FOR NO KEY UPDATE OF t
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
      model_turns = model_turns + (v_usage->>'model_turns')::integer,
      input_tokens = input_tokens + (v_usage->>'input_tokens')::bigint,
      output_tokens = output_tokens + (v_usage->>'output_tokens')::bigint,
      active_seconds = active_seconds + (v_usage->>'active_seconds')::double precision,
      network_requests = network_requests + (v_usage->>'network_requests')::integer,
      mcp_calls = mcp_calls + (v_usage->>'mcp_calls')::integer,
      cost = cost + (v_usage->>'cost')::numeric(16, 8),
      checkpoint = v_text::jsonb,
      answer = coalesce(p_answer, answer),
      answer_stored_at = CASE WHEN p_answer IS NULL THEN answer_stored_at ELSE p_now END
    WHERE id = p_run AND agents_agentrun.status = 'started';
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % is not started', p_run USING ERRCODE = 'AH001';
  END IF;
  IF p_step ? 'conversation' THEN
    INSERT INTO agents_conversation (
      "task_id",
      "system_prompt",
      "system_prompt_sha256",
      "tool_pins",
      "plan",
      "plan_updated_at",
      "created_at")
    SELECT
      r."task_id",
      r."system_prompt",
      r."system_prompt_sha256",
      r."tool_pins",
      r."plan",
      r."plan_updated_at",
      r."created_at"
    FROM jsonb_to_recordset(p_step->'conversation') AS r(
      "task_id" bigint,
      "system_prompt" text,
      "system_prompt_sha256" varchar,
      "tool_pins" jsonb,
      "plan" jsonb,
      "plan_updated_at" timestamp with time zone,
      "created_at" timestamp with time zone);
  END IF;
  IF v_turns <> '{}' THEN
    INSERT INTO agents_turn (
      id,
      "task_id",
      "run_id",
      "index",
      "role",
      "content",
      "stop_reason",
      "discarded",
      "input_tokens",
      "cached_input_tokens",
      "cache_write_tokens",
      "output_tokens",
      "cost",
      "created_at")
    SELECT
      v_turns[r._i],
      r."task_id",
      r."run_id",
      r."index",
      r."role",
      r."content",
      r."stop_reason",
      r."discarded",
      r."input_tokens",
      r."cached_input_tokens",
      r."cache_write_tokens",
      r."output_tokens",
      r."cost",
      r."created_at"
    FROM jsonb_to_recordset(p_step->'turns') AS r(
      "task_id" bigint,
      "run_id" bigint,
      "index" integer,
      "role" varchar,
      "content" text,
      "stop_reason" varchar,
      "discarded" boolean,
      "input_tokens" integer,
      "cached_input_tokens" integer,
      "cache_write_tokens" integer,
      "output_tokens" integer,
      "cost" numeric(14, 8),
      "created_at" timestamp with time zone,
      _i integer);
  END IF;
  IF v_calls <> '{}' THEN
    INSERT INTO agents_toolcall (
      id,
      "task_id",
      "run_id",
      "turn_id",
      "position",
      "call_id",
      "tool",
      "arguments",
      "arguments_raw",
      "arguments_hash",
      "recovery_class",
      "status",
      "result",
      "result_for_model",
      "error_code",
      "compacted",
      "started_at",
      "finished_at",
      "run_count")
    SELECT
      v_calls[r._k],
      r."task_id",
      r."run_id",
      v_turns[r._turn],
      r."position",
      r."call_id",
      r."tool",
      r."arguments",
      r."arguments_raw",
      r."arguments_hash",
      r."recovery_class",
      r."status",
      r."result",
      r."result_for_model",
      r."error_code",
      r."compacted",
      r."started_at",
      r."finished_at",
      r."run_count"
    FROM jsonb_to_recordset(p_step->'calls') AS r(
      "task_id" bigint,
      "run_id" bigint,
      "position" integer,
      "call_id" varchar,
      "tool" varchar,
      "arguments" jsonb,
      "arguments_raw" text,
      "arguments_hash" varchar,
      "recovery_class" varchar,
      "status" varchar,
      "result" text,
      "result_for_model" text,
      "error_code" varchar,
      "compacted" boolean,
      "started_at" timestamp with time zone,
      "finished_at" timestamp with time zone,
      "run_count" integer,
      _k integer,
      _turn integer);
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
      RAISE EXCEPTION 'tool call % cannot become %', m.id, m.status USING ERRCODE = 'AH002';
    END IF;
  END LOOP;
    INSERT INTO tasks_taskevent (
      "task_id",
      "run_id",
      "kind",
      "actor_kind",
      "actor_user_id",
      "actor_label",
      "from_status",
      "to_status",
      "data",
      "created_at")
    SELECT
      r."task_id",
      r."run_id",
      r."kind",
      r."actor_kind",
      r."actor_user_id",
      r."actor_label",
      r."from_status",
      r."to_status",
      CASE WHEN r._call IS NULL THEN r.data ELSE r.data || jsonb_build_object('tool_call_id', v_calls[r._call]) END,
      r."created_at"
    FROM jsonb_to_recordset(p_step->'events') AS r(
      "task_id" bigint,
      "run_id" bigint,
      "kind" varchar,
      "actor_kind" varchar,
      "actor_user_id" integer,
      "actor_label" varchar,
      "from_status" varchar,
      "to_status" varchar,
      "data" jsonb,
      "created_at" timestamp with time zone,
      _call integer);
  new_call_ids := v_calls;
  IF v_handoff IS NOT NULL THEN
    UPDATE agents_agentrun r SET
      status = CASE WHEN v_handoff->'run' ? 'status' THEN v.status ELSE r.status END,
      finished_at = CASE WHEN v_handoff->'run' ? 'finished_at' THEN v.finished_at ELSE r.finished_at END,
      verdict = CASE WHEN v_handoff->'run' ? 'verdict' THEN v.verdict ELSE r.verdict END,
      verdict_reason = CASE WHEN v_handoff->'run' ? 'verdict_reason' THEN v.verdict_reason ELSE r.verdict_reason END,
      answer = CASE WHEN v_handoff->'run' ? 'answer' THEN v.answer ELSE r.answer END,
      error_code = CASE WHEN v_handoff->'run' ? 'error_code' THEN v.error_code ELSE r.error_code END,
      error_message = CASE WHEN v_handoff->'run' ? 'error_message' THEN v.error_message ELSE r.error_message END
      FROM jsonb_populate_record(NULL::agents_agentrun, v_handoff->'run') v
      WHERE r.id = p_run AND r.status = 'started';
    IF NOT FOUND THEN
      RAISE EXCEPTION 'run % is not started', p_run USING ERRCODE = 'AH001';
    END IF;
    UPDATE tasks_task t SET
      status = CASE WHEN v_handoff->'task' ? 'status' THEN v.status ELSE t.status END,
      lease_owner = CASE WHEN v_handoff->'task' ? 'lease_owner' THEN v.lease_owner ELSE t.lease_owner END,
      lease_expires_at = CASE WHEN v_handoff->'task' ? 'lease_expires_at' THEN v.lease_expires_at ELSE t.lease_expires_at END,
      failure_code = CASE WHEN v_handoff->'task' ? 'failure_code' THEN v.failure_code ELSE t.failure_code END,
      failure_message = CASE WHEN v_handoff->'task' ? 'failure_message' THEN v.failure_message ELSE t.failure_message END,
      updated_at = CASE WHEN v_handoff->'task' ? 'updated_at' THEN v.updated_at ELSE t.updated_at END
      FROM jsonb_populate_record(NULL::tasks_task, v_handoff->'task') v
      WHERE t.id = p_task;
    task_status := v_handoff->'task'->>'status';
    handed_off := true;
  END IF;
END
$fn$
