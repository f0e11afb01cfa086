-- Migration 0016: a schema that distributes. Every key of a per-user table leads with
-- user_id (so Citus can distribute it by user_id, colocated with gov.users), the
-- queues and campaigns work one shard at a time, and gov.distribute_v1 distributes the
-- schema on a Citus cluster (sql/schema/70_scale_out.sql). On one server nothing
-- changes but the keys and the functions' signatures; no row is lost.

-- ---------------------------------------------------------------- stray owners

-- Until now an endpoint subscribed by another user moved to that user, so an outbox row
-- or event could point at a subscription that is now someone else's. The new foreign
-- keys pair (user_id, subscription_id): such rows get a retired copy of the
-- subscription under their own user, so they keep what they said and nothing is lost.
DO $$
DECLARE
    r record;
    v_new bigint;
BEGIN
    FOR r IN
        SELECT DISTINCT x.user_id, x.subscription_id
          FROM (SELECT o.user_id, o.subscription_id FROM gov.outbox o
                UNION
                SELECT e.user_id, e.subscription_id FROM gov.push_events e WHERE e.subscription_id IS NOT NULL
                UNION
                SELECT a.user_id, a.subscription_id FROM gov.delivery_attempts a) x
          JOIN gov.subscriptions s ON s.id = x.subscription_id
         WHERE s.user_id <> x.user_id
    LOOP
        INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth, created_at, retired_at, retired_reason)
        SELECT r.user_id, s.endpoint, s.p256dh, s.auth, s.created_at, clock_timestamp(), 'subscribed by another user'
          FROM gov.subscriptions s WHERE s.id = r.subscription_id
        RETURNING id INTO v_new;
        UPDATE gov.outbox SET subscription_id = v_new WHERE user_id = r.user_id AND subscription_id = r.subscription_id;
        UPDATE gov.push_events SET subscription_id = v_new
         WHERE user_id = r.user_id AND subscription_id = r.subscription_id;
        UPDATE gov.delivery_attempts SET subscription_id = v_new
         WHERE user_id = r.user_id AND subscription_id = r.subscription_id;
    END LOOP;
END;
$$;

-- ---------------------------------------------------------------- keys that lead with user_id

ALTER TABLE gov.push_events DROP CONSTRAINT push_events_subscription_known;
ALTER TABLE gov.outbox DROP CONSTRAINT outbox_subscription_id_fkey;
ALTER TABLE gov.delivery_attempts DROP CONSTRAINT delivery_attempts_outbox_id_fkey;
ALTER TABLE gov.push_suppressions DROP CONSTRAINT push_suppressions_pkey,
    ADD CONSTRAINT push_suppressions_pkey PRIMARY KEY (user_id, id);
ALTER TABLE gov.deferred DROP CONSTRAINT deferred_pkey, ADD CONSTRAINT deferred_pkey PRIMARY KEY (user_id, id);
ALTER TABLE gov.subscriptions DROP CONSTRAINT subscriptions_pkey,
    ADD CONSTRAINT subscriptions_pkey PRIMARY KEY (user_id, id);
DROP INDEX gov.subscriptions_live_endpoint;
DROP INDEX gov.subscriptions_user;
CREATE UNIQUE INDEX subscriptions_live_endpoint ON gov.subscriptions (user_id, endpoint) WHERE retired_at IS NULL;
CREATE INDEX subscriptions_endpoint ON gov.subscriptions (endpoint) WHERE retired_at IS NULL;
ALTER TABLE gov.outbox DROP CONSTRAINT outbox_pkey, ADD CONSTRAINT outbox_pkey PRIMARY KEY (user_id, id);
ALTER TABLE gov.delivery_attempts DROP CONSTRAINT delivery_attempts_pkey,
    ADD CONSTRAINT delivery_attempts_pkey PRIMARY KEY (user_id, id);
ALTER TABLE gov.push_events DROP CONSTRAINT push_events_pkey, ADD CONSTRAINT push_events_pkey PRIMARY KEY (user_id, id);
ALTER TABLE gov.outbox ADD CONSTRAINT outbox_subscription_known FOREIGN KEY (user_id, subscription_id)
    REFERENCES gov.subscriptions (user_id, id);
ALTER TABLE gov.delivery_attempts ADD CONSTRAINT delivery_attempts_outbox_known FOREIGN KEY (user_id, outbox_id)
    REFERENCES gov.outbox (user_id, id) ON DELETE CASCADE;
ALTER TABLE gov.push_events ADD CONSTRAINT push_events_subscription_known FOREIGN KEY (user_id, subscription_id)
    REFERENCES gov.subscriptions (user_id, id) ON DELETE CASCADE;

-- ---------------------------------------------------------------- functions that take a shard

DROP FUNCTION gov.subscribe_v1(text, text, text, text);
DROP FUNCTION gov.claim_outbox_v2(text, integer, bigint, timestamptz, bigint[]);
DROP FUNCTION gov.record_attempts_v2(text, jsonb, integer, bigint, bigint, timestamptz);
DROP FUNCTION gov.record_attempt_v2(bigint, bigint, text, text, text, integer, bigint, text, integer, bigint, bigint,
                                    timestamptz);
DROP FUNCTION gov.release_due_v1(integer, timestamptz);
DROP FUNCTION gov.decide_many_v1(text[], text, text, text, text, timestamptz);
DROP FUNCTION gov.send_many_v1(text[], text, text, text, text, jsonb, text, integer, timestamptz);

-- True when the Citus extension is installed in this database.
CREATE FUNCTION gov.on_citus() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
$$;

-- True when the user tables are distributed (Citus, after gov.distribute_v1). Two steps:
-- pg_dist_partition exists only where Citus is installed.
CREATE FUNCTION gov.distributed() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT gov.on_citus() THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = 'gov.users'::regclass);
END;
$$;

-- The relation that holds p_table's rows for the shard of p_shard_key, as text for a
-- dynamic statement: p_table itself on one server, the shard's own table on Citus. On a
-- cluster the call must run on the node that holds the shard (the functions that call
-- this are delegated there by their shard key); anywhere else it refuses, rather than
-- let a claim reach across nodes, where SKIP LOCKED does not hold.
CREATE FUNCTION gov.shard_relation(p_table regclass, p_shard_key text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_shard text;
BEGIN
    IF NOT gov.distributed() THEN
        RETURN p_table::text;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = p_table AND p.partmethod = 'n') THEN
        -- a reference table: every node has its one shard
        SELECT shard_name(p_table, s.shardid) INTO v_shard FROM pg_dist_shard s WHERE s.logicalrelid = p_table;
    ELSE
        IF p_shard_key IS NULL THEN
            RAISE EXCEPTION 'on a Citus cluster % is read one shard at a time: give a shard key (gov.shard_keys_v1())',
                p_table USING ERRCODE = '22023';
        END IF;
        v_shard := shard_name(p_table, get_shard_id_for_distribution_column(p_table, p_shard_key));
    END IF;
    IF to_regclass(v_shard) IS NULL THEN
        RAISE EXCEPTION 'shard % of % is not on this node: call the function through the coordinator, '
                        'which delegates it to the worker that holds the shard', v_shard, p_table
            USING ERRCODE = '55000';
    END IF;
    RETURN v_shard;
END;
$$;

-- One shard key per shard of the user tables (one NULL on a single server): the keys the
-- releaser and the runner walk. A key is any text that hashes into its shard.
CREATE FUNCTION gov.shard_keys_v1() RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_shards integer;
    v_keys   text[] := '{}';
    v_seen   bigint[] := '{}';
    v_shard  bigint;
    i        integer := 0;
BEGIN
    IF NOT gov.distributed() THEN
        RETURN ARRAY[NULL::text];
    END IF;
    SELECT count(*) INTO v_shards FROM pg_dist_shard s WHERE s.logicalrelid = 'gov.users'::regclass;
    -- each try lands in a shard at random: about n·ln(n) tries cover n shards
    WHILE cardinality(v_seen) < v_shards LOOP
        i := i + 1;
        v_shard := get_shard_id_for_distribution_column('gov.users', 'shard-' || i);
        IF NOT v_shard = ANY (v_seen) THEN
            v_seen := v_seen || v_shard;
            v_keys := v_keys || ('shard-' || i);
        END IF;
    END LOOP;
    RETURN v_keys;
END;
$$;

-- A campaign's audience in per-shard groups, each with its shard key (its first user),
-- so each group is decided on the worker that holds it. One group on a single server.
CREATE FUNCTION gov.shard_groups_v1(p_user_ids text[])
RETURNS TABLE (shard_key text, user_ids text[])
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT gov.distributed() THEN
        RETURN QUERY SELECT NULL::text, array_agg(DISTINCT u ORDER BY u) FROM unnest(p_user_ids) u HAVING count(*) > 0;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT min(u), array_agg(DISTINCT u ORDER BY u)
      FROM unnest(p_user_ids) u
     GROUP BY get_shard_id_for_distribution_column('gov.users', u)
     ORDER BY 1;
END;
$$;

-- On a Citus cluster, refuse a batch whose users are not all in p_shard_key's shard (a
-- campaign slice decided on one worker must be that worker's users).
CREATE FUNCTION gov.require_one_shard(p_shard_key text, p_user_ids text[]) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT gov.distributed() THEN
        RETURN;
    END IF;
    IF p_shard_key IS NULL THEN
        RAISE EXCEPTION 'on a Citus cluster a batch of users is decided one shard at a time: '
                        'give a shard key (gov.shard_groups_v1())' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_user_ids) u
                WHERE get_shard_id_for_distribution_column('gov.users', u)
                      <> get_shard_id_for_distribution_column('gov.users', p_shard_key)) THEN
        RAISE EXCEPTION 'the batch holds users of another shard than its key %', p_shard_key
            USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Store a browser's subscription for a user (validated in Python before it gets here).
