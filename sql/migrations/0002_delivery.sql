-- Migration 0002, frozen: delivery (issue #3). Subscriptions, message content, the
-- outbox with a committed lease, delivery attempts, and gov.send_v1 (decide + fan-out
-- in one call). Never edit; add a new migration.

-- ---------------------------------------------------------------- tables

-- A user's push endpoints. Budgets belong to the user, not to these rows (invariant 5):
-- subscribing again never resets anything. A retired endpoint is kept, with when and why.
CREATE TABLE gov.subscriptions (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id        text        NOT NULL,
    endpoint       text        NOT NULL,
    p256dh         text        NOT NULL,
    auth           text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    retired_at     timestamptz,
    retired_reason text,
    CONSTRAINT subscriptions_retired_with_reason CHECK ((retired_at IS NULL) = (retired_reason IS NULL))
);
-- one live row per endpoint: a browser that resubscribes the same endpoint updates it
CREATE UNIQUE INDEX subscriptions_live_endpoint ON gov.subscriptions (endpoint) WHERE retired_at IS NULL;
CREATE INDEX subscriptions_user ON gov.subscriptions (user_id) WHERE retired_at IS NULL;

-- What a message says, kept for delivery now or at release later.
CREATE TABLE gov.message_content (
    user_id      text        NOT NULL,
    message_id   text        NOT NULL,
    content      jsonb       NOT NULL,
    collapse_key text,
    ttl_s        integer     NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (user_id, message_id),
    CONSTRAINT message_content_ttl_range CHECK (ttl_s BETWEEN 0 AND 2419200)
);

-- One row per (message, live endpoint), written in the decision's transaction.
-- Claimed with a committed lease (no transaction held across the HTTP call): a dead
-- worker's row is reclaimed when its lease runs out, so delivery is at least once.
CREATE TABLE gov.outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id         text        NOT NULL,
    message_id      text        NOT NULL,
    subscription_id bigint      NOT NULL REFERENCES gov.subscriptions,
    state           text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    lease_until     timestamptz,
    leased_by       text,
    last_status     integer,
    last_error      text,
    created_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    CONSTRAINT outbox_state_known CHECK (state IN ('pending', 'sending', 'delivered', 'failed', 'gone', 'expired')),
    CONSTRAINT outbox_lease_while_sending CHECK ((state = 'sending') = (lease_until IS NOT NULL)),
    CONSTRAINT outbox_one_row_per_endpoint UNIQUE (user_id, message_id, subscription_id)
);
-- the runner's claim scans only rows still to do
CREATE INDEX outbox_due ON gov.outbox (next_attempt_at) WHERE state IN ('pending', 'sending');

-- Every attempt's outcome, for operators and analysts.
CREATE TABLE gov.delivery_attempts (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_id       bigint      NOT NULL REFERENCES gov.outbox ON DELETE CASCADE,
    user_id         text        NOT NULL,
    message_id      text        NOT NULL,
    subscription_id bigint      NOT NULL,
    origin          text        NOT NULL,
    worker          text        NOT NULL,
    outcome         text        NOT NULL,
    status          integer,
    retry_after_ms  bigint,
    error           text,
    attempted_at    timestamptz NOT NULL,
    CONSTRAINT delivery_attempts_outcome_known
        CHECK (outcome IN ('accepted', 'gone', 'throttled', 'transient', 'rejected', 'unauthorized', 'expired'))
);
CREATE INDEX delivery_attempts_outbox ON gov.delivery_attempts (outbox_id);
CREATE INDEX delivery_attempts_origin_time ON gov.delivery_attempts (origin, attempted_at DESC);

-- ---------------------------------------------------------------- functions

-- Store a browser's subscription for a user (validated in Python before it gets here).
-- The same endpoint again updates its keys and owner; a retired one stays retired.
CREATE FUNCTION gov.subscribe_v1(p_user_id text, p_endpoint text, p_p256dh text, p_auth text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO gov.subscriptions (user_id, endpoint, p256dh, auth)
    VALUES (p_user_id, p_endpoint, p_p256dh, p_auth)
    ON CONFLICT (endpoint) WHERE retired_at IS NULL
    DO UPDATE SET user_id = excluded.user_id, p256dh = excluded.p256dh, auth = excluded.auth
    RETURNING id INTO v_id;
    RETURN v_id;
END;
$$;

-- The send: the decision and, when it allows, one outbox row per live endpoint of the
-- user, in one call and one transaction. The budget is spent once per message whatever
-- the endpoint count (the fan-out happens after the allow). A repeat fans out nothing.
CREATE FUNCTION gov.send_v1(
    p_user_id      text,
    p_message_id   text,
    p_tier         text,
    p_topic        text,
    p_campaign_id  text,
    p_content      jsonb,
    p_collapse_key text,
    p_ttl_s        integer,
    p_now          timestamptz DEFAULT NULL
) RETURNS TABLE (
    allowed        boolean,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    repeated       boolean,
    outbox_ids     bigint[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_verdict record;
    v_ttl_s   integer;
    v_ids     bigint[];
BEGIN
    SELECT * INTO v_verdict
      FROM gov.decide_v1(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, v_now) d;

    IF NOT v_verdict.repeated THEN
        SELECT coalesce(p_ttl_s, t.default_ttl_s) INTO v_ttl_s FROM gov.tiers t WHERE t.tier = p_tier;
        INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
        VALUES (p_user_id, p_message_id, p_content, p_collapse_key, v_ttl_s,
                v_now + v_ttl_s * interval '1 second');
        IF v_verdict.allowed THEN
            WITH fan AS (
                INSERT INTO gov.outbox (user_id, message_id, subscription_id, next_attempt_at, created_at)
                SELECT p_user_id, p_message_id, s.id, v_now, v_now
                  FROM gov.subscriptions s
                 WHERE s.user_id = p_user_id AND s.retired_at IS NULL
                 ORDER BY s.id
                RETURNING id
            )
            SELECT array_agg(id ORDER BY id) INTO v_ids FROM fan;
        END IF;
    END IF;

    RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                        v_verdict.cap, v_verdict.retry_after_ms, v_verdict.repeated,
                        coalesce(v_ids, '{}'::bigint[]);
END;
$$;

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
