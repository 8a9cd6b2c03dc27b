-- Version 1: runs, per-job fences, and one function per store operation.
--
-- `@schema@` stands for the store's schema (quoted); every name is qualified with it, so the
-- functions do not depend on the session's search_path.
--
-- A run is kept as its JSON record (what `baton::lease::Run` serializes to), with the columns
-- the functions search on beside it: status and lease end. Times are ms since the Unix epoch on
-- the server's clock, `clock_timestamp()`, read inside each function after its row locks.

CREATE TABLE @schema@.baton_jobs (
    namespace text NOT NULL,
    job text NOT NULL,
    -- The fence of the job's last won claim (0 before the first). Claims of the job serialize
    -- on this row's lock.
    fence bigint NOT NULL,
    PRIMARY KEY (namespace, job)
);

CREATE TABLE @schema@.baton_runs (
    namespace text NOT NULL,
    job text NOT NULL,
    slot bigint NOT NULL,
    status text NOT NULL,
    lease_end bigint NOT NULL,
    record jsonb NOT NULL,
    PRIMARY KEY (namespace, job, slot)
);

-- The overlap check and `unfinished`: the running runs of a job.
CREATE INDEX baton_runs_running ON @schema@.baton_runs (namespace, job, slot)
    WHERE status = 'running';
-- The history trim: the finished runs of a job, newest first.
CREATE INDEX baton_runs_finished ON @schema@.baton_runs (namespace, job, slot)
    WHERE status <> 'running';

-- The store's clock, ms since the Unix epoch.
CREATE FUNCTION @schema@.baton_clock() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;

