-- gov: the canonical schema is every file of sql/schema/ applied in name order. Migrations in
-- sql/migrations/ must produce exactly that
-- (tests/migration/test_migrations.py compares the catalogs).
--
-- Naming: p_ parameters, v_ locals, r_ loop records. Stable surface for users and
-- analysts: gov.decide_v1, gov.push_suppressions, the views. Everything else is internal.

CREATE SCHEMA IF NOT EXISTS gov;

-- ---------------------------------------------------------------- policy tables

-- One row per priority tier. P0 (exempt) is never checked nor recorded.
CREATE TABLE gov.tiers (
    tier          text    PRIMARY KEY,
    exempt        boolean NOT NULL DEFAULT false,
    on_exceed     text,
    defer_max_ms  bigint,
    default_ttl_s integer NOT NULL DEFAULT 86400,
    urgency       text    NOT NULL DEFAULT 'normal',
    CONSTRAINT tiers_name_form CHECK (tier ~ '^P[0-9]$'),
    CONSTRAINT tiers_verb_known CHECK (on_exceed IN ('drop', 'defer', 'collapse')),
    -- an exempt tier has no verb: it can never be suppressed
    CONSTRAINT tiers_exempt_has_no_verb CHECK (exempt = (on_exceed IS NULL)),
    CONSTRAINT tiers_defer_max_positive CHECK (defer_max_ms IS NULL OR defer_max_ms > 0),
    -- 2419200 s = 28 days: mirrors gov.message.MAX_TTL_S
    CONSTRAINT tiers_ttl_range CHECK (default_ttl_s BETWEEN 0 AND 2419200),
    CONSTRAINT tiers_urgency_known CHECK (urgency IN ('very-low', 'low', 'normal', 'high')),
    -- high wakes sleeping devices: transactional only (WEBPUSH.md rule 2)
    CONSTRAINT tiers_high_urgency_exempt_only CHECK (urgency <> 'high' OR exempt)
);

-- The cascade: a send in `tier` also spends the budget of `consumes`.
CREATE TABLE gov.tier_consumes (
    tier     text NOT NULL REFERENCES gov.tiers ON DELETE CASCADE,
    consumes text NOT NULL REFERENCES gov.tiers ON DELETE CASCADE,
    PRIMARY KEY (tier, consumes)
);

-- Caps, one row per rolling window. scope: a tier name, 'global', or 'topic'
-- (topic caps; `topic` = '*' applies to every topic that has no rows of its own).
CREATE TABLE gov.caps (
    scope     text    NOT NULL,
    topic     text    NOT NULL DEFAULT '',
    window_ms bigint  NOT NULL,
    cap       integer NOT NULL,
    PRIMARY KEY (scope, topic, window_ms),
    CONSTRAINT caps_scope_form CHECK (scope ~ '^P[0-9]$' OR scope IN ('global', 'topic')),
    CONSTRAINT caps_topic_only_for_topic_scope CHECK ((scope = 'topic') = (topic <> '')),
    CONSTRAINT caps_window_positive CHECK (window_ms > 0),
    CONSTRAINT caps_cap_not_negative CHECK (cap >= 0)
);

-- Policy-wide settings (one row).
CREATE TABLE gov.settings (
    id            boolean PRIMARY KEY DEFAULT true,
    quiet_start   time,
    quiet_end     time,
    jitter_ms     bigint  NOT NULL DEFAULT 0,
    -- set by gov.prune_sends_v1: send rows from before this may have been deleted
    pruned_before timestamptz,
    CONSTRAINT settings_single_row CHECK (id),
    CONSTRAINT settings_quiet_both_or_neither CHECK ((quiet_start IS NULL) = (quiet_end IS NULL)),
    CONSTRAINT settings_jitter_not_negative CHECK (jitter_ms >= 0)
);

