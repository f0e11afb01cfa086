-- Migration 0025: the released SQL surface kept (invariant 16, docs/sql-api.md). Every
-- gov.*_vN function an earlier migration dropped comes back as a wrapper over its
-- successor, with its released signature and result: gov.subscribe_v1 (migration 0016
-- dropped it for subscribe_v2, same signature), claim_outbox_v1 and v2, record_attempt_v1
-- and v2, record_attempts_v1 and v2, release_due_v1, decide_many_v1 and send_many_v1.
-- On a Citus cluster gov.distribute_v1 puts them on every node as plain functions (none
-- has a shard key to be delegated by).

-- ---------------------------------------------------------------- released names, kept (invariant 16)

-- gov.decide_many_v1 (migration 0005), replaced by gov.decide_many_v2 (one shard's users
-- per call) in migration 0016: the same decisions, its users split by shard
-- (gov.shard_groups_v1) and each group decided by decide_many_v2 at one moment, the rows
-- in user order as v1 gave them. On a Citus cluster this runs on the coordinator (it has
-- no shard key to be delegated by); decide_many_v2 decides there one user at a time, each
-- under the user's row lock (gov.cluster_user_lock), so the caps hold: slower, not wrong.
CREATE FUNCTION gov.decide_many_v1(
    p_user_ids    text[],
    p_message_id  text,
    p_tier        text,
    p_topic       text DEFAULT NULL,
    p_campaign_id text DEFAULT NULL,
    p_now         timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id        text,
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    repeated       boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    RETURN QUERY
    SELECT d.user_id, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, d.repeated
      FROM gov.shard_groups_v1(p_user_ids) g
     CROSS JOIN LATERAL gov.decide_many_v2(g.shard_key, g.user_ids, p_message_id, p_tier, p_topic,
                                           p_campaign_id, v_now) d
     ORDER BY d.user_id;
END;
$$;

-- gov.send_many_v1 (migration 0005), replaced by gov.send_many_v2 in migration 0016: as
-- gov.decide_many_v1 above, over send_many_v2.
CREATE FUNCTION gov.send_many_v1(
    p_user_ids     text[],
    p_message_id   text,
    p_tier         text,
    p_topic        text,
    p_campaign_id  text,
    p_content      jsonb,
    p_collapse_key text,
    p_ttl_s        integer,
    p_now          timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id    text,
    allowed    boolean,
    action     text,
    reason     text,
    repeated   boolean,
    outbox_ids bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    RETURN QUERY
    SELECT s.user_id, s.allowed, s.action, s.reason, s.repeated, s.outbox_ids
      FROM gov.shard_groups_v1(p_user_ids) g
     CROSS JOIN LATERAL gov.send_many_v2(g.shard_key, g.user_ids, p_message_id, p_tier, p_topic, p_campaign_id,
                                         p_content, p_collapse_key, p_ttl_s, v_now) s
     ORDER BY s.user_id;
END;
$$;

-- ---------------------------------------------------------------- released names, kept (invariant 16)

-- gov.release_due_v1 (migration 0004), replaced by gov.release_due_v2 (one shard per
-- call) in migration 0016: on one server, the one shard's due rows, as before. On a Citus
-- cluster a release must run on the worker that holds its shard (SKIP LOCKED holds within
-- a node only), and only a call delegated by its shard key gets there: this one refuses,
-- with what to call instead. v1 never ran on a cluster (Citus came with 0016).
CREATE FUNCTION gov.release_due_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (user_id text, message_id text, state text, outcome text, outbox_ids bigint[])
LANGUAGE plpgsql AS $$
BEGIN
    IF gov.distributed() THEN
        RAISE EXCEPTION 'gov.release_due_v1 releases on one server only: on a Citus cluster call '
                        'gov.release_due_v2 once per shard key of gov.shard_keys_v1()' USING ERRCODE = '0A000';
    END IF;
    RETURN QUERY SELECT * FROM gov.release_due_v2(NULL, p_limit, p_now);
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
