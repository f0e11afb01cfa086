-- Migration 0010 down: the unfenced runner functions of 0002 and 0007 again.

DROP FUNCTION gov.record_attempts_v2(text, jsonb, integer, bigint, bigint, timestamptz);
DROP FUNCTION gov.record_attempt_v2(bigint, bigint, text, text, text, integer, bigint, text, integer, bigint,
                                    bigint, timestamptz);
DROP FUNCTION gov.claim_outbox_v2(text, integer, bigint, timestamptz, bigint[]);

DROP INDEX gov.outbox_subscription_todo;
ALTER TABLE gov.outbox DROP COLUMN claim_token;

-- Claim due outbox rows for one worker: pending rows whose time has come, and rows
-- whose lease ran out (their worker died). SKIP LOCKED lets runners claim side by side
-- without waiting on each other; the lease is committed, so no transaction stays open
-- across the HTTP call. Rows past their message's deadline are expired here, not sent.
-- p_ids restricts the claim to given rows (gov.send's immediate attempt).
CREATE FUNCTION gov.claim_outbox_v1(
    p_worker   text,
    p_limit    integer,
    p_lease_ms bigint,
    p_now      timestamptz DEFAULT NULL,
    p_ids      bigint[]    DEFAULT NULL
) RETURNS TABLE (
    outbox_id       bigint,
    user_id         text,
    message_id      text,
    tier            text,
    attempts        integer,
    subscription_id bigint,
    endpoint        text,
    p256dh          text,
    auth            text,
    content         jsonb,
    collapse_key    text,
    ttl_s           integer,
    urgency         text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'claim limit must be positive, got %', p_limit USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH due AS (
        SELECT o.id
          FROM gov.outbox o
         WHERE ((o.state = 'pending' AND o.next_attempt_at <= v_now)
             OR (o.state = 'sending' AND o.lease_until <= v_now))
           AND (p_ids IS NULL OR o.id = ANY (p_ids))
         ORDER BY o.next_attempt_at, o.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE gov.outbox o
           SET state = 'sending', attempts = o.attempts + 1, leased_by = p_worker,
               lease_until = v_now + p_lease_ms * interval '1 millisecond'
          FROM due
         WHERE o.id = due.id
        RETURNING o.*
    )
    SELECT c.id, c.user_id, c.message_id, m.tier, c.attempts, s.id, s.endpoint, s.p256dh, s.auth,
           mc.content, mc.collapse_key,
           greatest(0, floor(extract(epoch FROM mc.expires_at - v_now)))::integer,
           t.urgency
      FROM claimed c
      JOIN gov.subscriptions s ON s.id = c.subscription_id
      JOIN gov.messages m ON m.user_id = c.user_id AND m.message_id = c.message_id
      JOIN gov.message_content mc ON mc.user_id = c.user_id AND mc.message_id = c.message_id
      LEFT JOIN gov.tiers t ON t.tier = m.tier
     ORDER BY c.id;
END;
$$;

-- Record one attempt's outcome and move the outbox row on:
--   accepted → delivered; gone → retire the subscription (matching id AND endpoint, so
--   a just-refreshed endpoint survives a late 410) and stop every row still to do for
--   it; throttled → retry after Retry-After; transient/unauthorized → capped
--   exponential backoff with jitter, failed after p_max_attempts; rejected → failed;
--   expired → expired. Nothing is retried past the message's deadline.
-- A worker whose lease was taken over still has its attempt logged, but the row's
-- state belongs to the lease holder.
CREATE FUNCTION gov.record_attempt_v1(
    p_outbox_id      bigint,
    p_worker         text,
    p_origin         text,
    p_outcome        text,
    p_status         integer,
    p_retry_after_ms bigint,
    p_error          text,
    p_max_attempts   integer DEFAULT 8,
    p_backoff_ms     bigint  DEFAULT 1000,
    p_backoff_cap_ms bigint  DEFAULT 300000,
    p_now            timestamptz DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_row     gov.outbox%ROWTYPE;
    v_expires timestamptz;
    v_next    timestamptz;
    v_state   text;
BEGIN
    SELECT * INTO v_row FROM gov.outbox o WHERE o.id = p_outbox_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no outbox row %', p_outbox_id USING ERRCODE = '22023';
    END IF;
    INSERT INTO gov.delivery_attempts (outbox_id, user_id, message_id, subscription_id, origin, worker,
                                       outcome, status, retry_after_ms, error, attempted_at)
    VALUES (p_outbox_id, v_row.user_id, v_row.message_id, v_row.subscription_id, p_origin, p_worker,
            p_outcome, p_status, p_retry_after_ms, left(p_error, 2000), v_now);

    IF v_row.state <> 'sending' OR v_row.leased_by IS DISTINCT FROM p_worker THEN
        IF p_outcome = 'accepted' AND v_row.state IN ('pending', 'sending') THEN
            -- a late success from a worker whose lease lapsed still counts as delivered
            UPDATE gov.outbox SET state = 'delivered', lease_until = NULL, leased_by = NULL,
                                  last_status = p_status, finished_at = v_now
             WHERE id = p_outbox_id;
            RETURN 'delivered';
        END IF;
        RETURN v_row.state;
    END IF;

    SELECT mc.expires_at INTO v_expires
      FROM gov.message_content mc WHERE mc.user_id = v_row.user_id AND mc.message_id = v_row.message_id;

    IF p_outcome = 'accepted' THEN
        v_state := 'delivered';
    ELSIF p_outcome = 'gone' THEN
        v_state := 'gone';
        -- by id: a refreshed endpoint is a new row, so a late 410 cannot retire it
        UPDATE gov.subscriptions s
           SET retired_at = v_now, retired_reason = 'push service answered ' || coalesce(p_status::text, 'gone')
         WHERE s.id = v_row.subscription_id AND s.retired_at IS NULL;
        UPDATE gov.outbox o
           SET state = 'gone', finished_at = v_now, lease_until = NULL, leased_by = NULL
         WHERE o.subscription_id = v_row.subscription_id AND o.id <> p_outbox_id
           AND o.state = 'pending';
    ELSIF p_outcome IN ('rejected', 'expired') THEN
        v_state := CASE p_outcome WHEN 'rejected' THEN 'failed' ELSE 'expired' END;
    ELSE
        IF p_outcome = 'throttled' AND p_retry_after_ms IS NOT NULL THEN
            v_next := v_now + p_retry_after_ms * interval '1 millisecond';
        ELSE
            v_next := v_now + (least(p_backoff_cap_ms, p_backoff_ms * 2 ^ greatest(v_row.attempts - 1, 0))
                               * (0.5 + random() * 0.5)) * interval '1 millisecond';
        END IF;
        IF v_expires IS NOT NULL AND v_next >= v_expires THEN
            v_state := 'expired';
        ELSIF v_row.attempts >= p_max_attempts THEN
            v_state := 'failed';
        ELSE
            v_state := 'pending';
        END IF;
    END IF;

    UPDATE gov.outbox
       SET state = v_state, lease_until = NULL, leased_by = NULL,
           next_attempt_at = coalesce(v_next, next_attempt_at),
           last_status = p_status, last_error = left(p_error, 2000),
           finished_at = CASE WHEN v_state = 'pending' THEN NULL ELSE v_now END
     WHERE id = p_outbox_id;
    RETURN v_state;
END;
$$;

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
