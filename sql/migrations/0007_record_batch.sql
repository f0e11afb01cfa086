-- Migration 0007, frozen: record a whole batch of delivery attempts in one call.
-- Never edit; add a new migration.

-- One call and one commit for a runner's batch instead of one per message: a durable
-- commit is the largest single cost of a write (PERFORMANCE.md). Each element is
-- {"outbox_id", "origin", "outcome", "status", "retry_after_ms", "error"}; each is
-- recorded exactly as gov.record_attempt_v1 would, in outbox id order (the order
-- claims lock rows in, so two runners never wait on each other in a cycle).
CREATE FUNCTION gov.record_attempts_v1(
    p_worker         text,
    p_attempts       jsonb,
    p_max_attempts   integer DEFAULT 8,
    p_backoff_ms     bigint  DEFAULT 1000,
    p_backoff_cap_ms bigint  DEFAULT 300000,
    p_now            timestamptz DEFAULT NULL
) RETURNS TABLE (outbox_id bigint, state text)
LANGUAGE plpgsql AS $$
DECLARE
    r_a record;
BEGIN
    IF jsonb_typeof(p_attempts) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'attempts must be a JSON array' USING ERRCODE = '22023';
    END IF;
    FOR r_a IN
        SELECT (e ->> 'outbox_id')::bigint AS id, e ->> 'origin' AS origin, e ->> 'outcome' AS outcome,
               (e ->> 'status')::integer AS status, (e ->> 'retry_after_ms')::bigint AS retry_after_ms,
               e ->> 'error' AS error
          FROM jsonb_array_elements(p_attempts) e
         ORDER BY 1
    LOOP
        RETURN QUERY
        SELECT r_a.id, gov.record_attempt_v1(r_a.id, p_worker, r_a.origin, r_a.outcome, r_a.status,
                                             r_a.retry_after_ms, r_a.error, p_max_attempts, p_backoff_ms,
                                             p_backoff_cap_ms, p_now);
    END LOOP;
END;
$$;