-- Ends the current attempt of an expired run as died, at its lease end, unless it has ended
-- already (a hand-over records its end when it releases).
CREATE FUNCTION @schema@.baton_end_as_died(rec jsonb, lease_end bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN coalesce(rec #> '{attempts,-1,outcome}', 'null'::jsonb) = 'null'::jsonb
             AND jsonb_array_length(rec -> 'attempts') > 0
        THEN jsonb_set(jsonb_set(rec, '{attempts,-1,outcome}', '"died"'),
                       '{attempts,-1,ended_at}', to_jsonb(lease_end))
        ELSE rec
    END
$$;

-- One attempt's record.
CREATE FUNCTION @schema@.baton_attempt(
    attempt integer, runner text, token text, reason text, fence bigint, started_at bigint,
    digest text
) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'attempt', attempt, 'runner', runner, 'token', token, 'reason', reason,
        'fence', fence, 'started_at', started_at, 'ended_at', NULL, 'outcome', NULL,
        'digest', digest)
$$;

-- The claim of the store contract, steps 1 to 3 (see runtime/src/store/model.rs).
--
-- outcome is one of won, running, overlap, late, superseded, finished, interrupted; the other
-- columns carry what that outcome says (other_slot: the blocking slot of an overlap, or the
-- newer slot of a superseded claim).
CREATE FUNCTION @schema@.baton_claim(
    p_ns text, p_job text, p_slot bigint, p_kind text, p_runner text, p_token text,
    p_digest text, p_lease bigint, p_max_attempts integer, p_skip boolean,
    p_late_limit bigint, p_retention bigint, p_history_size integer
) RETURNS TABLE (
    outcome text, attempt_no integer, attempt_token text, fence_no bigint,
    lease_until bigint, held_by text, other_slot bigint, run_status text
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_fence bigint;
    v_now bigint;
    v_status text;
    v_lease_end bigint;
    v_rec jsonb;
    v_newest bigint;
    v_blocking bigint;
    v_expired bigint;
    v_deaths integer;
    v_attempt integer;
BEGIN
    -- Every claim of the job serializes on the job's row, so two claims of different slots
    -- cannot both see "no live run" (write skew under READ COMMITTED).
    SELECT j.fence INTO v_fence FROM @schema@.baton_jobs j
        WHERE j.namespace = p_ns AND j.job = p_job FOR UPDATE;
    IF NOT FOUND THEN
        -- The job's first claim: the row this transaction inserts is its own until it
        -- commits; a claim that lost the insert race waits for that, then locks the row.
        INSERT INTO @schema@.baton_jobs (namespace, job, fence) VALUES (p_ns, p_job, 0)
            ON CONFLICT (namespace, job) DO NOTHING
            RETURNING fence INTO v_fence;
        IF NOT FOUND THEN
            SELECT j.fence INTO v_fence FROM @schema@.baton_jobs j
                WHERE j.namespace = p_ns AND j.job = p_job FOR UPDATE;
        END IF;
    END IF;

    -- The store's clock, read once the job is ours: the rows locked below show their latest
    -- versions, so a lease a heartbeat renewed meanwhile is seen alive.
    v_now := @schema@.baton_clock();

    -- The claimed run, locked against a heartbeat, finish or release racing this claim.
    SELECT r.status, r.lease_end, r.record INTO v_status, v_lease_end, v_rec
        FROM @schema@.baton_runs r
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot FOR UPDATE;

    -- Step 1: the slot has state.
    IF v_rec IS NOT NULL THEN
        IF v_status <> 'running' THEN
            RETURN QUERY SELECT 'finished'::text, NULL::integer, NULL::text, NULL::bigint,
                NULL::bigint, NULL::text, NULL::bigint, v_status;
            RETURN;
        END IF;
        IF v_lease_end > v_now THEN
            IF v_rec ->> 'token' = p_token THEN
                -- The same claim sent again (its answer was lost): it won already.
                RETURN QUERY SELECT 'won'::text, (v_rec ->> 'attempt')::integer, p_token,
                    (v_rec ->> 'fence')::bigint, v_lease_end, NULL::text, NULL::bigint,
                    v_status;
                RETURN;
            END IF;
            RETURN QUERY SELECT 'running'::text, (v_rec ->> 'attempt')::integer, NULL::text,
                NULL::bigint, v_lease_end, v_rec ->> 'runner', NULL::bigint, v_status;
            RETURN;
        END IF;

        -- Expired: a takeover, unless a newer run started first or the attempts are used up.
        SELECT max(r.slot) INTO v_newest FROM @schema@.baton_runs r
            WHERE r.namespace = p_ns AND r.job = p_job;
        v_rec := @schema@.baton_end_as_died(v_rec, v_lease_end);
        SELECT count(*) INTO v_deaths FROM jsonb_array_elements(v_rec -> 'attempts') a
            WHERE a ->> 'outcome' = 'died';
        IF v_newest > p_slot OR v_deaths >= p_max_attempts THEN
            UPDATE @schema@.baton_runs r
                SET status = 'interrupted',
                    record = jsonb_set(v_rec, '{status}', '"interrupted"')
                WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot;
            RETURN QUERY SELECT 'interrupted'::text, NULL::integer, NULL::text, NULL::bigint,
                NULL::bigint, NULL::text, NULL::bigint, 'interrupted'::text;
            RETURN;
        END IF;

        v_fence := v_fence + 1;
        v_attempt := (v_rec ->> 'attempt')::integer + 1;
        v_rec := v_rec || jsonb_build_object(
            'attempt', v_attempt, 'token', p_token, 'runner', p_runner,
            'lease_end', v_now + p_lease, 'released', false, 'fence', v_fence);
        v_rec := jsonb_set(v_rec, '{attempts}', (v_rec -> 'attempts') || jsonb_build_array(
            @schema@.baton_attempt(v_attempt, p_runner, p_token, 'takeover', v_fence, v_now,
                                   p_digest)));
        UPDATE @schema@.baton_runs r
            SET lease_end = v_now + p_lease, record = v_rec
            WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot;
        UPDATE @schema@.baton_jobs j SET fence = v_fence
            WHERE j.namespace = p_ns AND j.job = p_job;
        RETURN QUERY SELECT 'won'::text, v_attempt, p_token, v_fence, v_now + p_lease,
            NULL::text, NULL::bigint, 'running'::text;
        RETURN;
    END IF;

    -- Step 2: no state.
    IF v_now - p_slot > p_late_limit THEN
        RETURN QUERY SELECT 'late'::text, NULL::integer, NULL::text, NULL::bigint,
            NULL::bigint, NULL::text, NULL::bigint, NULL::text;
        RETURN;
    END IF;
    -- In one statement: the newest slot with state, and the other running runs (locked: a
    -- new run could overlap them or interrupt them), the earliest alive, and how many earlier
    -- ones have expired.
    WITH running AS (
        SELECT r.slot, r.lease_end FROM @schema@.baton_runs r
            WHERE r.namespace = p_ns AND r.job = p_job AND r.status = 'running'
            FOR UPDATE
    )
    SELECT
        (SELECT max(k.slot) FROM @schema@.baton_runs k
            WHERE k.namespace = p_ns AND k.job = p_job),
        (SELECT min(a.slot) FROM running a WHERE a.lease_end > v_now),
        (SELECT count(*) FROM running e WHERE e.slot < p_slot AND e.lease_end <= v_now)
        INTO v_newest, v_blocking, v_expired;
    IF v_newest > p_slot THEN
        RETURN QUERY SELECT 'superseded'::text, NULL::integer, NULL::text, NULL::bigint,
            NULL::bigint, NULL::text, v_newest, NULL::text;
        RETURN;
    END IF;
    IF p_skip AND v_blocking IS NOT NULL THEN
        RETURN QUERY SELECT 'overlap'::text, NULL::integer, NULL::text, NULL::bigint,
            NULL::bigint, NULL::text, v_blocking, NULL::text;
        RETURN;
    END IF;

    -- Earlier runs whose lease ran out will not be taken over: a newer run starts.
    IF v_expired > 0 THEN
        UPDATE @schema@.baton_runs r
            SET status = 'interrupted',
                record = jsonb_set(@schema@.baton_end_as_died(r.record, r.lease_end),
                                   '{status}', '"interrupted"')
            WHERE r.namespace = p_ns AND r.job = p_job AND r.status = 'running'
              AND r.slot < p_slot AND r.lease_end <= v_now;
    END IF;

    v_fence := v_fence + 1;
    INSERT INTO @schema@.baton_runs (namespace, job, slot, status, lease_end, record)
        VALUES (p_ns, p_job, p_slot, 'running', v_now + p_lease, jsonb_build_object(
            'job', p_job, 'slot', p_slot, 'status', 'running', 'attempt', 1,
            'token', p_token, 'runner', p_runner, 'lease_end', v_now + p_lease,
            'released', false, 'fence', v_fence,
            'attempts', jsonb_build_array(@schema@.baton_attempt(
                1, p_runner, p_token,
                CASE p_kind WHEN 'takeover' THEN 'scheduled' ELSE p_kind END,
                v_fence, v_now, p_digest))));
    UPDATE @schema@.baton_jobs j SET fence = v_fence
        WHERE j.namespace = p_ns AND j.job = p_job;

    -- Step 3: trim the history to its size, but never a run a late claim could still ask
    -- about (slot newer than now - retention).
    DELETE FROM @schema@.baton_runs r
        WHERE r.namespace = p_ns AND r.job = p_job AND r.status <> 'running'
          AND r.slot < v_now - p_retention
          AND r.slot < (
              SELECT k.slot FROM @schema@.baton_runs k
              WHERE k.namespace = p_ns AND k.job = p_job AND k.status <> 'running'
              ORDER BY k.slot DESC OFFSET p_history_size - 1 LIMIT 1);

    RETURN QUERY SELECT 'won'::text, 1, p_token, v_fence, v_now + p_lease, NULL::text,
        NULL::bigint, 'running'::text;
END
$$;

-- Rules 2 and 4: only the current token, only while running and not released, may act.
-- accepted tells whether it did; attempt_no, run_status and run_released describe the run when
-- it did not (all null when the run has no state).

-- Rule 2: renews the lease to now + p_lease.
CREATE FUNCTION @schema@.baton_heartbeat(
    p_ns text, p_job text, p_slot bigint, p_token text, p_lease bigint
) RETURNS TABLE (
    accepted boolean, lease_until bigint, attempt_no integer, run_status text,
    run_released boolean
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_status text;
    v_rec jsonb;
    v_now bigint;
BEGIN
    SELECT r.status, r.record INTO v_status, v_rec FROM @schema@.baton_runs r
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot FOR UPDATE;
    IF v_rec IS NULL THEN
        RETURN QUERY SELECT false, NULL::bigint, NULL::integer, NULL::text, NULL::boolean;
        RETURN;
    END IF;
    IF v_status <> 'running' OR v_rec ->> 'token' <> p_token
       OR (v_rec ->> 'released')::boolean THEN
        RETURN QUERY SELECT false, NULL::bigint, (v_rec ->> 'attempt')::integer, v_status,
            (v_rec ->> 'released')::boolean;
        RETURN;
    END IF;
    v_now := @schema@.baton_clock();
    UPDATE @schema@.baton_runs r
        SET lease_end = v_now + p_lease,
            record = jsonb_set(r.record, '{lease_end}', to_jsonb(v_now + p_lease))
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot;
    RETURN QUERY SELECT true, v_now + p_lease, (v_rec ->> 'attempt')::integer, v_status,
        false;
END
$$;

-- Rule 4: records the end of the run (p_result: success or failed).
CREATE FUNCTION @schema@.baton_finish(
    p_ns text, p_job text, p_slot bigint, p_token text, p_result text
) RETURNS TABLE (
    accepted boolean, attempt_no integer, run_status text, run_released boolean
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_status text;
    v_rec jsonb;
    v_now bigint;
BEGIN
    SELECT r.status, r.record INTO v_status, v_rec FROM @schema@.baton_runs r
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot FOR UPDATE;
    IF v_rec IS NULL THEN
        RETURN QUERY SELECT false, NULL::integer, NULL::text, NULL::boolean;
        RETURN;
    END IF;
    IF v_status <> 'running' OR v_rec ->> 'token' <> p_token
       OR (v_rec ->> 'released')::boolean THEN
        RETURN QUERY SELECT false, (v_rec ->> 'attempt')::integer, v_status,
            (v_rec ->> 'released')::boolean;
        RETURN;
    END IF;
    v_now := @schema@.baton_clock();
    v_rec := v_rec || jsonb_build_object('status', p_result, 'lease_end', v_now);
    IF jsonb_array_length(v_rec -> 'attempts') > 0 THEN
        v_rec := jsonb_set(jsonb_set(v_rec, '{attempts,-1,outcome}', to_jsonb(p_result)),
                           '{attempts,-1,ended_at}', to_jsonb(v_now));
    END IF;
    UPDATE @schema@.baton_runs r
        SET status = p_result, lease_end = v_now, record = v_rec
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot;
    RETURN QUERY SELECT true, (v_rec ->> 'attempt')::integer, p_result, false;
END
$$;

-- Rule 4 and the hand-over: ends the lease now and records the attempt as handed over.
CREATE FUNCTION @schema@.baton_release(
    p_ns text, p_job text, p_slot bigint, p_token text
) RETURNS TABLE (
    accepted boolean, attempt_no integer, run_status text, run_released boolean
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_status text;
    v_rec jsonb;
    v_now bigint;
BEGIN
    SELECT r.status, r.record INTO v_status, v_rec FROM @schema@.baton_runs r
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot FOR UPDATE;
    IF v_rec IS NULL THEN
        RETURN QUERY SELECT false, NULL::integer, NULL::text, NULL::boolean;
        RETURN;
    END IF;
    IF v_status <> 'running' OR v_rec ->> 'token' <> p_token
       OR (v_rec ->> 'released')::boolean THEN
        RETURN QUERY SELECT false, (v_rec ->> 'attempt')::integer, v_status,
            (v_rec ->> 'released')::boolean;
        RETURN;
    END IF;
    v_now := @schema@.baton_clock();
    v_rec := v_rec || jsonb_build_object('released', true, 'lease_end', v_now);
    IF jsonb_array_length(v_rec -> 'attempts') > 0 THEN
        v_rec := jsonb_set(jsonb_set(v_rec, '{attempts,-1,outcome}', '"handed-over"'),
                           '{attempts,-1,ended_at}', to_jsonb(v_now));
    END IF;
    UPDATE @schema@.baton_runs r
        SET lease_end = v_now, record = v_rec
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot;
    RETURN QUERY SELECT true, (v_rec ->> 'attempt')::integer, v_status, true;
END
$$;
