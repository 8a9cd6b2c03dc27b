-- Job state: a small key-value store per job, every write fenced by the writer's lease.
--
-- A key's row holds its value and the attempt that wrote it last (slot, attempt, fence) with
-- the store's clock at the write. baton_state_write is the one fenced write (set, delete,
-- increment, compare-and-swap): it locks the job's row (as a claim does, so no claim can take
-- the run over meanwhile and the key count is exact), then the run's row, reads the clock, and
-- writes only if the token is the current attempt of a running run whose lease is not released
-- and still alive.

CREATE TABLE @schema@.baton_state (
    namespace text NOT NULL,
    job text NOT NULL,
    key text NOT NULL,
    value bytea NOT NULL,
    slot bigint NOT NULL,
    attempt integer NOT NULL,
    fence bigint NOT NULL,
    written_at bigint NOT NULL,
    PRIMARY KEY (namespace, job, key)
);

-- outcome is one of set, deleted, incremented, swapped (flag: whether the key existed, or
-- whether it swapped; sum: an increment's result), fenced (attempt_no, run_status and
-- run_released describe the run, all null when it has no state), too-many-keys,
-- not-an-integer, overflow.
CREATE FUNCTION @schema@.baton_state_write(
    p_ns text, p_job text, p_slot bigint, p_token text, p_op text, p_key text,
    p_value bytea, p_by bigint, p_expect boolean, p_expected bytea, p_max_keys integer
) RETURNS TABLE (
    outcome text, flag boolean, sum bigint, attempt_no integer, run_status text,
    run_released boolean
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_status text;
    v_lease_end bigint;
    v_rec jsonb;
    v_now bigint;
    v_current bytea;
    v_found boolean;
    v_keys bigint;
    v_new bytea;
    v_text text;
    v_sum numeric;
BEGIN
    -- The job's row first, as a claim locks it: claims and writes of the job serialize.
    PERFORM 1 FROM @schema@.baton_jobs j
        WHERE j.namespace = p_ns AND j.job = p_job FOR UPDATE;
    SELECT r.status, r.lease_end, r.record INTO v_status, v_lease_end, v_rec
        FROM @schema@.baton_runs r
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot FOR SHARE;
    v_now := @schema@.baton_clock();
    IF v_rec IS NULL THEN
        RETURN QUERY SELECT 'fenced'::text, NULL::boolean, NULL::bigint, NULL::integer,
            NULL::text, NULL::boolean;
        RETURN;
    END IF;
    IF v_status <> 'running' OR v_rec ->> 'token' <> p_token
       OR (v_rec ->> 'released')::boolean OR v_lease_end <= v_now THEN
        RETURN QUERY SELECT 'fenced'::text, NULL::boolean, NULL::bigint,
            (v_rec ->> 'attempt')::integer, v_status, (v_rec ->> 'released')::boolean;
        RETURN;
    END IF;

    SELECT s.value INTO v_current FROM @schema@.baton_state s
        WHERE s.namespace = p_ns AND s.job = p_job AND s.key = p_key;
    v_found := FOUND;

    IF p_op = 'delete' THEN
        DELETE FROM @schema@.baton_state s
            WHERE s.namespace = p_ns AND s.job = p_job AND s.key = p_key;
        RETURN QUERY SELECT 'deleted'::text, v_found, NULL::bigint, NULL::integer, NULL::text,
            NULL::boolean;
        RETURN;
    ELSIF p_op = 'set' THEN
        v_new := p_value;
    ELSIF p_op = 'increment' THEN
        IF v_found THEN
            -- An integer is the decimal text of a signed 64-bit number: no '+', no leading
            -- zeros, no spaces (what baton::state::parse_integer accepts).
            BEGIN
                v_text := convert_from(v_current, 'UTF8');
            EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
                v_text := NULL;
            END;
            IF v_text IS NULL OR v_text !~ '^(0|-?[1-9][0-9]{0,18})$' THEN
                v_sum := NULL;
            ELSE
                v_sum := v_text::numeric;
            END IF;
            IF v_sum IS NULL
               OR v_sum NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
                RETURN QUERY SELECT 'not-an-integer'::text, NULL::boolean, NULL::bigint,
                    NULL::integer, NULL::text, NULL::boolean;
                RETURN;
            END IF;
            v_sum := v_sum + p_by;
        ELSE
            v_sum := p_by;
        END IF;
        IF v_sum NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
            RETURN QUERY SELECT 'overflow'::text, NULL::boolean, NULL::bigint, NULL::integer,
                NULL::text, NULL::boolean;
            RETURN;
        END IF;
        v_new := convert_to(v_sum::bigint::text, 'UTF8');
    ELSIF p_op = 'compare-and-swap' THEN
        IF (p_expect AND (NOT v_found OR v_current <> p_expected))
           OR (NOT p_expect AND v_found) THEN
            RETURN QUERY SELECT 'swapped'::text, false, NULL::bigint, NULL::integer, NULL::text,
                NULL::boolean;
            RETURN;
        END IF;
        v_new := p_value;
    ELSE
        RAISE EXCEPTION 'unknown state operation %', p_op;
    END IF;

    IF NOT v_found THEN
        SELECT count(*) INTO v_keys FROM @schema@.baton_state s
            WHERE s.namespace = p_ns AND s.job = p_job;
        IF v_keys >= p_max_keys THEN
            RETURN QUERY SELECT 'too-many-keys'::text, NULL::boolean, NULL::bigint,
                NULL::integer, NULL::text, NULL::boolean;
            RETURN;
        END IF;
    END IF;
    INSERT INTO @schema@.baton_state AS s
        (namespace, job, key, value, slot, attempt, fence, written_at)
        VALUES (p_ns, p_job, p_key, v_new, p_slot, (v_rec ->> 'attempt')::integer,
                (v_rec ->> 'fence')::bigint, v_now)
        ON CONFLICT (namespace, job, key) DO UPDATE SET
            value = excluded.value, slot = excluded.slot, attempt = excluded.attempt,
            fence = excluded.fence, written_at = excluded.written_at;
    RETURN QUERY SELECT
        CASE p_op WHEN 'set' THEN 'set' WHEN 'increment' THEN 'incremented'
                  ELSE 'swapped' END::text,
        true, v_sum::bigint, NULL::integer, NULL::text, NULL::boolean;
END
$$;
