-- Migration 0017, undone: every attempt of a batch recorded one at a time again.

CREATE OR REPLACE FUNCTION gov.record_attempts_v3(
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
        SELECT e ->> 'user_id' AS user_id, (e ->> 'outbox_id')::bigint AS id, (e ->> 'claim_token')::bigint AS claim_token,
               e ->> 'origin' AS origin, e ->> 'outcome' AS outcome,
               (e ->> 'status')::integer AS status, (e ->> 'retry_after_ms')::bigint AS retry_after_ms,
               e ->> 'error' AS error
          FROM jsonb_array_elements(p_attempts) e
         ORDER BY 2
    LOOP
        RETURN QUERY
        SELECT r_a.id, gov.record_attempt_v3(r_a.user_id, r_a.id, r_a.claim_token, p_worker, r_a.origin, r_a.outcome,
                                             r_a.status, r_a.retry_after_ms, r_a.error, p_max_attempts,
                                             p_backoff_ms, p_backoff_cap_ms, p_now);
    END LOOP;
END;
$$;