-- Every applied policy, as the TOML text that was applied: the audit trail.
CREATE TABLE gov.policy_versions (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source     text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- ---------------------------------------------------------------- users

CREATE TABLE gov.users (
    user_id     text        PRIMARY KEY,
    time_zone   text,
    quiet_start time,
    quiet_end   time,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT users_quiet_both_or_neither CHECK ((quiet_start IS NULL) = (quiet_end IS NULL))
);

-- A user's own caps. They may only lower the default (trigger below): a user who
-- finds two a day too many gets a dial that is not the browser's Block button.
CREATE TABLE gov.user_caps (
    user_id   text    NOT NULL,
    scope     text    NOT NULL,
    window_ms bigint  NOT NULL,
    cap       integer NOT NULL,
    PRIMARY KEY (user_id, scope, window_ms),
    CONSTRAINT user_caps_scope_form CHECK (scope ~ '^P[0-9]$' OR scope IN ('global', 'topic')),
    CONSTRAINT user_caps_cap_not_negative CHECK (cap >= 0)
);

-- ---------------------------------------------------------------- decisions

-- One row per (user, message) ever decided: the idempotency key and the verdict a
-- repeat returns.
CREATE TABLE gov.messages (
    user_id        text        NOT NULL,
    message_id     text        NOT NULL,
    tier           text        NOT NULL,
    topic          text,
    campaign_id    text,
    allowed        boolean     NOT NULL,
    action         text,
    reason         text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    decided_at     timestamptz NOT NULL,
    PRIMARY KEY (user_id, message_id),
    CONSTRAINT messages_verdict_shape CHECK (allowed = (action IS NULL AND reason IS NULL))
);

-- One row per spent budget: budget is a tier name, 'global', or 'topic:<topic>'.
-- The primary key leads (user_id, budget, sent_at), so every window count is a range
-- scan on it whatever the history (PERFORMANCE.md: the index hazard).
CREATE TABLE gov.sends (
    user_id    text        NOT NULL,
    budget     text        NOT NULL,
    sent_at    timestamptz NOT NULL,
    message_id text        NOT NULL,
    PRIMARY KEY (user_id, budget, sent_at, message_id)
);

-- The seed's suppression log, plus the tier whose window blocked (reason names only
-- the window) and the count in it.
CREATE TABLE gov.push_suppressions (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id        text        NOT NULL,
    message_id     text        NOT NULL,
    tier           varchar(4)  NOT NULL,
    blocked_by     text        NOT NULL,
    action         varchar(10) NOT NULL,
    campaign_id    text,
    topic          text,
    blocked_scope  text,
    used           integer,
    cap            integer,
    retry_after_ms bigint,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT push_suppressions_action_known CHECK (action IN ('drop', 'defer', 'collapse'))
);
CREATE INDEX idx_suppressions_campaign ON gov.push_suppressions (campaign_id, blocked_by);
CREATE INDEX idx_suppressions_user_time ON gov.push_suppressions (user_id, created_at DESC);

-- ---------------------------------------------------------------- functions

-- Refuse a user cap that would raise a default (invariant 6), naming the offender.
CREATE FUNCTION gov.user_caps_only_lower() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_default integer;
BEGIN
    SELECT c.cap INTO v_default
      FROM gov.caps c
     WHERE c.scope = NEW.scope AND c.window_ms = NEW.window_ms
       AND c.topic = CASE WHEN NEW.scope = 'topic' THEN '*' ELSE '' END;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % : no default % cap over a % ms window to lower',
            NEW.user_id, NEW.scope, NEW.window_ms
            USING ERRCODE = 'GV002';
    END IF;
    IF NEW.cap > v_default THEN
        RAISE EXCEPTION 'user % : cap % for % over % ms is above the default %; a user''s own caps may only lower it',
            NEW.user_id, NEW.cap, NEW.scope, NEW.window_ms, v_default
            USING ERRCODE = 'GV002';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER user_caps_only_lower
    BEFORE INSERT OR UPDATE ON gov.user_caps
    FOR EACH ROW EXECUTE FUNCTION gov.user_caps_only_lower();

-- The decision itself (gov.decide_core, gov.decide_v1) lives in 10_decide.sql with the queue.

-- ================================================================ delivery (issue #3)

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
    -- 2419200 s = 28 days: mirrors gov.message.MAX_TTL_S
    CONSTRAINT message_content_ttl_range CHECK (ttl_s BETWEEN 0 AND 2419200)
);

-- One row per (message, live endpoint), written in the decision's transaction.
-- Claimed with a committed lease (no transaction held across the HTTP call): a dead
-- worker's row is reclaimed when its lease runs out, so delivery is at least once.
-- claim_token is the fencing token: every claim increments it, and an outcome is
-- recorded only with the token of the claim that still holds the row (invariant 12).
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
    claim_token     bigint      NOT NULL DEFAULT 0,
    CONSTRAINT outbox_state_known CHECK (state IN ('pending', 'sending', 'delivered', 'failed', 'gone', 'expired')),
    CONSTRAINT outbox_lease_while_sending CHECK ((state = 'sending') = (lease_until IS NOT NULL)),
    CONSTRAINT outbox_one_row_per_endpoint UNIQUE (user_id, message_id, subscription_id)
);
-- the runner's claim scans only rows still to do
CREATE INDEX outbox_due ON gov.outbox (next_attempt_at) WHERE state IN ('pending', 'sending');
-- a 404/410 ends the endpoint's other rows still to do at once
CREATE INDEX outbox_subscription_todo ON gov.outbox (subscription_id) WHERE state IN ('pending', 'sending');

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

