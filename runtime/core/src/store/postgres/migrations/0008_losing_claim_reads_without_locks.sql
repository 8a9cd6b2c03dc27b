-- Version 8: a claim of a slot whose lease is alive under another token (every losing claim of
-- a due slot) is answered from one read, without a lock: it writes nothing, so its transaction
-- takes no transaction id and its commit waits for no WAL flush. The answer holds at the read's
-- snapshot: the run was running then, its lease alive by a clock read after it, and the job
-- not paused. Any other claim (the same token sent again included) is the claim of version 6,
-- which takes the job's row lock.
CREATE FUNCTION @schema@.baton_claim_reading_first(
    p_ns text, p_job text, p_slot bigint, p_kind text, p_runner text, p_token text,
    p_digest text, p_lease bigint, p_max_attempts integer, p_skip boolean,
    p_late_limit bigint, p_retention bigint, p_history_size integer
) RETURNS TABLE (
    outcome text, attempt_no integer, attempt_token text, fence_no bigint,
    lease_until bigint, held_by text, other_slot bigint, run_status text
)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT 'running'::text, (r.record ->> 'attempt')::integer, NULL::text,
            NULL::bigint, r.lease_end, r.record ->> 'runner', NULL::bigint, r.status
        FROM @schema@.baton_runs r
        WHERE r.namespace = p_ns AND r.job = p_job AND r.slot = p_slot
          AND r.status = 'running' AND r.lease_end > @schema@.baton_clock()
          AND r.record ->> 'token' <> p_token
          AND NOT EXISTS (SELECT 1 FROM @schema@.baton_paused p
                          WHERE p.namespace = p_ns AND p.job = p_job);
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM @schema@.baton_claim_unless_paused(p_ns, p_job, p_slot, p_kind,
        p_runner, p_token, p_digest, p_lease, p_max_attempts, p_skip, p_late_limit,
        p_retention, p_history_size);
END
$$;