-- The same endpoint again for the same user updates its keys. An endpoint is one
-- browser's: subscribed now by another user (a shared browser that changed accounts), it
-- stops being the earlier user's, whose row is retired, not handed over, so nothing
-- queued for them is ever sent to the new user's browser.
CREATE FUNCTION gov.subscribe_v2(p_user_id text, p_endpoint text, p_p256dh text, p_auth text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id  bigint;
    v_now timestamptz := clock_timestamp();  -- a variable: Citus refuses volatile calls in an UPDATE
BEGIN
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

-- One call and one commit for a runner's batch instead of one per message: a durable
-- commit is the largest single cost of a write (PERFORMANCE.md). Each element is
-- {"user_id", "outbox_id", "claim_token", "origin", "outcome", "status", "retry_after_ms",
-- "error"}; each is recorded exactly as gov.record_attempt_v3 would (fenced by its claim token:
-- 'stale' for a row this runner no longer holds), in outbox id order (the order claims
-- lock rows in, so two runners never wait on each other in a cycle).
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

-- Decide one message for many users in one call and one transaction: the same
-- decision (gov.decide_core) per user, so the verdicts and suppression rows are those
-- one-by-one decisions would give, but one commit for the batch instead of one per
-- user. User locks are taken in user_id order, the order every batch uses, so two
-- batches never wait on each other in a cycle (a single send locks one user only).
-- Callers keep batches modest (gov.Governor.decide_many: 500): every user lock is held
-- until the batch commits, and they share the server's lock table.
-- p_shard_key: on a Citus cluster the batch is one shard's users and is decided on the
-- worker that holds them (gov.shard_groups_v1 splits an audience); NULL on one server.
CREATE FUNCTION gov.decide_many_v2(
    p_shard_key   text,
    p_user_ids    text[],
    p_message_id  text,
    p_tier        text,
    p_topic       text        DEFAULT NULL,
    p_campaign_id text        DEFAULT NULL,
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
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    r_user record;
BEGIN
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    FOR r_user IN SELECT DISTINCT u AS id FROM unnest(p_user_ids) u ORDER BY 1 LOOP
        RETURN QUERY
        SELECT r_user.id, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, d.repeated
          FROM gov.decide_core(r_user.id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;
    END LOOP;
END;
$$;

-- The same for sends: decide, store the content, fan out or hold, per user.
CREATE FUNCTION gov.send_many_v2(
    p_shard_key    text,
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
    user_id        text,
    allowed        boolean,
    action         text,
    reason         text,
    repeated       boolean,
    outbox_ids     bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    r_user record;
BEGIN
    PERFORM gov.require_one_shard(p_shard_key, p_user_ids);
    FOR r_user IN SELECT DISTINCT u AS id FROM unnest(p_user_ids) u ORDER BY 1 LOOP
        RETURN QUERY
        SELECT r_user.id, s.allowed, s.action, s.reason, s.repeated, s.outbox_ids
          FROM gov.send_v1(r_user.id, p_message_id, p_tier, p_topic, p_campaign_id, p_content,
                           p_collapse_key, p_ttl_s, v_now) s;
    END LOOP;
END;
$$;

-- ---------------------------------------------------------------- the decision, pushed down whole

-- The decision itself, shared by a first decision (gov.decide_v1, gov.send_v1) and a
-- re-decision at release (p_release: the message was decided before and waited; it
-- is decided again now, its verdict updated, and no second suppression is logged).
-- The rules come compiled (gov.compiled_rules, written at `gov policy apply`): one index
-- scan for the (tier, topic, segment) group, a user's own caps joined only for a user
-- who has any. Each budget's windows are counted in one range scan of gov.sends over the
-- longest of them; the moment a slot frees is computed only for the window that blocks.
-- An allowed message writes a send row only for the budgets some cap reads.
CREATE OR REPLACE FUNCTION gov.decide_core(
    p_user_id     text,
    p_message_id  text,
    p_tier        text,
    p_topic       text,
    p_campaign_id text,
    p_now         timestamptz,
    p_release     boolean
) RETURNS TABLE (
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    repeated       boolean
)
LANGUAGE plpgsql
-- One generic plan per statement, kept for the session: measured, re-planning the rule
-- query on every call (PostgreSQL's custom plans for the first calls, and whenever the
-- generic one looks dearer) was most of a decision's server time.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_tier    gov.tiers%ROWTYPE;
    v_msg     gov.messages%ROWTYPE;
    r_rule    record;
    v_used    integer;
    v_cap     integer;
    v_rule    text;
    v_scope   text;
    v_action  text;
    v_free_at timestamptz;
    v_segment text;
    v_seg_key text := '';
    v_tz      text;
    v_topic   text := '';
    v_own     boolean;
    v_budget  text;
    v_window  bigint;
    v_counts  bigint[];
    v_uc      jsonb;
    v_spend   text[];
BEGIN
    IF p_user_id IS NULL OR p_user_id = '' THEN
        RAISE EXCEPTION 'user_id is required' USING ERRCODE = 'GV001';
    END IF;
    IF p_message_id IS NULL OR p_message_id = '' THEN
        RAISE EXCEPTION 'message id is required (user %)', p_user_id USING ERRCODE = 'GV001';
    END IF;
    SELECT * INTO v_tier FROM gov.tiers t WHERE t.tier = p_tier;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown tier % for message % (the policy defines: %)', p_tier, p_message_id,
            (SELECT string_agg(t.tier, ', ' ORDER BY t.tier) FROM gov.tiers t)
            USING ERRCODE = 'GV001';
    END IF;

    PERFORM pg_advisory_xact_lock(hashtextextended(p_user_id, 0));

    -- Idempotent on (user, message): a repeat returns the first verdict, spends nothing.
    IF NOT p_release THEN
        SELECT * INTO v_msg FROM gov.messages m
         WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
        IF FOUND THEN
            RETURN QUERY SELECT v_msg.allowed, v_msg.action, v_msg.reason, v_msg.used, v_msg.cap,
                                v_msg.retry_after_ms, true;
            RETURN;
        END IF;
    END IF;

    IF NOT v_tier.exempt THEN
        -- The user's segment and time zone, read once under the user's lock. The segment
        -- chooses the windows of each consumed tier when the policy has that segment's
        -- (its own group of compiled rules); any other segment, or none, reads group ''.
        SELECT u.segment, u.time_zone INTO v_segment, v_tz FROM gov.users u WHERE u.user_id = p_user_id;
        -- The topic's own caps when it has any, else those of "*" ('' without a topic).
        IF p_topic IS NOT NULL THEN
            v_topic := CASE WHEN EXISTS (SELECT 1 FROM gov.caps c WHERE c.scope = 'topic' AND c.topic = p_topic)
                            THEN p_topic ELSE '*' END;
        END IF;
        IF v_segment IS NOT NULL AND EXISTS (SELECT 1 FROM gov.compiled_rules r
                                              WHERE r.tier = p_tier AND r.topic = v_topic
                                                AND r.segment = v_segment) THEN
            v_seg_key := v_segment;
        END IF;
        -- A topic the user opted out of (the preference centre) is dropped, whatever
        -- the verb and the hour: holding it through the night would only drop it later.
        IF p_topic IS NOT NULL AND EXISTS (SELECT 1 FROM gov.user_topic_optouts o
                                            WHERE o.user_id = p_user_id AND o.topic = p_topic) THEN
            v_rule := 'topic_opt_out';
            v_scope := 'topic';
            v_action := 'drop';
            v_free_at := NULL;
        ELSIF v_tz IS NOT NULL THEN
            -- Quiet hours first: whatever the tier's verb, a message that arrives inside
            -- them waits until they end. Only a user with a time zone has them; P0
            -- (exempt) is never quieted.
            v_free_at := gov.quiet_until(p_user_id, v_now);
        END IF;
        IF v_rule IS NOT NULL THEN
            NULL;  -- opted out: decided above
        ELSIF v_free_at > v_now THEN
            v_rule := 'quiet_hours';
            v_scope := 'quiet_hours';
            v_action := 'defer';
        ELSE
            v_free_at := NULL;
            -- Does the user have caps of their own? Then each window's cap is the least of
            -- the default and theirs, and their cap over a window the segment's windows
            -- lack still holds on its own: segment windows never lift a user's own limit.
            -- (Read alone, not joined: the rule query then reads only policy tables, which on a
            -- Citus cluster are reference tables beside the user's shard.)
            SELECT jsonb_agg(jsonb_build_object('scope', uc.scope, 'window_ms', uc.window_ms, 'cap', uc.cap))
              INTO v_uc
              FROM gov.user_caps uc WHERE uc.user_id = p_user_id;
            v_own := v_uc IS NOT NULL;
            <<rules>>
            FOR r_rule IN
                SELECT r.seq, r.budget, r.scope, r.windows, r.caps
                  FROM gov.compiled_rules r
                 WHERE NOT v_own AND r.tier = p_tier AND r.topic = v_topic AND r.segment = v_seg_key
                UNION ALL
                SELECT r.seq, r.budget, r.scope, o.windows, o.caps
                  FROM gov.compiled_rules r
                 CROSS JOIN LATERAL (
                        SELECT array_agg(x.w ORDER BY x.w) AS windows, array_agg(x.c ORDER BY x.w) AS caps
                          FROM (SELECT d.w, least(d.c, uc.cap) AS c
                                  FROM unnest(r.windows, r.caps) AS d(w, c)
                                  LEFT JOIN jsonb_to_recordset(v_uc) AS uc(scope text, window_ms bigint, cap integer)
                                         ON uc.scope = r.scope AND uc.window_ms = d.w
                                UNION ALL
                                SELECT uo.window_ms, uo.cap
                                  FROM jsonb_to_recordset(v_uc) AS uo(scope text, window_ms bigint, cap integer)
                                 WHERE uo.scope = r.scope
                                   AND r.scope NOT IN ('topic', 'global')
                                   AND EXISTS (SELECT 1 FROM gov.segment_caps s
                                                WHERE s.tier = r.scope AND s.segment = v_seg_key)
                                   AND NOT uo.window_ms = ANY (r.windows)
                                   -- only a cap with a default to lower, as the guard admits
                                   AND gov.user_cap_ceiling(uo.scope, uo.window_ms) IS NOT NULL) x
                       ) o
                 WHERE v_own AND r.tier = p_tier AND r.topic = v_topic AND r.segment = v_seg_key
                 ORDER BY 1
            LOOP
                v_budget := CASE WHEN r_rule.scope = 'topic' THEN 'topic:' || p_topic ELSE r_rule.budget END;
                -- Every window of the budget (up to four) in one range scan over the longest.
                SELECT ARRAY[count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[1] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[2] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[3] * interval '1 millisecond'),
                             count(*) FILTER (WHERE s.sent_at > v_now - r_rule.windows[4] * interval '1 millisecond')]
                  INTO v_counts
                  FROM gov.sends s
                 WHERE s.user_id = p_user_id AND s.budget = v_budget
                   AND s.sent_at > v_now - r_rule.windows[least(cardinality(r_rule.windows), 4)]
                                           * interval '1 millisecond';
                FOR i IN 1 .. cardinality(r_rule.windows) LOOP
                    v_window := r_rule.windows[i];
                    IF i <= 4 THEN
                        v_used := v_counts[i];
                    ELSE  -- a fifth window and beyond: a count of its own
                        SELECT count(*) INTO v_used
                          FROM gov.sends s
                         WHERE s.user_id = p_user_id AND s.budget = v_budget
                           AND s.sent_at > v_now - v_window * interval '1 millisecond';
                    END IF;
                    CONTINUE WHEN v_used < r_rule.caps[i];

                    -- Blocked. A slot frees when enough of the oldest rows leave the window
                    -- for the count to drop below the cap (more than one when a cap was lowered).
                    v_cap := r_rule.caps[i];
                    IF v_cap > 0 THEN  -- a cap of 0 never frees a slot
                        SELECT s.sent_at + v_window * interval '1 millisecond' INTO v_free_at
                          FROM gov.sends s
                         WHERE s.user_id = p_user_id AND s.budget = v_budget
                           AND s.sent_at > v_now - v_window * interval '1 millisecond'
                         ORDER BY s.sent_at
                        OFFSET v_used - v_cap LIMIT 1;
                    END IF;
                    v_rule := CASE r_rule.scope WHEN 'topic' THEN 'topic_cap_' WHEN 'global' THEN 'global_cap_'
                                                ELSE 'cap_' END || v_window || 'ms';
                    v_scope := r_rule.scope;
                    v_action := v_tier.on_exceed;
                    EXIT rules;
                END LOOP;
            END LOOP;
        END IF;

        IF v_rule IS NOT NULL THEN
            v_msg.retry_after_ms := CASE WHEN v_free_at IS NOT NULL
                                         THEN greatest(0, ceil(extract(epoch FROM v_free_at - v_now) * 1000))::bigint
                                    END;
            IF p_release THEN
                UPDATE gov.messages m
                   SET allowed = false, action = v_action, reason = v_rule, used = v_used, cap = v_cap,
                       retry_after_ms = v_msg.retry_after_ms, decided_at = v_now
                 WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
            ELSE
                INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, action,
                                          reason, used, cap, retry_after_ms, decided_at)
                VALUES (p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, false, v_action,
                        v_rule, v_used, v_cap, v_msg.retry_after_ms, v_now);
                INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action,
                                                   campaign_id, topic, blocked_scope, used, cap,
                                                   retry_after_ms, created_at, segment)
                VALUES (p_user_id, p_message_id, p_tier, v_rule, v_action, p_campaign_id, p_topic,
                        v_scope, v_used, v_cap, v_msg.retry_after_ms, v_now, v_segment);
            END IF;
            RETURN QUERY SELECT false, v_action, v_rule, v_used, v_cap, v_msg.retry_after_ms, false;
            RETURN;
        END IF;

        -- Every rule passed: spend one slot in each budget some cap reads (for a user of
        -- any segment, so a change of segment finds the history it needs).
        -- (Gathered first: an insert that reads no policy table is one shard's on Citus.)
        v_spend := ARRAY(SELECT DISTINCT CASE WHEN r.scope = 'topic' THEN 'topic:' || p_topic ELSE r.budget END
                           FROM gov.compiled_rules r
                          WHERE r.tier = p_tier AND r.topic = v_topic);
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT p_user_id, b, v_now, p_message_id FROM unnest(v_spend) b;
    END IF;

    IF p_release THEN
        UPDATE gov.messages m
           SET allowed = true, action = NULL, reason = NULL, used = NULL, cap = NULL,
               retry_after_ms = NULL, decided_at = v_now
         WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
    ELSE
        INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, decided_at)
        VALUES (p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, true, v_now);
    END IF;

    RETURN QUERY SELECT true, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::bigint, false;
END;
$$;

-- One outbox row per live endpoint of the user, for an allowed message. PL/pgSQL, not
-- SQL: Citus cannot plan a SQL function's parameters into a query on a distributed table.
CREATE OR REPLACE FUNCTION gov.fan_out(p_user_id text, p_message_id text, p_now timestamptz) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
BEGIN
    WITH fan AS (
        INSERT INTO gov.outbox (user_id, message_id, subscription_id, next_attempt_at, created_at)
        SELECT p_user_id, p_message_id, s.id, p_now, p_now
          FROM gov.subscriptions s
         WHERE s.user_id = p_user_id AND s.retired_at IS NULL
         ORDER BY s.id
        RETURNING id
    )
    SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO v_ids FROM fan;
    RETURN v_ids;
END;
$$;

-- ---------------------------------------------------------------- budgets looked up without a table

-- The budgets the compiled policy has allowed messages spend, as one value: per tier and
-- topic key (tier, US, topic: '' without a topic, the topic when it has caps of its own,
-- else '*') the budgets some cap reads, 'topic:' standing for the message's own topic;
-- and the topics with caps of their own. Read once, then looked up per message by
-- gov.budgets_of, which reads no table: a query over many users (on a Citus cluster, on
-- the shards) then never calls back into the policy tables.
CREATE FUNCTION gov.budget_map_v1() RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
               'rules', coalesce((SELECT jsonb_object_agg(k.key, k.budgets)
                                    FROM (SELECT r.tier || E'\x1f' || r.topic AS key,
                                                 jsonb_agg(DISTINCT CASE WHEN r.scope = 'topic' THEN 'topic:'
                                                                         ELSE r.budget END) AS budgets
                                            FROM gov.compiled_rules r
                                           GROUP BY r.tier, r.topic) k), '{}'),
               'topics', coalesce((SELECT jsonb_agg(DISTINCT c.topic) FROM gov.caps c WHERE c.scope = 'topic'), '[]'))
$$;

-- The budgets an allowed message of p_tier with p_topic spends, from gov.budget_map_v1().
CREATE FUNCTION gov.budgets_of(p_map jsonb, p_tier text, p_topic text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(CASE WHEN b = 'topic:' THEN 'topic:' || p_topic ELSE b END ORDER BY b), '{}')
      FROM jsonb_array_elements_text(
               p_map -> 'rules' -> (p_tier || E'\x1f' || CASE WHEN p_topic IS NULL THEN ''
                                                             WHEN p_map -> 'topics' ? p_topic THEN p_topic
                                                             ELSE '*' END)) b
$$;

-- The budgets an allowed message of p_tier with p_topic spends under the compiled
-- policy: those some cap reads, for a user of any segment. A budget no cap reads is not
-- written; a policy that caps it later fills it from gov.messages (gov.backfill_sends_v1).
CREATE OR REPLACE FUNCTION gov.spent_budgets(p_tier text, p_topic text) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT gov.budgets_of(gov.budget_map_v1(), p_tier, p_topic)
$$;

-- After a policy caps a budget that was not written before (p_before: gov.capped_budgets()
-- under the previous policy), give every allowed message decided within the longest
-- window before p_now the rows of such budgets it would have spent, from gov.messages:
-- the new cap then counts the sends gov remembers instead of starting from nothing.
-- Budgets written before are left as they are. Returns the rows written.
CREATE OR REPLACE FUNCTION gov.backfill_sends_v1(p_before text[], p_now timestamptz DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_map     jsonb := gov.budget_map_v1();
    v_longest bigint;
    v_count   bigint;
BEGIN
    SELECT max(w) INTO v_longest FROM gov.compiled_rules r, unnest(r.windows) w;
    IF v_longest IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
    SELECT m.user_id, b.budget, m.decided_at, m.message_id
      FROM gov.messages m
     CROSS JOIN LATERAL unnest(gov.budgets_of(v_map, m.tier, m.topic)) AS b(budget)
     WHERE m.allowed AND m.decided_at > v_now - v_longest * interval '1 millisecond' AND m.decided_at <= v_now
       AND NOT b.budget = ANY (p_before)
       AND NOT (b.budget LIKE 'topic:%' AND 'topic:*' = ANY (p_before))
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

-- Replay every message decided in the window (p_now - p_since, p_now], in decision
-- order, through gov.decide_v1 at its own decided_at under the policy stored now, and
-- return its recorded verdict beside the replayed one. To try a candidate policy, store
-- it in a transaction that is rolled back afterwards (gov policy whatif does).
--
-- It changes nothing, whoever calls it: the replay runs under stand-in user ids (so no
-- real user's lock is taken and no real row is touched), seeded with each user's real
-- sends from before the window, own caps, settings and current segment (so the policy's
-- segment caps apply to each as they would today); and it runs inside a block that
-- ends by raising, which rolls every write of the replay back. Only the verdicts,
-- kept in local variables, survive. A tier the policy no longer defines replays as
-- refused with reason 'unknown_tier'.
CREATE OR REPLACE FUNCTION gov.whatif_v1(
    p_since interval    DEFAULT '7 days',
    p_now   timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id      text,
    message_id   text,
    tier         text,
    topic        text,
    campaign_id  text,
    decided_at   timestamptz,
    was_allowed  boolean,
    was_reason   text,
    would_allow  boolean,
    would_action text,
    would_reason text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := coalesce(p_now, clock_timestamp());
    v_from     timestamptz;
    v_tag      text := 'whatif:' || md5(random()::text || clock_timestamp()::text) || ':';
    v_users    text[];
    v_ids      text[];
    v_tiers    text[];
    v_topics   text[];
    v_camps    text[];
    v_at       timestamptz[];
    v_allowed  boolean[];
    v_reasons  text[];
    v_w_allow  boolean[] := '{}';
    v_w_action text[] := '{}';
    v_w_reason text[] := '{}';
    v_n        integer;
    v_verdict  record;
BEGIN
    v_from := v_now - p_since;
    SELECT array_agg(m.user_id ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.message_id ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.tier ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.topic ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.campaign_id ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.decided_at ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.allowed ORDER BY m.decided_at, m.user_id, m.message_id),
           array_agg(m.reason ORDER BY m.decided_at, m.user_id, m.message_id)
      INTO v_users, v_ids, v_tiers, v_topics, v_camps, v_at, v_allowed, v_reasons
      FROM gov.messages m
     WHERE m.decided_at > v_from AND m.decided_at <= v_now;
    v_n := coalesce(array_length(v_ids, 1), 0);
    IF v_n = 0 THEN
        RETURN;
    END IF;

    BEGIN
        -- the stand-ins start from each user's real history before the window: the send
        -- rows, and every allowed message in gov.messages spending the budgets the
        -- candidate has it spend (a decision writes rows only for budgets a cap reads, so
        -- a candidate capping a budget the live policy leaves uncapped, global say, still
        -- counts the sends before the window)
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT v_tag || h.user_id, h.budget, h.sent_at, h.message_id
          FROM (SELECT s.user_id, s.budget, s.sent_at, s.message_id
                  FROM gov.sends s
                 WHERE s.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid))
                UNION
                SELECT m.user_id, b.budget, m.decided_at, m.message_id
                  FROM gov.messages m
                 CROSS JOIN LATERAL unnest(gov.budgets_of(gov.budget_map_v1(), m.tier, m.topic)) AS b(budget)
                 WHERE m.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid))
                   AND m.allowed
                   AND NOT EXISTS (SELECT 1 FROM gov.sends s
                                    WHERE s.user_id = m.user_id AND s.budget = b.budget
                                      AND s.message_id = m.message_id)) h
         WHERE h.sent_at <= v_from
           AND h.sent_at > v_from - (SELECT coalesce(max(w.window_ms), 0)
                                       FROM (SELECT c.window_ms FROM gov.caps c
                                             UNION ALL
                                             SELECT sc.window_ms FROM gov.segment_caps sc) w)
                                    * interval '1 millisecond';
        -- their own caps, where the policy has a default to lower (none, no effect)
        INSERT INTO gov.user_caps (user_id, scope, window_ms, cap)
        SELECT v_tag || uc.user_id, uc.scope, uc.window_ms,
               least(uc.cap, gov.user_cap_ceiling(uc.scope, uc.window_ms))
          FROM gov.user_caps uc
         WHERE uc.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid))
           AND gov.user_cap_ceiling(uc.scope, uc.window_ms) IS NOT NULL;
        -- and their time zone, quiet hours and segment
        INSERT INTO gov.users (user_id, time_zone, quiet_start, quiet_end, segment)
        SELECT v_tag || su.user_id, su.time_zone, su.quiet_start, su.quiet_end, su.segment
          FROM gov.users su
         WHERE su.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid));

        FOR i IN 1 .. v_n LOOP
            IF EXISTS (SELECT 1 FROM gov.tiers t WHERE t.tier = v_tiers[i]) THEN
                SELECT d.allowed, d.action, d.reason INTO v_verdict
                  FROM gov.decide_v1(v_tag || v_users[i], v_ids[i], v_tiers[i], v_topics[i], v_camps[i], v_at[i]) d;
                v_w_allow[i] := v_verdict.allowed;
                v_w_action[i] := v_verdict.action;
                v_w_reason[i] := v_verdict.reason;
            ELSE
                v_w_allow[i] := false;
                v_w_action[i] := 'refuse';
                v_w_reason[i] := 'unknown_tier';
            END IF;
        END LOOP;

        RAISE EXCEPTION 'whatif: undo the replay' USING ERRCODE = 'GV900';
    EXCEPTION WHEN SQLSTATE 'GV900' THEN
        NULL;  -- every write of the replay is rolled back here; the arrays keep the verdicts
    END;

    RETURN QUERY
    SELECT r.uid, r.mid, r.tier, r.topic, r.camp, r.at, r.was, r.was_reason, r.would, r.would_action, r.would_reason
      FROM unnest(v_users, v_ids, v_tiers, v_topics, v_camps, v_at, v_allowed, v_reasons,
                  v_w_allow, v_w_action, v_w_reason)
           AS r(uid, mid, tier, topic, camp, at, was, was_reason, would, would_action, would_reason);
