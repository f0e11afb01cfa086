-- Migration 0043, undone.

-- Record one attempt's outcome and move the outbox row on:
--   accepted → delivered; gone → retire the subscription (matching id AND endpoint, so
--   a just-refreshed endpoint survives a late 410) and end every other row still to do
--   for it 'gone', unsent, whoever holds it; throttled → retry after Retry-After;
--   transient/unauthorized → capped exponential backoff with jitter, failed after
--   p_max_attempts; rejected → failed; expired → expired; released → handed back unsent
--   (the runner had no time left in its lease to attempt it: pending again, the claim's
--   attempt not counted, nothing logged). Nothing is retried past the message's deadline.
-- Fenced (invariant 12): only the claim that still holds the row records. A record
-- whose claim token is no longer the row's (its lease ran out and another runner claimed
-- the row), or for a row no longer being sent, changes nothing, logs nothing, and returns
-- 'stale' ('gone' when the row was ended by its endpoint's 404/410).
CREATE OR REPLACE FUNCTION gov.record_attempt_v3(
    p_user_id        text,
    p_outbox_id      bigint,
    p_claim_token    bigint,
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
    SELECT * INTO v_row FROM gov.outbox o WHERE o.user_id = p_user_id AND o.id = p_outbox_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    IF v_row.state <> 'sending' OR v_row.claim_token IS DISTINCT FROM p_claim_token THEN
        RETURN CASE WHEN v_row.state = 'gone' THEN 'gone' ELSE 'stale' END;
    END IF;

    IF p_outcome = 'released' THEN
        UPDATE gov.outbox
           SET state = 'pending', attempts = greatest(attempts - 1, 0), lease_until = NULL, leased_by = NULL
         WHERE user_id = p_user_id AND id = p_outbox_id;
        RETURN 'released';
    END IF;

    INSERT INTO gov.delivery_attempts (outbox_id, user_id, message_id, subscription_id, origin, worker,
                                       outcome, status, retry_after_ms, error, attempted_at)
    VALUES (p_outbox_id, v_row.user_id, v_row.message_id, v_row.subscription_id, p_origin, p_worker,
            p_outcome, p_status, p_retry_after_ms, left(p_error, 2000), v_now);

    SELECT mc.expires_at INTO v_expires
      FROM gov.message_content mc WHERE mc.user_id = v_row.user_id AND mc.message_id = v_row.message_id;

    IF p_outcome = 'accepted' THEN
        v_state := 'delivered';
    ELSIF p_outcome = 'gone' THEN
        v_state := 'gone';
        -- by id: a refreshed endpoint is a new row, so a late 410 cannot retire it
        UPDATE gov.subscriptions s
           SET retired_at = v_now, retired_reason = 'push service answered ' || coalesce(p_status::text, 'gone')
         WHERE s.user_id = p_user_id AND s.id = v_row.subscription_id AND s.retired_at IS NULL;
        -- the endpoint's other rows still to do end now, unsent, whoever holds them (their
        -- holders' records are then fenced off); a row whose holder is recording it right
        -- now is skipped, not waited for: its next claim ends it, as the endpoint is retired
        UPDATE gov.outbox o
           SET state = 'gone', finished_at = v_now, lease_until = NULL, leased_by = NULL,
               last_status = p_status,
               last_error = 'not sent: the endpoint answered ' || coalesce(p_status::text, 'gone')
                            || ' to message ' || v_row.message_id
         WHERE o.user_id = p_user_id
           AND o.id IN (SELECT x.id FROM gov.outbox x
                         WHERE x.user_id = p_user_id AND x.subscription_id = v_row.subscription_id
                           AND x.id <> p_outbox_id
                           AND x.state IN ('pending', 'sending')
                           FOR UPDATE SKIP LOCKED);
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
     WHERE user_id = p_user_id AND id = p_outbox_id;
    RETURN v_state;
END;
$$;
