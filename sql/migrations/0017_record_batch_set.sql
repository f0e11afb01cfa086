-- Migration 0017: a runner's batch of accepted attempts recorded in one statement on one
-- server (sql/schema/40_delivery.sql): the same results, row by row, as before; every
-- other outcome, and every outcome on a Citus cluster, still goes through
-- gov.record_attempt_v3. Signature unchanged, so runners of 0016 keep working.

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
    v_now       timestamptz := coalesce(p_now, clock_timestamp());
    v_delivered bigint[] := '{}';
    r_a         record;
BEGIN
    IF jsonb_typeof(p_attempts) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'attempts must be a JSON array' USING ERRCODE = '22023';
    END IF;
    IF NOT gov.distributed() THEN
        WITH a AS (
            SELECT DISTINCT ON (e.outbox_id) e.*
              FROM jsonb_to_recordset(p_attempts)
                   AS e(user_id text, outbox_id bigint, claim_token bigint, origin text, outcome text,
                        status integer, error text)
             WHERE e.outcome = 'accepted'
             ORDER BY e.outbox_id
        ), held AS (
            SELECT o.user_id, o.id, o.message_id, o.subscription_id, a.origin, a.status, a.error
              FROM gov.outbox o
              JOIN a ON o.user_id = a.user_id AND o.id = a.outbox_id
             WHERE o.state = 'sending' AND o.claim_token = a.claim_token
             ORDER BY o.id
               FOR UPDATE OF o
        ), logged AS (
            INSERT INTO gov.delivery_attempts (outbox_id, user_id, message_id, subscription_id, origin, worker,
                                               outcome, status, error, attempted_at)
            SELECT h.id, h.user_id, h.message_id, h.subscription_id, h.origin, p_worker,
                   'accepted', h.status, left(h.error, 2000), v_now
              FROM held h
        ), marked AS (
            UPDATE gov.outbox o
               SET state = 'delivered', lease_until = NULL, leased_by = NULL,
                   last_status = h.status, last_error = left(h.error, 2000), finished_at = v_now
              FROM held h
             WHERE o.user_id = h.user_id AND o.id = h.id
            RETURNING o.id
        )
        SELECT coalesce(array_agg(m.id), '{}') INTO v_delivered FROM marked m;
    END IF;
    FOR r_a IN
        SELECT e ->> 'user_id' AS user_id, (e ->> 'outbox_id')::bigint AS id, (e ->> 'claim_token')::bigint AS claim_token,
               e ->> 'origin' AS origin, e ->> 'outcome' AS outcome,
               (e ->> 'status')::integer AS status, (e ->> 'retry_after_ms')::bigint AS retry_after_ms,
               e ->> 'error' AS error
          FROM jsonb_array_elements(p_attempts) e
         ORDER BY 2
    LOOP
        IF r_a.id = ANY (v_delivered) THEN
            -- recorded above; a repeat of the same row in the batch then finds it ended
            v_delivered := array_remove(v_delivered, r_a.id);
            outbox_id := r_a.id;
            state := 'delivered';
            RETURN NEXT;
        ELSE
            RETURN QUERY
            SELECT r_a.id, gov.record_attempt_v3(r_a.user_id, r_a.id, r_a.claim_token, p_worker, r_a.origin,
                                                 r_a.outcome, r_a.status, r_a.retry_after_ms, r_a.error,
                                                 p_max_attempts, p_backoff_ms, p_backoff_cap_ms, p_now);
        END IF;
    END LOOP;
END;
$$;