-- gov.send_v1 (decide + fan-out + hold) lives in 10_decide.sql.

-- Claim due outbox rows for one worker: pending rows whose time has come, and rows
-- whose lease ran out (their worker died or overran). SKIP LOCKED lets runners claim
-- side by side without waiting on each other; the lease is committed, so no transaction
-- stays open across the HTTP call. Every claim increments the row's claim_token, the
-- fencing token gov.record_attempt_v2 requires: a runner whose lease ran out and whose
-- row was claimed again can no longer record anything for it. A row whose endpoint was
-- retired meanwhile (a 404/410 for another message) ends 'gone' here, unsent and not
-- returned. Content, message and tier are joined loosely, so a row whose content is
-- missing is returned (and failed by the runner) rather than claimed and lost.
-- p_ids restricts the claim to given rows (gov.send's immediate attempt).
CREATE FUNCTION gov.claim_outbox_v2(
    p_worker   text,
    p_limit    integer,
    p_lease_ms bigint,
    p_now      timestamptz DEFAULT NULL,
    p_ids      bigint[]    DEFAULT NULL
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
    RETURN QUERY
    WITH due AS (
        SELECT o.id, s.retired_at IS NOT NULL AS retired
          FROM gov.outbox o
          JOIN gov.subscriptions s ON s.id = o.subscription_id
         WHERE ((o.state = 'pending' AND o.next_attempt_at <= v_now)
             OR (o.state = 'sending' AND o.lease_until <= v_now))
           AND (p_ids IS NULL OR o.id = ANY (p_ids))
         ORDER BY o.next_attempt_at, o.id
         LIMIT p_limit
           FOR UPDATE OF o SKIP LOCKED
    ), claimed AS (
        UPDATE gov.outbox o
           SET state       = CASE WHEN due.retired THEN 'gone' ELSE 'sending' END,
               attempts    = o.attempts + CASE WHEN due.retired THEN 0 ELSE 1 END,
               claim_token = o.claim_token + 1,
               leased_by   = CASE WHEN due.retired THEN NULL ELSE p_worker END,
               lease_until = CASE WHEN due.retired THEN NULL
                                  ELSE v_now + p_lease_ms * interval '1 millisecond' END,
               finished_at = CASE WHEN due.retired THEN v_now ELSE o.finished_at END,
               last_error  = CASE WHEN due.retired THEN 'not sent: the endpoint was retired' ELSE o.last_error END
          FROM due
         WHERE o.id = due.id
        RETURNING o.*, due.retired
    )
    SELECT c.id, c.claim_token, c.user_id, c.message_id, m.tier, c.attempts, s.id, s.endpoint, s.p256dh, s.auth,
           mc.content, mc.collapse_key,
           greatest(0, floor(extract(epoch FROM mc.expires_at - v_now)))::integer,
           t.urgency
      FROM claimed c
      JOIN gov.subscriptions s ON s.id = c.subscription_id
      LEFT JOIN gov.messages m ON m.user_id = c.user_id AND m.message_id = c.message_id
      LEFT JOIN gov.message_content mc ON mc.user_id = c.user_id AND mc.message_id = c.message_id
      LEFT JOIN gov.tiers t ON t.tier = m.tier
     WHERE NOT c.retired
     ORDER BY c.id;
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
        RETURN 'stale';
    END IF;
    IF v_row.state <> 'sending' OR v_row.claim_token IS DISTINCT FROM p_claim_token THEN
        RETURN CASE WHEN v_row.state = 'gone' THEN 'gone' ELSE 'stale' END;
    END IF;

    IF p_outcome = 'released' THEN
        UPDATE gov.outbox
           SET state = 'pending', attempts = greatest(attempts - 1, 0), lease_until = NULL, leased_by = NULL
         WHERE id = p_outbox_id;
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
         WHERE s.id = v_row.subscription_id AND s.retired_at IS NULL;
        -- the endpoint's other rows still to do end now, unsent, whoever holds them (their
        -- holders' records are then fenced off); a row whose holder is recording it right
        -- now is skipped, not waited for: its next claim ends it, as the endpoint is retired
        UPDATE gov.outbox o
           SET state = 'gone', finished_at = v_now, lease_until = NULL, leased_by = NULL,
               last_status = p_status,
               last_error = 'not sent: the endpoint answered ' || coalesce(p_status::text, 'gone')
                            || ' to message ' || v_row.message_id
         WHERE o.id IN (SELECT x.id FROM gov.outbox x
                         WHERE x.subscription_id = v_row.subscription_id AND x.id <> p_outbox_id
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
     WHERE id = p_outbox_id;
    RETURN v_state;
END;
$$;
