-- Version 6: pause, resume and trigger (see baton::operate).
--
-- A pause is a row of baton_paused; every claim reads it in its atomic step, after taking the
-- job's row lock, which a pause takes too: a pause and a claim of the job serialize, so no
-- claim that the store answers after a pause starts an attempt. Every operation is recorded in
-- baton_operations (the newest 10 000 of a namespace are kept), which the instances read to
-- claim the runs an operator triggered.

CREATE TABLE @schema@.baton_paused (
    namespace text NOT NULL,
    job text NOT NULL,
    record jsonb NOT NULL,
    PRIMARY KEY (namespace, job)
);

CREATE TABLE @schema@.baton_operations (
    id bigserial PRIMARY KEY,
    namespace text NOT NULL,
    job text NOT NULL,
    at bigint NOT NULL,
    record jsonb NOT NULL
);
CREATE INDEX baton_operations_by_time ON @schema@.baton_operations (namespace, at);

-- Locks the job's row (inserted with fence 0 if the job has none), as a claim does first.
CREATE FUNCTION @schema@.baton_lock_job(p_ns text, p_job text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM 1 FROM @schema@.baton_jobs j
        WHERE j.namespace = p_ns AND j.job = p_job FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO @schema@.baton_jobs (namespace, job, fence) VALUES (p_ns, p_job, 0)
            ON CONFLICT (namespace, job) DO NOTHING;
        PERFORM 1 FROM @schema@.baton_jobs j
            WHERE j.namespace = p_ns AND j.job = p_job FOR UPDATE;
    END IF;
END
$$;

-- The claim of the store contract, with the pause read first: a paused job's claim answers
-- paused, except the same claim sent again, which gets its win back (it won before the pause).
-- Otherwise the claim of version 4, in the same transaction (its own lock of the job's row is
-- already held).
CREATE FUNCTION @schema@.baton_claim_unless_paused(
    p_ns text, p_job text, p_slot bigint, p_kind text, p_runner text, p_token text,
    p_digest text, p_lease bigint, p_max_attempts integer, p_skip boolean,
    p_late_limit bigint, p_retention bigint, p_history_size integer
) RETURNS TABLE (
    outcome text, attempt_no integer, attempt_token text, fence_no bigint,
    lease_until bigint, held_by text, other_slot bigint, run_status text
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint;
BEGIN
    PERFORM @schema@.baton_lock_job(p_ns, p_job);
    IF EXISTS (SELECT 1 FROM @schema@.baton_paused p
               WHERE p.namespace = p_ns AND p.job = p_job) THEN
        v_now := @schema@.baton_clock();
        RETURN QUERY SELECT 'won'::text, (r.record ->> 'attempt')::integer, p_token,
                (r.record ->> 'fence')::bigint, r.lease_end, NULL::text, NULL::bigint,
                r.status
            FROM @schema@.baton_runs r
            WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot
              AND r.status = 'running' AND r.lease_end > v_now
              AND r.record ->> 'token' = p_token;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'paused'::text, NULL::integer, NULL::text, NULL::bigint,
                NULL::bigint, NULL::text, NULL::bigint, NULL::text;
        END IF;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM @schema@.baton_claim(p_ns, p_job, p_slot, p_kind, p_runner,
        p_token, p_digest, p_lease, p_max_attempts, p_skip, p_late_limit, p_retention,
        p_history_size);
END
$$;

-- Pause, resume or trigger (p_action: pause, resume, trigger) and its record, under the job's
-- row lock. Answers done and the operation recorded, or, for a trigger of a paused job, paused
-- and the pause in force.
CREATE FUNCTION @schema@.baton_operate(
    p_ns text, p_job text, p_action text, p_host text, p_user text, p_reason text,
    p_stop boolean, p_kept integer
) RETURNS TABLE (outcome text, record text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint;
    v_pause jsonb;
    v_rec jsonb;
BEGIN
    PERFORM @schema@.baton_lock_job(p_ns, p_job);
    v_now := @schema@.baton_clock();
    SELECT p.record INTO v_pause FROM @schema@.baton_paused p
        WHERE p.namespace = p_ns AND p.job = p_job;
    IF p_action = 'trigger' AND v_pause IS NOT NULL THEN
        RETURN QUERY SELECT 'paused'::text, v_pause::text;
        RETURN;
    END IF;
    v_rec := jsonb_build_object(
        'job', p_job,
        'action', CASE p_action WHEN 'pause' THEN 'paused' WHEN 'resume' THEN 'resumed'
                  ELSE 'triggered' END,
        'at', v_now, 'host', p_host, 'user', p_user, 'reason', p_reason,
        'stop', p_action = 'pause' AND p_stop,
        'slot', CASE p_action WHEN 'trigger' THEN v_now END);
    IF p_action = 'pause' THEN
        INSERT INTO @schema@.baton_paused (namespace, job, record) VALUES (p_ns, p_job, v_rec)
            ON CONFLICT (namespace, job) DO UPDATE SET record = excluded.record;
    ELSIF p_action = 'resume' THEN
        DELETE FROM @schema@.baton_paused p WHERE p.namespace = p_ns AND p.job = p_job;
    END IF;
    INSERT INTO @schema@.baton_operations (namespace, job, at, record)
        VALUES (p_ns, p_job, v_now, v_rec);
    DELETE FROM @schema@.baton_operations o
        WHERE o.namespace = p_ns AND o.id <= (
            SELECT k.id FROM @schema@.baton_operations k WHERE k.namespace = p_ns
            ORDER BY k.id DESC OFFSET p_kept LIMIT 1);
    RETURN QUERY SELECT 'done'::text, v_rec::text;
END
$$;