END;
$$;

-- ---------------------------------------------------------------- policy reads a shard's statement may make

-- The highest default a user's own cap for (scope, window) can lower: the policy's cap
-- for that window (a tier's own, or the "*" topic cap), or, for a tier, the highest of
-- its segments' caps over that window; NULL when the policy has no such window. A user
-- cap is always applied as the least of it and the default in force, so it never raises
-- anything; this is what it is checked against when it is written.
CREATE OR REPLACE FUNCTION gov.user_cap_ceiling(p_scope text, p_window_ms bigint) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_cap integer;
BEGIN
    -- The policy tables by their local relation (gov.shard_relation; themselves on one
    -- server): on a Citus cluster this runs inside a shard's statement (the user-cap
    -- trigger, the decision's rule query), where reading the reference tables by name
    -- would be a distributed query started from a shard, which Citus refuses.
    EXECUTE format($q$
        SELECT max(d.cap)
          FROM (SELECT c.cap FROM %s c
                 WHERE c.scope = $1 AND c.window_ms = $2
                   AND c.topic = CASE WHEN $1 = 'topic' THEN '*' ELSE '' END
                UNION ALL
                SELECT sc.cap FROM %s sc
                 WHERE sc.tier = $1 AND sc.window_ms = $2) d
        $q$, gov.shard_relation('gov.caps', NULL), gov.shard_relation('gov.segment_caps', NULL))
      INTO v_cap USING p_scope, p_window_ms;
    RETURN v_cap;
END;
$$;

-- A bounded jitter, so held messages do not fire together; derived from the message
-- (not random()) so a simulation with a seed replays exactly.
CREATE OR REPLACE FUNCTION gov.release_jitter(p_user_id text, p_message_id text) RETURNS interval
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_jitter_ms bigint;
BEGIN
    -- gov.settings by its local relation, as in gov.user_cap_ceiling (a Citus worker may
    -- call this inside a shard's statement)
    EXECUTE format('SELECT s.jitter_ms FROM %s s', gov.shard_relation('gov.settings', NULL)) INTO v_jitter_ms;
    IF coalesce(v_jitter_ms, 0) <= 0 THEN
        RETURN interval '0';
    END IF;
    RETURN (abs(hashtextextended(p_user_id || E'\x1f' || p_message_id, 7)) % v_jitter_ms) * interval '1 millisecond';
END;
$$;

-- ---------------------------------------------------------------- holding and releasing by (user_id, id)

-- Put a suppressed message in the queue (or refuse to, with the reason), from the
-- verdict just given. Returns the outcome: ('defer'|'collapse', reason, release_at)
-- when held, ('drop', reason, NULL) when it cannot be held.
--
-- What holds it: a tier whose verb is collapse collapses whatever blocked it (quiet
-- hours too), a message without a collapse key joining its user's keyless group of
-- that tier (key ''); quiet hours hold any other tier's message; else the tier's verb.
-- A collapse group (user, key) is kept alive by its newest member: the newcomer
-- becomes the group's one waiting row (its carrier, standing for every member), the
-- old carrier and all it stood for are collapsed into it at once, and the group waits
-- for the slot the newcomer's decision names. A newcomer whose own deadline passes
-- before that slot expires alone; the group keeps its carrier.
CREATE OR REPLACE FUNCTION gov.hold(
    p_user_id      text,
    p_message_id   text,
    p_tier         text,
    p_collapse_key text,
    p_action       text,
    p_reason       text,
    p_retry_ms     bigint,
    p_expires_at   timestamptz,
    p_now          timestamptz,
    OUT o_action   text,
    OUT o_reason   text,
    OUT o_release  timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_kind    text;
    v_key     text := p_collapse_key;
    v_tier    gov.tiers%ROWTYPE;
    v_planned timestamptz;
    v_give_up timestamptz;
    v_carrier gov.deferred%ROWTYPE;
BEGIN
    SELECT * INTO v_tier FROM gov.tiers t WHERE t.tier = p_tier;
    IF p_action NOT IN ('defer', 'collapse') OR p_retry_ms IS NULL THEN
        o_action := 'drop';  -- the verb drops, or no slot ever frees (a cap of 0)
        o_reason := p_reason;
        RETURN;
    END IF;
    IF v_tier.on_exceed = 'collapse' THEN
        v_kind := 'collapse';
        v_key := coalesce(p_collapse_key, '');
    ELSIF p_reason = 'quiet_hours' THEN
        v_kind := 'quiet';
    ELSE
        v_kind := 'defer';
    END IF;

    -- The earliest moment that clears the blocking window and the user's quiet hours.
    v_planned := gov.quiet_until(p_user_id, p_now + p_retry_ms * interval '1 millisecond');
    IF v_kind = 'defer' THEN
        -- the policy stores defer_max for every defer tier; the code holds no caps of its own
        v_give_up := p_now + v_tier.defer_max_ms * interval '1 millisecond';
        IF v_planned > v_give_up THEN
            o_action := 'drop';
            o_reason := 'defer_expired';
        END IF;
    END IF;
    IF o_reason IS NULL AND v_planned >= p_expires_at THEN
        o_action := 'drop';  -- it would be dead on arrival
        o_reason := 'ttl_expired';
    END IF;
    IF o_reason IS NOT NULL THEN
        INSERT INTO gov.deferred (user_id, message_id, tier, kind, collapse_key, blocked_by, enqueued_at,
                                  planned_at, release_at, give_up_at, state, outcome, finished_at)
        VALUES (p_user_id, p_message_id, p_tier, v_kind, v_key, p_reason, p_now,
                v_planned, v_planned, v_give_up, 'expired', o_reason, p_now);
        RETURN;
    END IF;

    o_action := CASE WHEN v_kind = 'quiet' THEN 'defer' ELSE v_kind END;
    o_reason := p_reason;
    -- jitter from the group (not the member), so a group's release time is stable
    o_release := v_planned + gov.release_jitter(p_user_id, CASE WHEN v_kind = 'collapse'
                                                                THEN '#collapse:' || v_key ELSE p_message_id END);
    IF v_kind = 'collapse' THEN
        SELECT * INTO v_carrier FROM gov.deferred d
         WHERE d.user_id = p_user_id AND d.collapse_key = v_key AND d.kind = 'collapse' AND d.state = 'waiting'
           FOR UPDATE;
        IF FOUND THEN
            -- the newcomer carries the group: the old carrier and everything it stood for
            -- are collapsed into the newcomer now (first, so one carrier waits at a time)
            UPDATE gov.deferred d SET collapsed_into = p_message_id
             WHERE d.user_id = p_user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
               AND d.collapsed_into = v_carrier.message_id;
            UPDATE gov.deferred d
               SET state = 'collapsed', outcome = 'collapsed', collapsed_into = p_message_id, finished_at = p_now
             WHERE d.user_id = p_user_id AND d.id = v_carrier.id;
        END IF;
    END IF;
    INSERT INTO gov.deferred (user_id, message_id, tier, kind, collapse_key, blocked_by, enqueued_at,
                              planned_at, release_at, give_up_at, stands_for)
    VALUES (p_user_id, p_message_id, p_tier, v_kind, v_key, p_reason, p_now,
            v_planned, o_release, v_give_up, coalesce(v_carrier.stands_for, 0) + 1);
END;
$$;

-- A collapse tier's message that is allowed while a group of its key waits carries
-- that group: it goes out as the summary (its own, newest, content with data.count),
-- and the waiting carrier and everything it stood for are collapsed into it. Without
-- this the newcomer would take the slot the group waits for, and the group, decided
-- again after it, would wait a whole window more. Called by gov.send_v1 (the caller
-- holds the user's lock; a releaser holding the carrier never waits for that lock).
CREATE OR REPLACE FUNCTION gov.absorb_group(
    p_user_id      text,
    p_message_id   text,
    p_tier         text,
    p_collapse_key text,
    p_now          timestamptz
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_carrier gov.deferred%ROWTYPE;
BEGIN
    SELECT d.* INTO v_carrier
      FROM gov.deferred d
      JOIN gov.tiers t ON t.tier = p_tier AND t.on_exceed = 'collapse'
     WHERE d.user_id = p_user_id AND d.collapse_key = coalesce(p_collapse_key, '') AND d.kind = 'collapse'
       AND d.state = 'waiting'
       FOR UPDATE OF d;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE gov.deferred d SET collapsed_into = p_message_id
     WHERE d.user_id = p_user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
       AND d.collapsed_into = v_carrier.message_id;
    UPDATE gov.deferred d
       SET state = 'collapsed', outcome = 'collapsed', collapsed_into = p_message_id, finished_at = p_now
     WHERE d.user_id = p_user_id AND d.id = v_carrier.id;
    UPDATE gov.message_content c SET content = c.content || jsonb_build_object('count', v_carrier.stands_for + 1)
     WHERE c.user_id = p_user_id AND c.message_id = p_message_id;
END;
$$;

-- One held row, decided again at p_now (the caller holds the row and the user's lock).
-- Past the message's deadline → expired (ttl_expired), not sent. Allowed → outbox: a
-- carrier that stands for several messages goes out as ONE summary, the newest
-- content with data.count = how many it stands for (its tag and Topic are the key's).
-- Still blocked → waits again for the new slot, unless the verb now drops it, or the
-- wait passes defer_max (defer_expired) or the deadline (ttl_expired). A carrier that
-- ends without being sent takes the messages it stood for with it, to the same state.
CREATE OR REPLACE FUNCTION gov.release_one(
    p_row        gov.deferred,
    p_now        timestamptz,
    OUT o_state      text,
    OUT o_outcome    text,
    OUT o_outbox_ids bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_msg     gov.messages%ROWTYPE;
    v_mc      gov.message_content%ROWTYPE;
    v_verdict record;
    v_next    timestamptz;
BEGIN
    o_outbox_ids := '{}';
    SELECT * INTO v_msg FROM gov.messages m WHERE m.user_id = p_row.user_id AND m.message_id = p_row.message_id;
    SELECT * INTO v_mc FROM gov.message_content c WHERE c.user_id = p_row.user_id AND c.message_id = p_row.message_id;
    IF v_msg.user_id IS NULL OR v_mc.user_id IS NULL THEN
        RAISE EXCEPTION 'held message % of user % has no decision or no content', p_row.message_id, p_row.user_id;
    END IF;

    IF v_mc.expires_at <= p_now THEN
        o_state := 'expired';
        o_outcome := 'ttl_expired';
    ELSE
        SELECT * INTO v_verdict
          FROM gov.decide_core(p_row.user_id, p_row.message_id, v_msg.tier, v_msg.topic, v_msg.campaign_id,
                               p_now, true) d;
        IF v_verdict.allowed THEN
            o_outbox_ids := gov.fan_out(p_row.user_id, p_row.message_id, p_now);
            IF p_row.stands_for > 1 THEN
                UPDATE gov.message_content c SET content = c.content || jsonb_build_object('count', p_row.stands_for)
                 WHERE c.user_id = p_row.user_id AND c.message_id = p_row.message_id;
                o_state := 'collapsed';
                o_outcome := 'summary';
            ELSE
                o_state := 'released';
                o_outcome := 'released';
            END IF;
            UPDATE gov.deferred d
               SET state = o_state, outcome = o_outcome, finished_at = p_now,
                   collapsed_into = CASE WHEN o_state = 'collapsed' THEN p_row.message_id END
             WHERE d.user_id = p_row.user_id AND d.id = p_row.id;
            RETURN;
        END IF;

        IF v_verdict.action = 'drop' OR v_verdict.retry_after_ms IS NULL THEN
            o_state := 'dropped';
            o_outcome := v_verdict.reason;
        ELSE
            v_next := gov.quiet_until(p_row.user_id, p_now + v_verdict.retry_after_ms * interval '1 millisecond');
            IF p_row.give_up_at IS NOT NULL AND v_next > p_row.give_up_at THEN
                o_state := 'expired';
                o_outcome := 'defer_expired';
            ELSIF v_next >= v_mc.expires_at THEN
                o_state := 'expired';
                o_outcome := 'ttl_expired';
            ELSE
                -- never due again in the same instant: every round moves a row forward
                v_next := greatest(v_next + gov.release_jitter(p_row.user_id, p_row.message_id || '#' || v_next::text),
                                   p_now + interval '1 millisecond');
                UPDATE gov.deferred d SET release_at = v_next
                 WHERE d.user_id = p_row.user_id AND d.id = p_row.id;
                o_state := 'waiting';
                o_outcome := v_verdict.reason;
                RETURN;
            END IF;
        END IF;
    END IF;

    UPDATE gov.deferred d SET state = o_state, outcome = o_outcome, finished_at = p_now
     WHERE d.user_id = p_row.user_id AND d.id = p_row.id;
    UPDATE gov.deferred d SET state = o_state, outcome = o_outcome, finished_at = p_now
     WHERE d.user_id = p_row.user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
       AND d.collapsed_into = p_row.message_id;
END;
$$;

-- Release what is due in one shard: take up to p_limit waiting rows whose time has come
-- (SKIP LOCKED, so concurrent releasers never take one message twice) and decide each
-- again now through the same decision (gov.release_one). Returns one row per row taken.
-- p_shard_key: the shard to release from (NULL on one server; 70_scale_out.sql).
--
-- Locks: a releaser holds the rows it took and takes each user's decision lock with a
-- try (pg_try_advisory_xact_lock), never a wait. A sender holds the user's lock and may
-- then wait for a row a releaser holds (a newcomer to a collapse group), so a releaser
-- that waited for a user lock could close a cycle; one that never waits cannot. A row
-- whose user is busy is returned as 'busy' and left due for the next round.
--
-- Failure stays with its row: each row is handled in its own subtransaction; an error
-- (a tier the policy no longer defines, content that no longer fits, anything raised)
-- rolls back that row's work only, and the row ends 'failed' with the error text, with
-- the messages a collapse carrier stood for. The rest of the batch goes on.
CREATE FUNCTION gov.release_due_v2(p_shard_key text, p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (user_id text, message_id text, state text, outcome text, outbox_ids bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    r_due     gov.deferred%ROWTYPE;
    v_done    record;
    v_error   text;
    v_handled integer := 0;
BEGIN
    -- No LIMIT in the query: a busy row must not take the place of one that can go, so
    -- the loop counts what it handled and stops at p_limit (rows are locked as fetched).
    FOR r_due IN EXECUTE format($q$
        SELECT d.*
          FROM %s d
         WHERE d.state = 'waiting' AND d.release_at <= $1
         ORDER BY d.release_at, d.id
           FOR UPDATE SKIP LOCKED
        $q$, gov.shard_relation('gov.deferred', p_shard_key)) USING v_now
    LOOP
        EXIT WHEN v_handled >= p_limit;
        IF NOT pg_try_advisory_xact_lock(hashtextextended(r_due.user_id, 0)) THEN
            RETURN QUERY SELECT r_due.user_id, r_due.message_id, 'busy'::text, NULL::text, '{}'::bigint[];
            CONTINUE;
        END IF;
        v_handled := v_handled + 1;
        BEGIN
            SELECT * INTO v_done FROM gov.release_one(r_due, v_now) r;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_error = MESSAGE_TEXT;
            v_error := left(v_error, 1000);
            UPDATE gov.deferred d SET state = 'failed', outcome = 'failed', error = v_error, finished_at = v_now
             WHERE d.user_id = r_due.user_id AND d.id = r_due.id;
            UPDATE gov.deferred d
               SET state = 'failed', outcome = 'failed', finished_at = v_now,
                   error = format('collapsed into %s, which failed: %s', r_due.message_id, v_error)
             WHERE d.user_id = r_due.user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
               AND d.collapsed_into = r_due.message_id;
            SELECT 'failed'::text AS o_state, 'failed'::text AS o_outcome, '{}'::bigint[] AS o_outbox_ids
              INTO v_done;
        END;
        RETURN QUERY SELECT r_due.user_id, r_due.message_id, v_done.o_state, v_done.o_outcome, v_done.o_outbox_ids;
    END LOOP;
END;
$$;

-- ---------------------------------------------------------------- pruning by primary key

-- Remove send rows no window can see any more (older than the longest window plus a
-- margin), at most p_batch rows per call, so each call is a short transaction that
-- never holds up decisions (they only read recent rows of their own user). Returns
-- how many rows went; call again until it returns 0.
CREATE OR REPLACE FUNCTION gov.prune_sends_v1(p_batch integer, p_margin interval, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_longest bigint;
    v_count   integer;
BEGIN
    SELECT coalesce(max(c.window_ms), 0) INTO v_longest FROM gov.caps c;
    -- by primary key, not ctid: on a Citus cluster the rows are in many shards
    DELETE FROM gov.sends s
     WHERE (s.user_id, s.budget, s.sent_at, s.message_id) IN (
            SELECT x.user_id, x.budget, x.sent_at, x.message_id FROM gov.sends x
             WHERE x.sent_at < v_now - v_longest * interval '1 millisecond' - p_margin
             LIMIT p_batch);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        -- what is older than this may have lost its send rows: the conservation check
        -- must not read a pruned message as "allowed without spending its budget"
        UPDATE gov.settings s
           SET pruned_before = greatest(s.pruned_before, v_now - v_longest * interval '1 millisecond' - p_margin);
    END IF;
    RETURN v_count;
END;
$$;

-- Remove analyst history (suppressions, delivery attempts) older than p_keep, in
-- batches like gov.prune_sends_v1.
CREATE OR REPLACE FUNCTION gov.prune_history_v1(p_batch integer, p_keep interval, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_cut   timestamptz := coalesce(p_now, clock_timestamp()) - p_keep;
    v_count integer;
    v_more  integer;
BEGIN
    DELETE FROM gov.push_suppressions ps
     WHERE (ps.user_id, ps.id) IN (SELECT x.user_id, x.id FROM gov.push_suppressions x
                                    WHERE x.created_at < v_cut LIMIT p_batch);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    DELETE FROM gov.delivery_attempts da
     WHERE (da.user_id, da.id) IN (SELECT x.user_id, x.id FROM gov.delivery_attempts x
                                    WHERE x.attempted_at < v_cut LIMIT p_batch);
    GET DIAGNOSTICS v_more = ROW_COUNT;
    RETURN v_count + v_more;
END;
$$;

-- ---------------------------------------------------------------- functions as PL/pgSQL

-- The four signals by trailing-window send volume, as the seed's weekly report, for the
-- window (p_now - p_since, p_now]. Definitions (docs/analysts.md):
--   sends        per user: the messages a push service accepted for them in the window
--                (one message on two of a user's browsers is one send)
--   bucket       least(sends, 8); users with no accepted send are not in any bucket; a
--                user who unsubscribed is bucketed by the sends of the p_since before it
--   subscribers  users in the bucket (with p_segment: who got a segment message)
--   accepted     their accepted messages (with p_segment: the segment's only)
--   displays, clicks, closes
--                of those messages, how many drew at least one such event by p_now
--   unsubscribes subscribers of the bucket with an unsubscribe event in the window
--   ctr = clicks / accepted, display_rate = displays / accepted,
--   unsubscribe_rate = unsubscribes / subscribers, close_to_click = closes / clicks
--   crossover    true on the first bucket b where, stepping up from the nearest lower
--                bucket present, unsubscribes per subscriber rise (Δ > 0) and rise by more
--                than clicks per subscriber do: Δ(unsubscribes/subscribers) >
--                Δ(clicks/subscribers). Both Δ are over the same step, so dividing them
--                by the sends it adds (per extra send) would not change the comparison.
-- p_segment is a campaign id prefix ('digest-' matches digest-2026-07-26): buckets still
-- count every send, since fatigue comes from the total, but the engagement columns
-- count only the segment's messages ("CTR within the same campaign type").
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (the query is the same; #variable_conflict lets its columns keep
-- the names of the function's output columns).
CREATE OR REPLACE FUNCTION gov.fatigue_report_v1(
    p_since   interval    DEFAULT '7 days',
    p_now     timestamptz DEFAULT NULL,
    p_segment text        DEFAULT NULL
) RETURNS TABLE (
    bucket           integer,
    subscribers      bigint,
    accepted         bigint,
    displays         bigint,
    clicks           bigint,
    closes           bigint,
    unsubscribes     bigint,
    ctr              numeric,
    unsubscribe_rate numeric,
    display_rate     numeric,
    close_to_click   numeric,
    crossover        boolean
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_end      timestamptz := coalesce(p_now, clock_timestamp());
    v_start    timestamptz := coalesce(p_now, clock_timestamp()) - p_since;
    v_accepted jsonb;
    v_reacted  jsonb;
    v_left     jsonb;
    v_segment  jsonb;
    v_buckets  jsonb;
BEGIN
    -- gov's tables are read first, one plain statement each (on a Citus cluster each runs
    -- on the shards; joined in one statement as CTEs, a cluster lost rows), then the
    -- buckets are counted from those rows, then the steps between the buckets.
    -- every acceptance a volume can count: a leaver's volume reaches p_since before their
    -- leaving, which is inside the window
    SELECT jsonb_agg(jsonb_build_array(e.user_id, e.message_id, e.created_at)) INTO v_accepted
      FROM gov.push_events e
     WHERE e.event = 'accepted' AND e.created_at > v_start - p_since AND e.created_at <= v_end;
    SELECT jsonb_agg(jsonb_build_array(r.user_id, r.message_id, r.displayed, r.clicked, r.closed)) INTO v_reacted
      FROM (SELECT e.user_id, e.message_id, bool_or(e.event = 'display') AS displayed,
                   bool_or(e.event = 'click') AS clicked, bool_or(e.event = 'close') AS closed
              FROM gov.push_events e
             WHERE e.event IN ('display', 'click', 'close') AND e.created_at <= v_end
             GROUP BY e.user_id, e.message_id) r;
    SELECT jsonb_agg(jsonb_build_array(e.user_id, e.created_at)) INTO v_left
      FROM gov.push_events e
     WHERE e.event = 'unsubscribe' AND e.created_at > v_start AND e.created_at <= v_end;
    IF p_segment IS NOT NULL THEN
        SELECT jsonb_agg(jsonb_build_array(m.user_id, m.message_id)) INTO v_segment
          FROM gov.messages m
         WHERE starts_with(m.campaign_id, p_segment);
    END IF;

        WITH accepted AS (
            SELECT x ->> 0 AS user_id, x ->> 1 AS message_id, (x ->> 2)::timestamptz AS created_at
              FROM jsonb_array_elements(coalesce(v_accepted, '[]')) x
        ),
        reacted AS (
            SELECT x ->> 0 AS user_id, x ->> 1 AS message_id, (x ->> 2)::boolean AS displayed,
                   (x ->> 3)::boolean AS clicked, (x ->> 4)::boolean AS closed
              FROM jsonb_array_elements(coalesce(v_reacted, '[]')) x
        ),
        left_events AS (
            SELECT x ->> 0 AS user_id, (x ->> 1)::timestamptz AS created_at
              FROM jsonb_array_elements(coalesce(v_left, '[]')) x
        ),
        in_segment AS (
            SELECT x ->> 0 AS user_id, x ->> 1 AS message_id
              FROM jsonb_array_elements(coalesce(v_segment, '[]')) x
        ),
        delivered AS (
            SELECT a.user_id, a.message_id
              FROM accepted a
             WHERE a.created_at > v_start
             GROUP BY a.user_id, a.message_id
        ),
        left_at AS (
            -- when a user unsubscribed in the window: their volume is what they had received
            -- in the p_since before that moment, not what the window holds (an early leaver's
            -- few sends before leaving would put them in a low bucket and fake a crossover)
            SELECT l.user_id, min(l.created_at) AS at FROM left_events l GROUP BY l.user_id
        ),
        volume AS (
            SELECT d.user_id, least(count(DISTINCT e.message_id), 8)::integer AS bucket
              FROM (SELECT DISTINCT d0.user_id FROM delivered d0) d
              LEFT JOIN left_at l ON l.user_id = d.user_id
              JOIN accepted e
                ON e.user_id = d.user_id
               AND e.created_at > coalesce(l.at, v_end) - p_since
               AND e.created_at <= coalesce(l.at, v_end)
             GROUP BY d.user_id
        ),
        reactions AS (
            SELECT d.user_id, d.message_id,
                   coalesce(bool_or(e.displayed), false) AS displayed,
                   coalesce(bool_or(e.clicked), false) AS clicked,
                   coalesce(bool_or(e.closed), false) AS closed
              FROM delivered d
              LEFT JOIN reacted e ON e.user_id = d.user_id AND e.message_id = d.message_id
             WHERE p_segment IS NULL
                OR EXISTS (SELECT 1 FROM in_segment m WHERE m.user_id = d.user_id AND m.message_id = d.message_id)
             GROUP BY d.user_id, d.message_id
        ),
        unsubscribed AS (
            SELECT DISTINCT l.user_id FROM left_events l
        ),
        per_user AS (
            SELECT r.user_id, v.bucket,
                   count(*) AS accepted,
                   count(*) FILTER (WHERE r.displayed) AS displays,
                   count(*) FILTER (WHERE r.clicked) AS clicks,
                   count(*) FILTER (WHERE r.closed) AS closes
              FROM reactions r JOIN volume v ON v.user_id = r.user_id
             GROUP BY r.user_id, v.bucket
        ),
        per_bucket AS (
            SELECT p.bucket,
                   count(*) AS subscribers,
                   sum(p.accepted)::bigint AS accepted,
                   sum(p.displays)::bigint AS displays,
                   sum(p.clicks)::bigint AS clicks,
                   sum(p.closes)::bigint AS closes,
                   count(u.user_id) AS unsubscribes
              FROM per_user p LEFT JOIN unsubscribed u ON u.user_id = p.user_id
             GROUP BY p.bucket
        )
        SELECT jsonb_agg(to_jsonb(pb)) INTO v_buckets FROM per_bucket pb;

    RETURN QUERY
        WITH per_bucket AS (
            SELECT * FROM jsonb_to_recordset(coalesce(v_buckets, '[]'))
                       AS (bucket integer, subscribers bigint, accepted bigint, displays bigint, clicks bigint,
                           closes bigint, unsubscribes bigint)
        ),
        steps AS (
            SELECT b.*,
                   b.clicks::numeric / b.subscribers
                       - lag(b.clicks::numeric / b.subscribers) OVER (ORDER BY b.bucket) AS d_clicks,
                   b.unsubscribes::numeric / b.subscribers
                       - lag(b.unsubscribes::numeric / b.subscribers) OVER (ORDER BY b.bucket) AS d_unsubscribes
              FROM per_bucket b
        ),
        marked AS (
            SELECT s.*, coalesce(s.d_unsubscribes > 0 AND s.d_unsubscribes > s.d_clicks, false) AS crosses
              FROM steps s
        )
        SELECT m.bucket, m.subscribers, m.accepted, m.displays, m.clicks, m.closes, m.unsubscribes,
               round(m.clicks::numeric / nullif(m.accepted, 0), 6),
               round(m.unsubscribes::numeric / m.subscribers, 6),
               round(m.displays::numeric / nullif(m.accepted, 0), 6),
               round(m.closes::numeric / nullif(m.clicks, 0), 6),
               m.crosses AND NOT coalesce(bool_or(m.crosses) OVER (ORDER BY m.bucket
                                                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                                          false)
          FROM marked m
         ORDER BY m.bucket;
END;
$$;

-- The marginal fatigue measure (docs/analysts.md): what the n-th send of a week costs and
-- earns, per send, overall and per segment, for the sends accepted in the window
-- (p_now - p_since, p_now]. Definitions:
--   send         a message a push service accepted for the user (the 'accepted' event;
--                one message on two browsers is one send), at its first acceptance
--   position     the user's sends accepted in the 7 days before it (0: the first of the
--                week; sends before the window count, so positions are right at its start)
--   clicked      the send drew a click (by p_now)
--   unsubscribed the user's first unsubscribe (by p_now) is charged to one send: the one
--                the event names if it is an accepted send at or before it, else the last
--                send before it. Sends after the charged one are left out (a user who left
--                can neither click nor leave again)
--   segment      gov.users.segment (through gov.user_segments, which analysts may read);
--                '(none)' for users without one; '*' is every user
--   groups       positions ascending, merged upward until a group holds p_min_sends
--                sends; a last group short of it joins the one before
--   rates        clicks / sends and unsubscribes / sends, each with its 95 % Wilson interval
--   difference_low  the one-sided 95 % lower bound of unsubscribe rate - click rate
--                (Newcombe's hybrid score interval from the two rates' 90 % Wilson bounds:
--                "unsubscribes exceed clicks" is a one-sided claim)
--   crossover    true on one group per segment: where the unsubscribe rate overtakes the
--                click rate for good. The intervals must say so: some group's difference_low
--                is above 0 (the first such group confirms it); the crossover is the first
--                group of the unbroken run of groups whose unsubscribe rate exceeds their
--                click rate that ends at the confirming group
--   verdict      per segment: 'crossover'; 'not enough data' when some group's unsubscribe
--                rate exceeds its click rate but no bound confirms it (more_sends: how many
--                more sends at the same rates would, for the nearest such group);
--                'not reached' when no group's does
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (#variable_conflict lets the columns keep the output columns' names).
CREATE OR REPLACE FUNCTION gov.fatigue_marginal_v1(
    p_since     interval    DEFAULT '28 days',
    p_now       timestamptz DEFAULT NULL,
    p_min_sends integer     DEFAULT 800
) RETURNS TABLE (
    segment          text,
    group_no         integer,
    position_from    integer,
    position_to      integer,
    sends            bigint,
    clicks           bigint,
    unsubscribes     bigint,
    click_rate       numeric,
    click_low        numeric,
    click_high       numeric,
    unsubscribe_rate numeric,
    unsubscribe_low  numeric,
    unsubscribe_high numeric,
    difference_low   numeric,
    crossover        boolean,
    verdict          text,
    more_sends       bigint
)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_positions jsonb;
BEGIN
    -- Two statements: the sends per position from the events first, then the merging walk
    -- (a recursive CTE) over those few rows alone; on a Citus cluster a recursive CTE may
    -- not share a statement with the distributed tables.
        WITH bounds AS (
            SELECT b.t_end - p_since AS t_start, b.t_end
              FROM (SELECT coalesce(p_now, clock_timestamp()) AS t_end) b
        ),
        -- (what reads gov's tables is MATERIALIZED: on a Citus cluster each runs on the
        -- shards and the rest on its few rows, with no subquery reaching back to a shard)
        accepted AS MATERIALIZED (
            SELECT e.user_id, e.message_id, min(e.created_at) AS at
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'accepted' AND e.created_at > w.t_start - interval '7 days' AND e.created_at <= w.t_end
             GROUP BY e.user_id, e.message_id
        ),
        numbered AS (
            SELECT a.user_id, a.message_id, a.at,
                   row_number() OVER (PARTITION BY a.user_id ORDER BY a.at, a.message_id) AS rn,
                   count(*) OVER (PARTITION BY a.user_id ORDER BY a.at
                                  RANGE BETWEEN UNBOUNDED PRECEDING AND interval '7 days' PRECEDING) AS aged
              FROM accepted a
        ),
        left_at AS MATERIALIZED (
            SELECT DISTINCT ON (e.user_id) e.user_id, e.message_id, e.created_at AS at
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'unsubscribe' AND e.created_at <= w.t_end
             ORDER BY e.user_id, e.created_at, e.id
        ),
        clicked AS MATERIALIZED (
            SELECT DISTINCT e.user_id, e.message_id
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'click' AND e.created_at <= w.t_end
        ),
        segments AS MATERIALIZED (
            SELECT u.user_id, u.segment FROM gov.user_segments u
        ),
        charged AS (  -- the unsubscribed message's number, else the last before leaving, else 0
            SELECT l.user_id,
                   coalesce(max(n.rn) FILTER (WHERE n.message_id = l.message_id), max(n.rn), 0) AS rn
              FROM left_at l
              LEFT JOIN numbered n ON n.user_id = l.user_id AND n.at <= l.at
             GROUP BY l.user_id
        ),
        counted AS (
            SELECT coalesce(u.segment, '(none)') AS segment,
                   (n.rn - 1 - n.aged)::integer AS position,
                   k.user_id IS NOT NULL AS clicked,
                   coalesce(n.rn = c.rn, false) AS unsubscribed
              FROM numbered n CROSS JOIN bounds w
              LEFT JOIN clicked k ON k.user_id = n.user_id AND k.message_id = n.message_id
              LEFT JOIN charged c ON c.user_id = n.user_id
              LEFT JOIN segments u ON u.user_id = n.user_id
             WHERE n.at > w.t_start AND (c.rn IS NULL OR n.rn <= c.rn)
        ),
        per_position AS (
            SELECT k.segment, k.position, k.sends, k.clicks, k.unsubscribes,
                   row_number() OVER (PARTITION BY k.segment ORDER BY k.position) AS ord
              FROM (SELECT coalesce(c.segment, '*') AS segment, c.position, count(*) AS sends,
                           count(*) FILTER (WHERE c.clicked) AS clicks,
                           count(*) FILTER (WHERE c.unsubscribed) AS unsubscribes
                      FROM counted c
                     GROUP BY GROUPING SETS ((c.segment, c.position), (c.position))) k
        )
        SELECT coalesce(jsonb_agg(to_jsonb(pp)), '[]') INTO v_positions FROM per_position pp;

    RETURN QUERY
        WITH RECURSIVE per_position AS (
            SELECT * FROM jsonb_to_recordset(v_positions)
                       AS (segment text, position integer, sends bigint, clicks bigint, unsubscribes bigint, ord bigint)
        ),
        walk AS (  -- merge upward: a group closes once it holds p_min_sends sends
            SELECT p.segment, p.ord, 1 AS group_no, p.sends AS held
              FROM per_position p WHERE p.ord = 1
            UNION ALL
            SELECT p.segment, p.ord,
                   w.group_no + CASE WHEN w.held >= p_min_sends THEN 1 ELSE 0 END,
                   CASE WHEN w.held >= p_min_sends THEN p.sends ELSE w.held + p.sends END
              FROM walk w JOIN per_position p ON p.segment = w.segment AND p.ord = w.ord + 1
        ),
        walked AS (
            SELECT p.*, w.group_no, max(w.group_no) OVER (PARTITION BY p.segment) AS last_group,
                   sum(p.sends) OVER (PARTITION BY p.segment, w.group_no) AS group_sends
              FROM per_position p JOIN walk w ON w.segment = p.segment AND w.ord = p.ord
        ),
        grouped AS (  -- a last group short of p_min_sends joins the one before
            SELECT g.segment, g.group_no::integer AS group_no, min(g.position) AS position_from,
                   max(g.position) AS position_to, sum(g.sends)::bigint AS sends,
                   sum(g.clicks)::bigint AS clicks, sum(g.unsubscribes)::bigint AS unsubscribes
              FROM (SELECT x.segment, x.position, x.sends, x.clicks, x.unsubscribes,
                           CASE WHEN x.group_no = x.last_group AND x.group_sends < p_min_sends AND x.last_group > 1
                                THEN x.group_no - 1 ELSE x.group_no END AS group_no
                      FROM walked x) g
             GROUP BY g.segment, g.group_no
        ),
        rated AS (
            SELECT g.*, g.clicks::double precision / g.sends AS pc, g.unsubscribes::double precision / g.sends AS pu,
                   ci.low AS c_low, ci.high AS c_high, ui.low AS u_low, ui.high AS u_high,
                   gov.difference_low_v1(g.unsubscribes, g.clicks, g.sends, 1.6448536269514722) AS d_low,
                   g.unsubscribes > g.clicks AS above
              FROM grouped g
             CROSS JOIN LATERAL gov.wilson_interval_v1(g.clicks, g.sends) ci
             CROSS JOIN LATERAL gov.wilson_interval_v1(g.unsubscribes, g.sends) ui
        ),
        tested AS (
            SELECT r.*,
                   CASE WHEN r.above AND NOT r.d_low > 0
                        THEN gov.sends_to_decide_v1(r.unsubscribes, r.clicks, r.sends, 1.6448536269514722) END AS short_by
              FROM rated r
        ),
        confirmed AS (
            SELECT t.*, min(t.group_no) FILTER (WHERE t.d_low > 0) OVER (PARTITION BY t.segment) AS first_sure
              FROM tested t
        ),
        located AS (
            SELECT c.*,
                   CASE WHEN c.first_sure IS NOT NULL THEN
                       coalesce(max(c.group_no) FILTER (WHERE NOT c.above AND c.group_no < c.first_sure)
                                    OVER (PARTITION BY c.segment), 0) + 1 END AS crossing,
                   bool_or(c.above) OVER (PARTITION BY c.segment) AS any_above,
                   min(c.short_by) OVER (PARTITION BY c.segment) AS fewest_short
              FROM confirmed c
        )
        SELECT l.segment, l.group_no, l.position_from, l.position_to, l.sends, l.clicks, l.unsubscribes,
               round(l.pc::numeric, 6), round(l.c_low::numeric, 6), round(l.c_high::numeric, 6),
               round(l.pu::numeric, 6), round(l.u_low::numeric, 6), round(l.u_high::numeric, 6),
               round(l.d_low::numeric, 6),
               coalesce(l.group_no = l.crossing, false),
               CASE WHEN l.crossing IS NOT NULL THEN 'crossover'
                    WHEN l.any_above THEN 'not enough data'
                    ELSE 'not reached' END,
               CASE WHEN l.crossing IS NULL AND l.any_above THEN l.fewest_short END
          FROM located l
         ORDER BY l.segment = '*' DESC, l.segment, l.group_no;
END;
$$;

-- Permission revocations, the expensive signal: users for whom push services accepted
-- at least p_min_accepted messages in the window while not one display beacon came
-- back. Acceptance stays healthy, nothing shows: the browser blocks or the OS mutes.
-- last_display_at (any time up to p_now) tells "stopped displaying" from "never did"
-- (a display beacon that was never instrumented makes everyone a suspect).
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (the query is the same; #variable_conflict lets its columns keep
-- the names of the function's output columns).
CREATE OR REPLACE FUNCTION gov.revocation_suspects_v1(
    p_since        interval    DEFAULT '7 days',
    p_min_accepted integer     DEFAULT 3,
    p_now          timestamptz DEFAULT NULL
) RETURNS TABLE (
    user_id            text,
    accepted           bigint,
    first_accepted_at  timestamptz,
    last_accepted_at   timestamptz,
    last_display_at    timestamptz,
    live_subscriptions bigint
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        WITH bounds AS (
            SELECT b.t_end - p_since AS t_start, b.t_end
              FROM (SELECT coalesce(p_now, clock_timestamp()) AS t_end) b
        ),
        delivered AS (
            SELECT e.user_id, count(DISTINCT e.message_id) AS accepted,
                   min(e.created_at) AS first_at, max(e.created_at) AS last_at
              FROM gov.push_events e CROSS JOIN bounds w
             WHERE e.event = 'accepted' AND e.created_at > w.t_start AND e.created_at <= w.t_end
             GROUP BY e.user_id
            HAVING count(DISTINCT e.message_id) >= p_min_accepted
        )
        SELECT d.user_id, d.accepted, d.first_at, d.last_at,
               (SELECT max(x.created_at) FROM gov.push_events x
                 WHERE x.user_id = d.user_id AND x.event = 'display' AND x.created_at <= w.t_end),
               (SELECT count(*) FROM gov.subscriptions s
                 WHERE s.user_id = d.user_id AND s.retired_at IS NULL)
          FROM delivered d CROSS JOIN bounds w
         WHERE NOT EXISTS (SELECT 1 FROM gov.push_events x
                            WHERE x.user_id = d.user_id AND x.event = 'display'
                              AND x.created_at > w.t_start AND x.created_at <= w.t_end)
         ORDER BY d.accepted DESC, d.user_id;
END;
$$;

-- Every message handed to gov ends in exactly one state. One row per message decided
-- in [p_since, p_until): its state, or 'INCONSISTENT: …' naming what is wrong.
--   delivered   allowed, and every outbox row delivered (or its endpoint gone)
--   in_flight   allowed, some outbox row still pending or being sent
--   failed      allowed, some outbox row failed or expired (the push service's answer kept)
--   no_endpoint allowed, but the user had no live endpoint
--   decided     allowed by gov.decide_v1 alone (no content: the caller delivers)
--   dropped     suppressed and dropped (with its rule), or dropped at release
--   held        waiting in gov.deferred
--   (held, then released: its state is then its delivery's, as for allowed)
--   expired     held, then expired (defer_expired or ttl_expired), with a group's members
--   collapsed   held, then collapsed into a named summary (or the group's current carrier)
--   failed      held, and the releaser failed on it (gov.deferred.error says why)
-- Send rows older than gov.settings.pruned_before may be gone (gov prune): a message
-- decided before then is not held to "allowed and spent its budget".
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (the query is the same; #variable_conflict lets its columns keep
-- the names of the function's output columns).
CREATE OR REPLACE FUNCTION gov.message_states_v1(p_since timestamptz, p_until timestamptz)
RETURNS TABLE (user_id text, message_id text, tier text, state text)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_map jsonb := gov.budget_map_v1();  -- looked up per message without a table
BEGIN
    RETURN QUERY
        WITH m AS (
            SELECT m.*, mc.user_id IS NOT NULL AS has_content,
                   d.state AS held_state, d.outcome AS held_outcome, d.collapsed_into,
                   (SELECT count(*) FROM gov.sends s
                     WHERE s.user_id = m.user_id AND s.message_id = m.message_id) AS spent,
                   (SELECT array_agg(DISTINCT o.state) FROM gov.outbox o
                     WHERE o.user_id = m.user_id AND o.message_id = m.message_id) AS outbox_states,
                   (SELECT count(*) FROM gov.push_suppressions ps
                     WHERE ps.user_id = m.user_id AND ps.message_id = m.message_id) AS suppressions,
                   t.exempt
              FROM gov.messages m
              LEFT JOIN gov.message_content mc ON mc.user_id = m.user_id AND mc.message_id = m.message_id
              LEFT JOIN gov.deferred d ON d.user_id = m.user_id AND d.message_id = m.message_id
              LEFT JOIN gov.tiers t ON t.tier = m.tier
             WHERE m.decided_at >= p_since AND m.decided_at < p_until
                OR (d.enqueued_at >= p_since AND d.enqueued_at < p_until)
        )
        SELECT m.user_id, m.message_id, m.tier,
               CASE
                 -- what must never be
                 WHEN m.exempt AND (m.spent > 0 OR m.suppressions > 0 OR NOT m.allowed)
                   THEN 'INCONSISTENT: P0 counted or suppressed'
                 WHEN m.allowed AND NOT coalesce(m.exempt, false) AND m.spent = 0
                      AND cardinality(gov.budgets_of(v_map, m.tier, m.topic)) > 0
                      AND m.decided_at >= coalesce((SELECT s.pruned_before FROM gov.settings s), '-infinity')
                   THEN 'INCONSISTENT: allowed without spending its budget'
                 WHEN NOT m.allowed AND m.spent > 0
                   THEN 'INCONSISTENT: suppressed but spent budget (a partial decision)'
                 WHEN NOT m.allowed AND m.outbox_states IS NOT NULL
                   THEN 'INCONSISTENT: suppressed but queued for delivery'
                 WHEN NOT m.allowed AND m.held_state IN ('released')
                   THEN 'INCONSISTENT: released but not allowed'
                 WHEN m.allowed AND m.held_state = 'waiting'
                   THEN 'INCONSISTENT: allowed and still held'
                 WHEN NOT m.allowed AND m.has_content AND m.action IN ('defer', 'collapse') AND m.held_state IS NULL
                   THEN 'INCONSISTENT: deferred but not in the queue (lost)'
                 WHEN m.held_state = 'collapsed' AND m.collapsed_into IS NULL
                   THEN 'INCONSISTENT: collapsed into no summary'
                 -- the states
                 WHEN m.held_state = 'waiting' THEN 'held'
                 WHEN m.held_state = 'expired' THEN 'expired'
                 WHEN m.held_state = 'dropped' THEN 'dropped'
                 WHEN m.held_state = 'failed' THEN 'failed'
                 WHEN m.held_state = 'collapsed' AND m.held_outcome = 'collapsed' THEN 'collapsed'
                 WHEN NOT m.allowed THEN 'dropped'
                 WHEN NOT m.has_content THEN 'decided'
                 WHEN m.outbox_states IS NULL THEN 'no_endpoint'
                 WHEN m.outbox_states && ARRAY['pending', 'sending'] THEN 'in_flight'
                 WHEN m.outbox_states && ARRAY['failed', 'expired'] THEN 'failed'
                 ELSE 'delivered'
               END
          FROM m;
END;
$$;

-- Everything `gov serve` exposes from the database, in one call per scrape: one row per
-- (metric, label set). Windowed counts (decisions, suppressions, delivery attempts) cover
-- the last p_window_ms by the database's clock, so a scrape stays bounded however long
-- the history grows; depths (outbox still to do, held messages waiting) are current and
-- read through the partial indexes on what is still to do.
--   decisions     gov.messages by their latest verdict: verdict (allow|drop|defer|collapse), reason
--   suppressions  gov.push_suppressions: tier, blocked_by, action
--   attempts      gov.delivery_attempts: status_class (2xx|4xx|5xx|…|none), outcome
--   outbox        gov.outbox rows still to do: state (pending|sending)
--   outbox_oldest_due_seconds  how long the oldest due pending row has waited (0: none)
--   held          gov.deferred rows waiting: tier, kind (defer|quiet|collapse)
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (the query is the same; #variable_conflict lets its columns keep
-- the names of the function's output columns).
CREATE OR REPLACE FUNCTION gov.metrics_v1(p_window_ms bigint DEFAULT 86400000)
RETURNS TABLE (metric text, labels jsonb, value double precision)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        WITH since AS (SELECT now() - p_window_ms * interval '1 millisecond' AS t)
        SELECT 'decisions',
               jsonb_build_object('verdict', CASE WHEN m.allowed THEN 'allow' ELSE m.action END,
                                  'reason', coalesce(m.reason, '')),
               count(*)::double precision
          FROM gov.messages m, since
         WHERE m.decided_at >= since.t
         GROUP BY 2
        UNION ALL
        SELECT 'suppressions',
               jsonb_build_object('tier', s.tier, 'blocked_by', s.blocked_by, 'action', s.action),
               count(*)::double precision
          FROM gov.push_suppressions s, since
         WHERE s.created_at >= since.t
         GROUP BY 2
        UNION ALL
        SELECT 'attempts',
               jsonb_build_object('status_class', CASE WHEN a.status IS NULL THEN 'none'
                                                       ELSE (a.status / 100)::text || 'xx' END,
                                  'outcome', a.outcome),
               count(*)::double precision
          FROM gov.delivery_attempts a, since
         WHERE a.attempted_at >= since.t
         GROUP BY 2
        UNION ALL
        SELECT 'outbox', jsonb_build_object('state', o.state), count(*)::double precision
          FROM gov.outbox o
         WHERE o.state IN ('pending', 'sending')
         GROUP BY o.state
        UNION ALL
        SELECT 'outbox_oldest_due_seconds', '{}'::jsonb,
               coalesce(extract(epoch FROM now() - min(o.next_attempt_at)), 0)::double precision
          FROM gov.outbox o
         WHERE o.state IN ('pending', 'sending') AND o.state = 'pending' AND o.next_attempt_at <= now()
        UNION ALL
        SELECT 'held', jsonb_build_object('tier', d.tier, 'kind', d.kind), count(*)::double precision
          FROM gov.deferred d
         WHERE d.state = 'waiting'
         GROUP BY 2;
END;
$$;

-- ---------------------------------------------------------------- functions as PL/pgSQL

-- `gov segments refresh`: set gov.users.segment from the policy's [segments] rules, as
-- of p_now, for every user with a subscription (live or retired) or a decision, in one
-- statement (user rows are created as needed). With the rules in gov.settings:
--   engaged  a click (gov.push_events, event 'click') within segment_engaged_ms
--   dormant  no click within segment_dormant_ms, and known to gov at least that long
--            (first subscription or first decision, whichever came first): a user who
--            never clicked but subscribed 30+ days ago is dormant
--   casual   everyone else (a newcomer who has not clicked yet, say)
-- Only events and subscriptions up to p_now count, so a replay at an explicit clock
-- classifies as it would have then. A user whose segment the app set to a name of its
-- own (anything but engaged, casual, dormant) is left alone: the app owns that user's
-- segment until it sets it back to none (NULL). Returns per rule-based segment the
-- users now in it and how many of them changed.
-- PL/pgSQL in steps (classify, then upsert): on a Citus cluster a SQL function's parameters,
-- and a lateral join to a CTE, cannot be planned into a query on a distributed table.
CREATE OR REPLACE FUNCTION gov.refresh_segments_v1(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (segment text, users bigint, changed bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_rows jsonb;
BEGIN
    -- Classify first, then write: on a Citus cluster what reads gov's tables runs on the
    -- shards (MATERIALIZED), the classification on its rows, and the upsert per shard.
    WITH clock AS (
        SELECT coalesce(p_now, clock_timestamp()) AS t,
               coalesce((SELECT s.segment_engaged_ms FROM gov.settings s), 604800000) AS engaged_ms,
               coalesce((SELECT s.segment_dormant_ms FROM gov.settings s), 2592000000) AS dormant_ms
    ),
    known AS MATERIALIZED (
        SELECT k.user_id, min(k.since) AS since
          FROM (SELECT s.user_id, s.created_at AS since FROM gov.subscriptions s
                UNION ALL
                SELECT m.user_id, min(m.decided_at) FROM gov.messages m GROUP BY m.user_id) k
         CROSS JOIN clock
         WHERE k.since <= clock.t
         GROUP BY k.user_id
    ),
    last_click AS MATERIALIZED (
        SELECT e.user_id, max(e.created_at) AS at
          FROM gov.push_events e CROSS JOIN clock
         WHERE e.event = 'click' AND e.created_at <= clock.t
         GROUP BY e.user_id
    ),
    old AS MATERIALIZED (
        SELECT u.user_id, u.segment FROM gov.users u
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object('user_id', c.user_id, 'old_segment', c.old_segment,
                                                  'segment', c.segment)), '[]')
      INTO v_rows
      FROM (SELECT k.user_id, old.segment AS old_segment,
                   CASE WHEN lc.at > clock.t - clock.engaged_ms * interval '1 millisecond' THEN 'engaged'
                        WHEN coalesce(lc.at, k.since) <= clock.t - clock.dormant_ms * interval '1 millisecond'
                             THEN 'dormant'
                        ELSE 'casual' END AS segment
              FROM known k
             CROSS JOIN clock
              LEFT JOIN last_click lc ON lc.user_id = k.user_id
              LEFT JOIN old ON old.user_id = k.user_id
             WHERE old.segment IS NULL OR old.segment IN ('engaged', 'casual', 'dormant')) c;

    INSERT INTO gov.users AS u (user_id, segment)
    SELECT c.user_id, c.segment FROM jsonb_to_recordset(v_rows) AS c (user_id text, segment text)
    ON CONFLICT (user_id) DO UPDATE
       SET segment = excluded.segment,
           -- excluded.updated_at is the insert's default (clock_timestamp()): Citus admits
           -- no volatile call in DO UPDATE SET
           updated_at = CASE WHEN u.segment IS DISTINCT FROM excluded.segment
                             THEN excluded.updated_at ELSE u.updated_at END
     WHERE u.segment IS NULL OR u.segment IN ('engaged', 'casual', 'dormant');

    RETURN QUERY
    SELECT c.segment, count(*), count(*) FILTER (WHERE c.old_segment IS DISTINCT FROM c.segment)
      FROM jsonb_to_recordset(v_rows) AS c (user_id text, old_segment text, segment text)
     GROUP BY c.segment
     ORDER BY c.segment;
END;
$$;

-- ---------------------------------------------------------------- distributing on Citus

-- Distribute the schema on a Citus cluster (called by `gov db upgrade` after the
-- migrations; it changes only what is not distributed yet, so it runs after every
-- upgrade). Returns what it did, one line per table or function. Does nothing on a
-- server without Citus.
CREATE FUNCTION gov.distribute_v1() RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
    v_fn   regprocedure;
    v_arg  text;
    v_moved text[] := '{}';
BEGIN
    IF NOT gov.on_citus() THEN
        RETURN;
    END IF;
    -- the user tables carry triggers that write colocated rows (the accepted event, the
    -- user-cap ceiling); Citus runs them on the shards
    SET LOCAL citus.enable_unsafe_triggers = on;
    FOREACH v_name IN ARRAY ARRAY['gov.tiers', 'gov.tier_consumes', 'gov.caps', 'gov.settings',
                                  'gov.segment_caps', 'gov.compiled_rules', 'gov.policy_versions'] LOOP
        -- (a table with a foreign key to one made a reference table first is already a
        -- Citus table, a "local" one on the coordinator alone: it becomes a reference table too)
        IF NOT EXISTS (SELECT 1 FROM citus_tables t
                        WHERE t.table_name = v_name::regclass AND t.citus_table_type = 'reference') THEN
            PERFORM create_reference_table(v_name);
            v_moved := v_moved || v_name;
            RETURN NEXT v_name || ': reference table';
        END IF;
    END LOOP;
    -- parents before the tables whose foreign keys point at them
    FOREACH v_name IN ARRAY ARRAY['gov.users', 'gov.user_caps', 'gov.user_topic_optouts', 'gov.messages',
                                  'gov.sends', 'gov.push_suppressions', 'gov.deferred', 'gov.subscriptions',
                                  'gov.message_content', 'gov.outbox', 'gov.delivery_attempts',
                                  'gov.push_events'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = v_name::regclass) THEN
            IF v_name = 'gov.users' THEN
                PERFORM create_distributed_table(v_name, 'user_id');
            ELSE
                PERFORM create_distributed_table(v_name, 'user_id', colocate_with => 'gov.users');
            END IF;
            v_moved := v_moved || v_name;
            RETURN NEXT v_name || ': distributed by user_id';
        END IF;
    END LOOP;
    -- the rows now live in the shards; the coordinator's local copies go once no local
    -- table's foreign key points at them any more
    FOREACH v_name IN ARRAY v_moved LOOP
        PERFORM truncate_local_data_after_distributing_table(v_name);
    END LOOP;
    -- the functions that run whole on the worker holding their first argument's shard
    FOR v_fn, v_arg IN
        SELECT p.oid::regprocedure, p.proargnames[1]
          FROM pg_proc p
         WHERE p.pronamespace = 'gov'::regnamespace
           AND p.proname IN ('decide_v1', 'send_v1', 'claim_outbox_v3', 'release_due_v2', 'decide_many_v2',
                             'send_many_v2')
           AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                            WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid
                              AND o.distribution_argument_index IS NOT NULL)
    LOOP
        PERFORM create_distributed_function(v_fn, v_arg, colocate_with => 'gov.users');
        RETURN NEXT v_fn::text || ': delegated by ' || v_arg;
    END LOOP;
    -- On a worker a generic plan of the decision's statements cannot be routed to the
    -- user's shard ("could not create distributed plan"): Citus plans them per call.
    IF EXISTS (SELECT 1 FROM pg_proc p
                WHERE p.oid = 'gov.decide_core(text,text,text,text,text,timestamptz,boolean)'::regprocedure
                  AND p.proconfig IS NOT NULL) THEN
        ALTER FUNCTION gov.decide_core(text, text, text, text, text, timestamptz, boolean) RESET plan_cache_mode;
        RETURN NEXT 'gov.decide_core: planned per call';
    END IF;
    -- every other function on every node too: a delegated function calls them there.
    -- (Citus creates a new function on every node by itself, but not one created before
    -- the tables its signature names were distributed.)
    FOR v_fn IN
        SELECT p.oid::regprocedure
          FROM pg_proc p
         WHERE p.pronamespace = 'gov'::regnamespace
           AND NOT EXISTS (SELECT 1 FROM pg_dist_object o WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid)
    LOOP
        PERFORM create_distributed_function(v_fn);
        RETURN NEXT v_fn::text || ': on every node';
    END LOOP;
END;
$$;
