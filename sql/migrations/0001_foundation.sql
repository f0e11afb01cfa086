-- Migration 0001, frozen: the schema as issue #2 shipped it. Never edit; add a new migration.
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

-- The decision. One call per message, atomic: every window of every consumed tier,
-- the topic cap and the global cap pass and one gov.sends row per spent budget is
-- written; or nothing is spent and one push_suppressions row says why.
--
-- Lock choice: a transaction-scoped advisory lock on a 64-bit hash of the user id
-- (hashtextextended; hashtext() collides, WEBPUSH.md). Measured against a row lock
-- on a per-user row (INSERT … ON CONFLICT, SELECT … FOR UPDATE) with
-- bench/lock_choice.sql (docs/performance.md): see the figures there. The advisory
-- lock needs no row to exist, writes no tuple (a row lock on a hot user dirties its
-- row on every decision), and is released by commit or rollback like a row lock.
CREATE FUNCTION gov.decide_v1(
    p_user_id     text,
    p_message_id  text,
    p_tier        text,
    p_topic       text        DEFAULT NULL,
    p_campaign_id text        DEFAULT NULL,
    p_now         timestamptz DEFAULT NULL
) RETURNS TABLE (
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
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_tier    gov.tiers%ROWTYPE;
    v_msg     gov.messages%ROWTYPE;
    r_rule    record;
    v_used    integer;
    v_free_at timestamptz;
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
    SELECT * INTO v_msg FROM gov.messages m
     WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
    IF FOUND THEN
        RETURN QUERY SELECT v_msg.allowed, v_msg.action, v_msg.reason, v_msg.used, v_msg.cap,
                            v_msg.retry_after_ms, true;
        RETURN;
    END IF;

    IF NOT v_tier.exempt THEN
        -- Most specific first: topic, then the consumed tiers (own tier first, then
        -- downward), then global. A user's own cap replaces a default only when lower.
        FOR r_rule IN
            SELECT x.budget, x.window_ms, least(x.cap, uc.cap) AS cap, x.rule_name, x.scope
              FROM (
                    SELECT 'topic:' || p_topic AS budget, c.window_ms, c.cap,
                           'topic_cap_' || c.window_ms || 'ms' AS rule_name, 'topic' AS scope,
                           1 AS ord1, 0 AS ord2
                      FROM gov.caps c
                     WHERE p_topic IS NOT NULL AND c.scope = 'topic'
                       AND c.topic = CASE WHEN EXISTS (SELECT 1 FROM gov.caps o
                                                        WHERE o.scope = 'topic' AND o.topic = p_topic)
                                          THEN p_topic ELSE '*' END
                    UNION ALL
                    SELECT tc.consumes, c.window_ms, c.cap,
                           'cap_' || c.window_ms || 'ms', tc.consumes,
                           2, CASE WHEN tc.consumes = p_tier THEN -100
                                   ELSE -substr(tc.consumes, 2)::int END
                      FROM gov.tier_consumes tc
                      JOIN gov.caps c ON c.scope = tc.consumes AND c.topic = ''
                     WHERE tc.tier = p_tier
                    UNION ALL
                    SELECT 'global', c.window_ms, c.cap,
                           'global_cap_' || c.window_ms || 'ms', 'global', 3, 0
                      FROM gov.caps c
                     WHERE c.scope = 'global'
                   ) x
              LEFT JOIN gov.user_caps uc
                     ON uc.user_id = p_user_id AND uc.scope = x.scope AND uc.window_ms = x.window_ms
             ORDER BY x.ord1, x.ord2, x.window_ms
        LOOP
            SELECT count(*) INTO v_used
              FROM gov.sends s
             WHERE s.user_id = p_user_id AND s.budget = r_rule.budget
               AND s.sent_at > v_now - r_rule.window_ms * interval '1 millisecond';
            CONTINUE WHEN v_used < r_rule.cap;

            -- Blocked. A slot frees when enough of the oldest rows leave the window
            -- for the count to drop below the cap (more than one when a cap was lowered).
            SELECT s.sent_at + r_rule.window_ms * interval '1 millisecond' INTO v_free_at
              FROM gov.sends s
             WHERE s.user_id = p_user_id AND s.budget = r_rule.budget
               AND s.sent_at > v_now - r_rule.window_ms * interval '1 millisecond'
             ORDER BY s.sent_at
            OFFSET v_used - r_rule.cap LIMIT 1;

            INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, action,
                                      reason, used, cap, retry_after_ms, decided_at)
            VALUES (p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, false, v_tier.on_exceed,
                    r_rule.rule_name, v_used, r_rule.cap,
                    CASE WHEN r_rule.cap > 0
                         THEN greatest(0, ceil(extract(epoch FROM v_free_at - v_now) * 1000))::bigint
                    END,
                    v_now)
            RETURNING * INTO v_msg;

            INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action,
                                               campaign_id, topic, blocked_scope, used, cap,
                                               retry_after_ms, created_at)
            VALUES (p_user_id, p_message_id, p_tier, r_rule.rule_name, v_tier.on_exceed,
                    p_campaign_id, p_topic, r_rule.scope, v_used, r_rule.cap,
                    v_msg.retry_after_ms, v_now);

            RETURN QUERY SELECT false, v_msg.action, v_msg.reason, v_used, r_rule.cap,
                                v_msg.retry_after_ms, false;
            RETURN;
        END LOOP;

        -- Every rule passed: spend one slot in each budget.
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT p_user_id, tc.consumes, v_now, p_message_id
          FROM gov.tier_consumes tc WHERE tc.tier = p_tier
        UNION ALL
        SELECT p_user_id, 'topic:' || p_topic, v_now, p_message_id WHERE p_topic IS NOT NULL
        UNION ALL
        SELECT p_user_id, 'global', v_now, p_message_id;
    END IF;

    INSERT INTO gov.messages (user_id, message_id, tier, topic, campaign_id, allowed, decided_at)
    VALUES (p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, true, v_now);

    RETURN QUERY SELECT true, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::bigint, false;
END;
$$;
