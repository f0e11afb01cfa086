-- gov: delivery. A user's push subscriptions, and the runner's side of the outbox:
-- claiming due rows under a fenced lease (gov.claim_outbox_v3) and recording each
-- attempt's outcome (gov.record_attempt_v3; a runner's batch: gov.record_attempts_v3).

-- ---------------------------------------------------------------- subscriptions

-- Store a browser's subscription for a user (validated in Python before it gets here).
-- The same endpoint again for the same user updates its keys. An endpoint is one
-- browser's: subscribed now by another user (a shared browser that changed accounts), it
-- stops being the earlier user's, whose row is retired, not handed over, so nothing
-- queued for them is ever sent to the new user's browser. Two users subscribing one
-- endpoint at once take turns on a lock of the endpoint (each would otherwise miss the
-- other's uncommitted row, and both keep it); on Citus this function runs on the
-- coordinator, so the lock is cluster-wide.
CREATE FUNCTION gov.subscribe_v2(p_user_id text, p_endpoint text, p_p256dh text, p_auth text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id  bigint;
    v_now timestamptz;
BEGIN
    -- seed 1: the users' decision locks hash with seed 0
    PERFORM pg_advisory_xact_lock(hashtextextended(p_endpoint, 1));
    v_now := clock_timestamp();  -- a variable: Citus refuses volatile calls in an UPDATE
    UPDATE gov.subscriptions s
       SET retired_at = v_now, retired_reason = 'subscribed by another user'
     WHERE s.endpoint = p_endpoint AND s.user_id <> p_user_id AND s.retired_at IS NULL;
    INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth)
    VALUES (p_user_id, p_endpoint, p_p256dh, p_auth)
    ON CONFLICT (user_id, endpoint) WHERE retired_at IS NULL
    DO UPDATE SET p256dh = excluded.p256dh, auth = excluded.auth
    RETURNING id INTO v_id;
    RETURN v_id;
END;
$$;

-- ---------------------------------------------------------------- the outbox

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
-- Two statements, the claim of given rows (gov.send's own attempt, a runner handed rows)
-- and of any due rows, each with a generic plan (made again after an ANALYZE of its
-- tables): with one statement's `($2 IS NULL OR o.id = ANY ($2))`, the plan cache kept
-- choosing a plan for the call's own values, and the default `gov simulate` planned the
-- claim on 3,156 of its 3,786 calls, 2.5 ms each (docs/performance.md, stop 41). Made
-- from gov.claim_statement(), so the forms cannot drift apart.
DO $do$
DECLARE
    v_any   text := format(gov.claim_statement(),
                           'gov.outbox', 'gov.subscriptions', 'gov.messages', 'gov.message_content', 'gov.tiers');
    v_given text;
BEGIN
    v_given := replace(v_any, '($2 IS NULL OR o.id = ANY ($2))', 'o.id = ANY ($2)');
    v_any := replace(v_any, '($2 IS NULL OR o.id = ANY ($2))', 'true');
    IF v_given = v_any OR strpos(v_given, 'o.id = ANY ($2)') = 0 THEN
        RAISE EXCEPTION 'gov.claim_statement() no longer has the rows filter this migration splits on';
    END IF;
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
        LANGUAGE plpgsql
        SET plan_cache_mode = force_generic_plan
        AS %L$f$,
        E'#variable_conflict use_column\nBEGIN\n    IF $2 IS NULL THEN\n        RETURN QUERY ' || v_any
        || E';\n    ELSE\n        RETURN QUERY ' || v_given || E';\n    END IF;\nEND;\n');
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
CREATE FUNCTION gov.claim_outbox_v3(
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
    -- a lease is what a dead runner's rows wait for: at most a day (gov.max_lease_ms())
    IF p_lease_ms IS NULL OR p_lease_ms < 1 OR p_lease_ms > gov.max_lease_ms() THEN
        RAISE EXCEPTION 'lease must be positive and at most a day, got % ms', p_lease_ms USING ERRCODE = '22023';
    END IF;
    -- a claim far ahead of the clock would take over rows other runners hold and strand
    -- them in 'sending' until then (gov.moment_ahead_limit(), as for decisions)
    IF NOT isfinite(v_now) OR v_now > clock_timestamp() + gov.moment_ahead_limit() THEN
        RAISE EXCEPTION 'a claim''s moment must be finite and at most % ahead of the database clock, not %',
            gov.moment_ahead_limit(), v_now USING ERRCODE = '22023';
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

-- Record one attempt's outcome and move the outbox row on:
--   accepted → delivered; gone → retire the subscription (matching id AND endpoint, so
--   a just-refreshed endpoint survives a late 410) and end every other row still to do
--   for it 'gone', unsent, whoever holds it; throttled → retry after Retry-After;
--   transient/unauthorized → capped exponential backoff with jitter, failed after
--   p_max_attempts; rejected → failed; expired → expired; released → handed back unsent
--   (the runner had no time left in its lease to attempt it, or the endpoint had just
--   failed to answer the row before it: pending again, the claim's attempt not counted,
--   nothing logged; with p_retry_after_ms not due before then, with p_error that said).
--   Nothing is retried past the message's deadline.
-- Fenced (invariant 12): only the claim that still holds the row records. A record
-- whose claim token is no longer the row's (its lease ran out and another runner claimed
-- the row), or for a row no longer being sent, changes nothing, logs nothing, and returns
-- 'stale' ('gone' when the row was ended by its endpoint's 404/410).
CREATE FUNCTION gov.record_attempt_v3(
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
           SET state = 'pending', attempts = greatest(attempts - 1, 0), lease_until = NULL, leased_by = NULL,
               next_attempt_at = CASE WHEN p_retry_after_ms IS NULL THEN next_attempt_at
                                      ELSE greatest(next_attempt_at, v_now + p_retry_after_ms * interval '1 millisecond')
                                 END,
               last_error = coalesce(left(p_error, 2000), last_error)
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

-- ---------------------------------------------------------------- delivery outcomes in batches

-- One call and one commit for a runner's batch instead of one per message: a durable
-- commit is the largest single cost of a write (PERFORMANCE.md). Each element is
-- {"user_id", "outbox_id", "claim_token", "origin", "outcome", "status", "retry_after_ms",
-- "error"}; each is recorded exactly as gov.record_attempt_v3 would (fenced by its claim token:
-- 'stale' for a row this runner no longer holds), in outbox id order (the order claims
-- lock rows in, so two runners never wait on each other in a cycle), one result row per
-- element, in that order.
-- On one server the common case, an accepted attempt whose claim still holds its row, is
-- recorded for the whole batch in one statement (lock in id order, log, mark delivered)
-- instead of four statements per row: the database's share of a delivery is what limits
-- a runner on a small machine (docs/performance.md). Every other element, and every
-- element on a Citus cluster, goes through gov.record_attempt_v3 one at a time.
CREATE FUNCTION gov.record_attempts_v3(
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

-- ---------------------------------------------------------------- released names, kept (invariant 16)

-- gov.subscribe_v1 (migration 0002), replaced by gov.subscribe_v2 with the same signature
-- in migration 0016 (an endpoint subscribed by another user retires the earlier user's
-- row instead of moving it). Like subscribe_v2, a plain function on every node of a
-- cluster, run where it is called.
CREATE FUNCTION gov.subscribe_v1(p_user_id text, p_endpoint text, p_p256dh text, p_auth text)
RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN gov.subscribe_v2(p_user_id, p_endpoint, p_p256dh, p_auth);
END;
$$;

-- gov.claim_outbox_v2 (migration 0010), replaced by gov.claim_outbox_v3 (one shard per
-- call) in migration 0016: on one server, the one shard's claim, as before. On a Citus
-- cluster a claim must run on the worker that holds its shard (SKIP LOCKED holds within a
-- node only) and only a call delegated by its shard key gets there: this one refuses. v2
-- never ran on a cluster (Citus came with 0016).
CREATE FUNCTION gov.claim_outbox_v2(
    p_worker   text,
    p_limit    integer,
    p_lease_ms bigint,
    p_now      timestamptz DEFAULT NULL,
    p_ids      bigint[] DEFAULT NULL
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
BEGIN
    IF gov.distributed() THEN
        RAISE EXCEPTION 'gov.claim_outbox_v2 claims on one server only: on a Citus cluster call '
                        'gov.claim_outbox_v3 once per shard key of gov.shard_keys_v1()' USING ERRCODE = '0A000';
    END IF;
    RETURN QUERY SELECT * FROM gov.claim_outbox_v3(NULL, p_worker, p_limit, p_lease_ms, p_now, p_ids);
END;
$$;

-- gov.claim_outbox_v1 (migration 0002), replaced by claim_outbox_v2 in migration 0010:
-- the same claim without the claim token in its rows (a v1 runner records by its worker
-- name: gov.record_attempt_v1).
CREATE FUNCTION gov.claim_outbox_v1(
    p_worker   text,
    p_limit    integer,
    p_lease_ms bigint,
    p_now      timestamptz DEFAULT NULL,
    p_ids      bigint[] DEFAULT NULL
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
BEGIN
    RETURN QUERY
    SELECT c.outbox_id, c.user_id, c.message_id, c.tier, c.attempts, c.subscription_id, c.endpoint, c.p256dh,
           c.auth, c.content, c.collapse_key, c.ttl_s, c.urgency
      FROM gov.claim_outbox_v2(p_worker, p_limit, p_lease_ms, p_now, p_ids) c;
END;
$$;

-- gov.record_attempt_v2 (migration 0010), replaced by gov.record_attempt_v3 (the row's
-- user first, so that a cluster finds its shard) in migration 0016: the user is looked up
-- by the row's id, then v3 records under the same fencing token. A plain function on
-- every node of a cluster, like v3.
CREATE FUNCTION gov.record_attempt_v2(
    p_outbox_id      bigint,
    p_claim_token    bigint,
    p_worker         text,
    p_origin         text,
    p_outcome        text,
    p_status         integer,
    p_retry_after_ms bigint,
    p_error          text,
    p_max_attempts   integer DEFAULT 8,
    p_backoff_ms     bigint DEFAULT 1000,
    p_backoff_cap_ms bigint DEFAULT 300000,
    p_now            timestamptz DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_user text;
BEGIN
    SELECT o.user_id INTO v_user FROM gov.outbox o WHERE o.id = p_outbox_id;
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    RETURN gov.record_attempt_v3(v_user, p_outbox_id, p_claim_token, p_worker, p_origin, p_outcome, p_status,
                                 p_retry_after_ms, p_error, p_max_attempts, p_backoff_ms, p_backoff_cap_ms, p_now);
END;
$$;

-- gov.record_attempt_v1 (migration 0002), replaced by record_attempt_v2 (a fencing claim
-- token) in migration 0010. v1 fenced by the worker's name; here the name finds the token
-- of the claim this worker still holds, and v3 records under it (invariant 12 as today:
-- a worker whose lease ran out, or whose row was claimed again, records nothing and gets
-- 'stale', where v1 still counted a late success as delivered; a missing row is 'stale'
-- too, where v1 raised).
CREATE FUNCTION gov.record_attempt_v1(
    p_outbox_id      bigint,
    p_worker         text,
    p_origin         text,
    p_outcome        text,
    p_status         integer,
    p_retry_after_ms bigint,
    p_error          text,
    p_max_attempts   integer DEFAULT 8,
    p_backoff_ms     bigint DEFAULT 1000,
    p_backoff_cap_ms bigint DEFAULT 300000,
    p_now            timestamptz DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_user   text;
    v_token  bigint;
    v_state  text;
    v_holder text;
BEGIN
    SELECT o.user_id, o.claim_token, o.state, o.leased_by INTO v_user, v_token, v_state, v_holder
      FROM gov.outbox o WHERE o.id = p_outbox_id;
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    IF v_state <> 'sending' OR v_holder IS DISTINCT FROM p_worker THEN
        RETURN CASE WHEN v_state = 'gone' THEN 'gone' ELSE 'stale' END;
    END IF;
    RETURN gov.record_attempt_v3(v_user, p_outbox_id, v_token, p_worker, p_origin, p_outcome, p_status,
                                 p_retry_after_ms, p_error, p_max_attempts, p_backoff_ms, p_backoff_cap_ms, p_now);
END;
$$;

-- gov.record_attempts_v2 (migration 0010), replaced by gov.record_attempts_v3 (each
-- attempt names its user) in migration 0016: each attempt recorded by record_attempt_v2,
-- in outbox id order, as v2 did.
CREATE FUNCTION gov.record_attempts_v2(
    p_worker         text,
    p_attempts       jsonb,
    p_max_attempts   integer DEFAULT 8,
    p_backoff_ms     bigint DEFAULT 1000,
    p_backoff_cap_ms bigint DEFAULT 300000,
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
        SELECT (e ->> 'outbox_id')::bigint AS id, (e ->> 'claim_token')::bigint AS claim_token,
               e ->> 'origin' AS origin, e ->> 'outcome' AS outcome,
               (e ->> 'status')::integer AS status, (e ->> 'retry_after_ms')::bigint AS retry_after_ms,
               e ->> 'error' AS error
          FROM jsonb_array_elements(p_attempts) e
         ORDER BY 1
    LOOP
        RETURN QUERY
        SELECT r_a.id, gov.record_attempt_v2(r_a.id, r_a.claim_token, p_worker, r_a.origin, r_a.outcome,
                                             r_a.status, r_a.retry_after_ms, r_a.error, p_max_attempts,
                                             p_backoff_ms, p_backoff_cap_ms, p_now);
    END LOOP;
END;
$$;

-- gov.record_attempts_v1 (migration 0007), replaced by record_attempts_v2 in migration
-- 0010: each attempt recorded by record_attempt_v1 (fenced by the worker's name), in
-- outbox id order, as v1 did.
CREATE FUNCTION gov.record_attempts_v1(
    p_worker         text,
    p_attempts       jsonb,
    p_max_attempts   integer DEFAULT 8,
    p_backoff_ms     bigint DEFAULT 1000,
    p_backoff_cap_ms bigint DEFAULT 300000,
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
