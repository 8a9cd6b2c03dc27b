-- Version 4: fences never go backwards, even when the store loses writes.
--
-- A new fence is max(the job's previous fence + 1, the store's clock in microseconds), rather
-- than the previous fence + 1. A standby promoted after its primary died without sending it
-- the last commits (asynchronous replication) has lost the fences those commits handed out;
-- with the clock as their floor it still hands out larger ones, as long as the servers' clocks
-- agree to within the time the failover took (see baton::lease::next_fence). The clock in
-- milliseconds is now derived from the same reading, so a claim's lease times and its fence
-- come from one instant. The claim function is version 2's otherwise.

-- The store's clock, microseconds since the Unix epoch. Whole seconds and microseconds are read
-- apart, so the value is exact whether extract() answers numeric (PostgreSQL 14 and later) or
-- double precision (13).
CREATE FUNCTION @schema@.baton_clock_us_at(ts timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT extract(epoch FROM date_trunc('second', ts))::bigint * 1000000
        + extract(microseconds FROM ts)::bigint % 1000000
$$;

CREATE FUNCTION @schema@.baton_clock_us() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT @schema@.baton_clock_us_at(clock_timestamp())
$$;

-- The store's clock, ms since the Unix epoch: the microseconds, rounded down.
CREATE OR REPLACE FUNCTION @schema@.baton_clock() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT @schema@.baton_clock_us() / 1000
$$;

-- The claim of the store contract, steps 1 to 3 (see runtime/src/store/model.rs).
--
-- outcome is one of won, running, overlap, late, superseded, finished, interrupted; the other
-- columns carry what that outcome says (other_slot: the blocking slot of an overlap, or the
-- newer slot of a superseded claim).
CREATE OR REPLACE FUNCTION @schema@.baton_claim(
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
    v_now_us bigint;
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

    -- The claimed run and the job's other running runs, locked before the clock is read: a
    -- heartbeat, finish or release holds its run's row (not the job's), and a claim that waited
    -- for one must decide, and record its start, at a time after that operation's.
    PERFORM 1 FROM @schema@.baton_runs r
        WHERE r.namespace = p_ns AND r.job = p_job
          AND (r.slot = p_slot OR r.status = 'running')
        FOR UPDATE;

    -- The store's clock, read once the job is ours: the rows locked below show their latest
    -- versions, so a lease a heartbeat renewed meanwhile is seen alive.
    v_now_us := @schema@.baton_clock_us();
    v_now := v_now_us / 1000;

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

        v_fence := greatest(v_fence + 1, v_now_us);
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

    v_fence := greatest(v_fence + 1, v_now_us);
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
