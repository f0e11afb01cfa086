-- Migration 0036 undone: gov.claim_outbox_v3 as migration 0016 made it (EXECUTE on every call).

CREATE OR REPLACE FUNCTION gov.claim_outbox_v3(
    p_shard_key text,
    p_worker    text,
    p_limit     integer,
    p_lease_ms  bigint,
    p_now       timestamptz DEFAULT NULL,
    p_ids       bigint[]    DEFAULT NULL
) RETURNS TABLE (
    outbox_id       bigint,
    claim_token     bigint,
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
    IF p_lease_ms IS NULL OR p_lease_ms < 1 THEN
        RAISE EXCEPTION 'lease must be positive, got % ms', p_lease_ms USING ERRCODE = '22023';
    END IF;
    RETURN QUERY EXECUTE format($q$
    WITH due AS (
        SELECT o.user_id, o.id, s.retired_at IS NOT NULL AS retired
          FROM %1$s o
          JOIN %2$s s ON s.user_id = o.user_id AND s.id = o.subscription_id
         WHERE ((o.state = 'pending' AND o.next_attempt_at <= $1)
             OR (o.state = 'sending' AND o.lease_until <= $1))
           AND ($2 IS NULL OR o.id = ANY ($2))
         ORDER BY o.next_attempt_at, o.id
         LIMIT $3
           FOR UPDATE OF o SKIP LOCKED
    ), claimed AS (
        UPDATE %1$s o
           SET state       = CASE WHEN due.retired THEN 'gone' ELSE 'sending' END,
               attempts    = o.attempts + CASE WHEN due.retired THEN 0 ELSE 1 END,
               claim_token = o.claim_token + 1,
               leased_by   = CASE WHEN due.retired THEN NULL ELSE $4 END,
               lease_until = CASE WHEN due.retired THEN NULL
                                  ELSE $1 + $5 * interval '1 millisecond' END,
               finished_at = CASE WHEN due.retired THEN $1 ELSE o.finished_at END,
               last_error  = CASE WHEN due.retired THEN 'not sent: the endpoint was retired' ELSE o.last_error END
          FROM due
         WHERE o.user_id = due.user_id AND o.id = due.id
        RETURNING o.*, due.retired
    )
    SELECT c.id, c.claim_token, c.user_id, c.message_id, m.tier, c.attempts, s.id, s.endpoint, s.p256dh, s.auth,
           mc.content, mc.collapse_key,
           greatest(0, floor(extract(epoch FROM mc.expires_at - $1)))::integer,
           t.urgency
      FROM claimed c
      JOIN %2$s s ON s.user_id = c.user_id AND s.id = c.subscription_id
      LEFT JOIN %3$s m ON m.user_id = c.user_id AND m.message_id = c.message_id
      LEFT JOIN %4$s mc ON mc.user_id = c.user_id AND mc.message_id = c.message_id
      LEFT JOIN %5$s t ON t.tier = m.tier
     WHERE NOT c.retired
     ORDER BY c.id
    $q$, gov.shard_relation('gov.outbox', p_shard_key), gov.shard_relation('gov.subscriptions', p_shard_key),
         gov.shard_relation('gov.messages', p_shard_key), gov.shard_relation('gov.message_content', p_shard_key),
         gov.shard_relation('gov.tiers', p_shard_key))
    USING v_now, p_ids, p_limit, p_worker, p_lease_ms;
END;
$$;

DROP FUNCTION gov.claim_local(timestamptz, bigint[], integer, text, bigint);
DROP FUNCTION gov.claim_statement();
