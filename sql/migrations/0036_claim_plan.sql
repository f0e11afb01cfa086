-- Migration 0036 (issue 31, the cron path; issue 28, statements planned per call): on one
-- server gov.claim_outbox_v3 runs its statement from a function PL/pgSQL plans once per
-- session (gov.claim_local), made from the one text both forms share
-- (gov.claim_statement); on a Citus cluster it runs that text over the shard's tables as
-- before. As in sql/schema/ at this revision.

-- The claim's one statement, for both forms of gov.claim_outbox_v3 below: over the tables
-- %1$s to %5$s (outbox, subscriptions, messages, message_content, tiers) with the
-- parameters $1 the claim's moment, $2 the rows it is restricted to (NULL: any), $3 the
-- limit, $4 the worker, $5 the lease in milliseconds.
CREATE FUNCTION gov.claim_statement() RETURNS text
LANGUAGE sql IMMUTABLE AS $f$ SELECT $q$
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
    $q$::text $f$;

-- The claim on one server: that statement over the tables themselves, in a function of
-- its own, so PL/pgSQL plans it once per session. EXECUTE, which a shard's table names
-- need on a Citus cluster, plans it again on every call, and planning was most of a
-- claim's cost: 2.2 ms against 0.16 ms for a claim of three rows (docs/performance.md).
-- Made from gov.claim_statement(), so the two forms cannot drift apart.
DO $do$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION gov.claim_local(timestamptz, bigint[], integer, text, bigint)
        RETURNS TABLE (
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
        LANGUAGE plpgsql AS %L$f$,
        E'#variable_conflict use_column\nBEGIN\n    RETURN QUERY ' || format(gov.claim_statement(),
            'gov.outbox', 'gov.subscriptions', 'gov.messages', 'gov.message_content', 'gov.tiers') || E';\nEND;\n');
END;
$do$;

-- Claim due outbox rows of one shard for one worker: pending rows whose time has come,
-- and rows whose lease ran out (their worker died or overran). SKIP LOCKED lets runners
-- claim side by side without waiting on each other; the lease is committed, so no
-- transaction stays open across the HTTP call. Every claim increments the row's
-- claim_token, the fencing token gov.record_attempt_v3 requires: a runner whose lease
-- ran out and whose row was claimed again can no longer record anything for it. A row
-- whose endpoint was retired meanwhile (a 404/410 for another message) ends 'gone' here,
-- unsent and not returned. Content, message and tier are joined loosely, so a row whose
-- content is missing is returned (and failed by the runner) rather than claimed and lost.
-- p_shard_key: the shard to claim from (NULL on one server; 70_scale_out.sql).
-- p_ids restricts the claim to given rows (gov.send's immediate attempt).
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
    IF NOT gov.distributed() THEN
        RETURN QUERY SELECT * FROM gov.claim_local(v_now, p_ids, p_limit, p_worker, p_lease_ms);
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(gov.claim_statement(),
        gov.shard_relation('gov.outbox', p_shard_key), gov.shard_relation('gov.subscriptions', p_shard_key),
        gov.shard_relation('gov.messages', p_shard_key), gov.shard_relation('gov.message_content', p_shard_key),
        gov.shard_relation('gov.tiers', p_shard_key))
    USING v_now, p_ids, p_limit, p_worker, p_lease_ms;
END;
$$;
