-- Version 7: a heartbeat that reaches the store after the lease ran out is refused (rule 2), by
-- the store's clock read once the run's row is locked, even when no backup has taken the run
-- over yet: an expired lease is up for the next attempt (spec, "Claims and leases") and is never
-- brought back to life. The caller is told the run's state, as for a refused token.

CREATE OR REPLACE FUNCTION @schema@.baton_heartbeat(
    p_ns text, p_job text, p_slot bigint, p_token text, p_lease bigint
) RETURNS TABLE (
    accepted boolean, lease_until bigint, attempt_no integer, run_status text,
    run_released boolean
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_status text;
    v_rec jsonb;
    v_lease_end bigint;
    v_now bigint;
BEGIN
    SELECT r.status, r.record, r.lease_end INTO v_status, v_rec, v_lease_end
        FROM @schema@.baton_runs r
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot FOR UPDATE;
    IF v_rec IS NULL THEN
        RETURN QUERY SELECT false, NULL::bigint, NULL::integer, NULL::text, NULL::boolean;
        RETURN;
    END IF;
    v_now := @schema@.baton_clock();
    IF v_status <> 'running' OR v_rec ->> 'token' <> p_token
       OR (v_rec ->> 'released')::boolean OR v_lease_end <= v_now THEN
        RETURN QUERY SELECT false, NULL::bigint, (v_rec ->> 'attempt')::integer, v_status,
            (v_rec ->> 'released')::boolean;
        RETURN;
    END IF;
    UPDATE @schema@.baton_runs r
        SET lease_end = v_now + p_lease,
            record = jsonb_set(r.record, '{lease_end}', to_jsonb(v_now + p_lease))
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot;
    RETURN QUERY SELECT true, v_now + p_lease, (v_rec ->> 'attempt')::integer, v_status,
        false;
END
$$;
