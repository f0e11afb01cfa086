-- gov: the decision, quiet hours, the deferral queue and the releaser (issue #4).

-- ---------------------------------------------------------------- tables

-- A suppressed message that still has value waits here: deferred by its tier's verb
-- (kind 'defer'), held by quiet hours ('quiet'), or held to be collapsed into one
-- summary per collapse key ('collapse'). Every outcome stays as a row for analysts.
CREATE TABLE gov.deferred (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id       text        NOT NULL,
    message_id    text        NOT NULL,
    tier          text        NOT NULL,
    kind          text        NOT NULL,
    collapse_key  text,
    blocked_by    text        NOT NULL,
    enqueued_at   timestamptz NOT NULL,
    planned_at    timestamptz NOT NULL,
    release_at    timestamptz NOT NULL,
    give_up_at    timestamptz,
    state         text        NOT NULL DEFAULT 'waiting',
    outcome       text,
    collapsed_into text,
    finished_at   timestamptz,
    stands_for    integer     NOT NULL DEFAULT 1,
    error         text,
    CONSTRAINT deferred_kind_known CHECK (kind IN ('defer', 'quiet', 'collapse')),
    CONSTRAINT deferred_state_known
        CHECK (state IN ('waiting', 'released', 'expired', 'collapsed', 'dropped', 'failed')),
    CONSTRAINT deferred_collapse_has_key CHECK (kind <> 'collapse' OR collapse_key IS NOT NULL),
    CONSTRAINT deferred_finished_when_done CHECK ((state = 'waiting') = (finished_at IS NULL)),
    CONSTRAINT deferred_one_row_per_message UNIQUE (user_id, message_id),
    -- a carrier stands for itself and every message collapsed into it
    CONSTRAINT deferred_stands_for_positive CHECK (stands_for >= 1),
    -- a failed row says why (an operator reads it; gov check alarms on it)
    CONSTRAINT deferred_failed_says_why CHECK ((state = 'failed') = (error IS NOT NULL))
);
-- the releaser scans only what still waits, in release order
CREATE INDEX deferred_due ON gov.deferred (release_at) WHERE state = 'waiting';
-- a collapse group (user, key) has one waiting row, its carrier: the newest member
-- (older members are collapsed into it as soon as it arrives)
CREATE UNIQUE INDEX deferred_one_carrier ON gov.deferred (user_id, collapse_key)
    WHERE state = 'waiting' AND kind = 'collapse';

-- ---------------------------------------------------------------- quiet hours

-- The first moment at or after p_at outside the user's quiet hours (p_at itself when
-- the user has none). Quiet hours apply to users with a time zone: their own window,
-- else the policy's default. Computed in the user's zone by the database, so the
-- window opens at 08:00 local also on the days the clocks change.
CREATE FUNCTION gov.quiet_until(p_user_id text, p_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_tz    text;
    v_start time;
    v_end   time;
    v_local timestamp;
BEGIN
    SELECT u.time_zone, coalesce(u.quiet_start, s.quiet_start), coalesce(u.quiet_end, s.quiet_end)
      INTO v_tz, v_start, v_end
      FROM gov.users u
      LEFT JOIN gov.settings s ON true
     WHERE u.user_id = p_user_id AND u.time_zone IS NOT NULL;
    IF v_tz IS NULL OR v_start IS NULL THEN
        RETURN p_at;
    END IF;
    v_local := p_at AT TIME ZONE v_tz;
    IF v_start < v_end THEN
        IF NOT (v_local::time >= v_start AND v_local::time < v_end) THEN
            RETURN p_at;
        END IF;
    ELSIF NOT (v_local::time >= v_start OR v_local::time < v_end) THEN  -- the window spans midnight
        RETURN p_at;
    END IF;
    RETURN coalesce(gov.local_instant(v_local::date + v_end, v_tz, p_at),
                    gov.local_instant(v_local::date + 1 + v_end, v_tz, p_at));
END;
$$;

-- The earliest instant after p_after at which the wall clock in p_tz reads p_local, or
-- NULL. A local time in the hour repeated when the clocks go back names two instants,
-- and AT TIME ZONE gives the later one: the earlier one (30 or 60 minutes before, the
-- shifts zones use) is taken when it reads the same local time. A local time skipped
-- when the clocks go forward keeps AT TIME ZONE's answer.
CREATE FUNCTION gov.local_instant(p_local timestamp, p_tz text, p_after timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(c.at)
      FROM (SELECT (p_local AT TIME ZONE p_tz) - shift AS at, shift
              FROM unnest(ARRAY[interval '0', interval '30 minutes', interval '1 hour']) shift) c
     WHERE c.at > p_after
       AND (c.shift = interval '0' OR (c.at AT TIME ZONE p_tz) = p_local)
$$;

-- A bounded jitter, so held messages do not fire together; derived from the message
-- (not random()) so a simulation with a seed replays exactly.
CREATE FUNCTION gov.release_jitter(p_user_id text, p_message_id text) RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT (abs(hashtextextended(p_user_id || E'\x1f' || p_message_id, 7)) % greatest(s.jitter_ms, 1))
           * interval '1 millisecond'
      FROM gov.settings s
     WHERE s.jitter_ms > 0
    UNION ALL
    SELECT interval '0'
     LIMIT 1
$$;

-- ---------------------------------------------------------------- the decision

-- The decision itself, shared by a first decision (gov.decide_v1, gov.send_v1) and a
-- re-decision at release (p_release: the message was decided before and waited; it
-- is decided again now, its verdict updated, and no second suppression is logged).
CREATE FUNCTION gov.decide_core(
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
LANGUAGE plpgsql AS $$
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
        -- A topic the user opted out of (the preference centre) is dropped, whatever
        -- the verb and the hour: holding it through the night would only drop it later.
        IF p_topic IS NOT NULL AND EXISTS (SELECT 1 FROM gov.user_topic_optouts o
                                            WHERE o.user_id = p_user_id AND o.topic = p_topic) THEN
            v_rule := 'topic_opt_out';
            v_scope := 'topic';
            v_action := 'drop';
            v_free_at := NULL;
        ELSE
            -- Quiet hours first: whatever the tier's verb, a message that arrives inside
            -- them waits until they end. P0 (exempt) is never quieted.
            v_free_at := gov.quiet_until(p_user_id, v_now);
        END IF;
        IF v_rule IS NOT NULL THEN
            NULL;  -- opted out: decided above
        ELSIF v_free_at > v_now THEN
            v_rule := 'quiet_hours';
            v_scope := 'quiet_hours';
            v_action := 'defer';
        ELSE
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
                IF r_rule.cap = 0 THEN
                    v_free_at := NULL;  -- a cap of 0 never frees a slot
                END IF;
                v_rule := r_rule.rule_name;
                v_scope := r_rule.scope;
                v_cap := r_rule.cap;
                v_action := v_tier.on_exceed;
                EXIT;
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
                                                   retry_after_ms, created_at)
                VALUES (p_user_id, p_message_id, p_tier, v_rule, v_action, p_campaign_id, p_topic,
                        v_scope, v_used, v_cap, v_msg.retry_after_ms, v_now);
            END IF;
            RETURN QUERY SELECT false, v_action, v_rule, v_used, v_cap, v_msg.retry_after_ms, false;
            RETURN;
        END IF;

        -- Every rule passed: spend one slot in each budget.
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT p_user_id, tc.consumes, v_now, p_message_id
          FROM gov.tier_consumes tc WHERE tc.tier = p_tier
        UNION ALL
        SELECT p_user_id, 'topic:' || p_topic, v_now, p_message_id WHERE p_topic IS NOT NULL
        UNION ALL
        SELECT p_user_id, 'global', v_now, p_message_id;
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

-- The decision (stable surface): see gov.decide_core. Lock choice: a transaction-scoped
-- advisory lock on a 64-bit hash of the user id (hashtextextended; hashtext() collides,
-- WEBPUSH.md). Measured against a row lock on a gov.users row (INSERT … ON CONFLICT DO
-- NOTHING, then FOR UPDATE) with `gov bench --lock both --rounds 3`, 8 connections:
-- fresh 1,882 vs 1,823 and 1,906 vs 1,974 decisions/s, mixed 2,449 vs 2,347 and 1,931
-- vs 1,875 (advisory vs row, two runs): no difference above the noise, and both exact
-- in 50/50 rounds of the 20-way race. The advisory lock wins on what it does not do: it
-- needs no user row and writes no tuple per decision. docs/performance.md has the rest.
CREATE OR REPLACE FUNCTION gov.decide_v1(
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
LANGUAGE sql AS $$
    SELECT * FROM gov.decide_core(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, p_now, false);
$$;

-- ---------------------------------------------------------------- holding

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
CREATE FUNCTION gov.hold(
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
             WHERE d.id = v_carrier.id;
        END IF;
    END IF;
    INSERT INTO gov.deferred (user_id, message_id, tier, kind, collapse_key, blocked_by, enqueued_at,
                              planned_at, release_at, give_up_at, stands_for)
    VALUES (p_user_id, p_message_id, p_tier, v_kind, v_key, p_reason, p_now,
            v_planned, o_release, v_give_up, coalesce(v_carrier.stands_for, 0) + 1);
END;
$$;

-- The send: the decision and, when it allows, one outbox row per live endpoint of the
-- user, in one call and one transaction. The budget is spent once per message whatever
-- the endpoint count (the fan-out happens after the allow). A repeat fans out nothing.
-- A suppressed message is held by its verb (defer, collapse) or quiet hours, or dropped.
CREATE OR REPLACE FUNCTION gov.send_v1(
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
    v_verb    text;
    v_ids     bigint[];
    v_held    record;
BEGIN
    -- A TTL of 0 ("now or never") would be past its deadline before any runner could
    -- send it: refused, rather than allowed, counted and never delivered.
    IF p_ttl_s IS NOT NULL AND p_ttl_s < 1 THEN
        RAISE EXCEPTION 'ttl must be at least 1 second (message % of user %, ttl %)', p_message_id, p_user_id, p_ttl_s
            USING ERRCODE = 'GV001';
    END IF;
    SELECT * INTO v_verdict
      FROM gov.decide_core(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;

    IF v_verdict.repeated THEN
        RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                            v_verdict.cap, v_verdict.retry_after_ms, true, '{}'::bigint[];
        RETURN;
    END IF;

    SELECT coalesce(p_ttl_s, t.default_ttl_s), t.on_exceed INTO v_ttl_s, v_verb FROM gov.tiers t WHERE t.tier = p_tier;
    INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
    VALUES (p_user_id, p_message_id, p_content, p_collapse_key, v_ttl_s, v_now + v_ttl_s * interval '1 second');

    IF v_verdict.allowed THEN
        IF v_verb = 'collapse' THEN  -- only a collapse tier has groups: no probe for the others
            PERFORM gov.absorb_group(p_user_id, p_message_id, p_tier, p_collapse_key, v_now);
        END IF;
        v_ids := gov.fan_out(p_user_id, p_message_id, v_now);
    ELSE
        SELECT * INTO v_held
          FROM gov.hold(p_user_id, p_message_id, p_tier, p_collapse_key, v_verdict.action, v_verdict.reason,
                        v_verdict.retry_after_ms, v_now + v_ttl_s * interval '1 second', v_now);
        IF v_held.o_action IS DISTINCT FROM v_verdict.action OR v_held.o_reason IS DISTINCT FROM v_verdict.reason THEN
            -- what really happens to it (a collapse without a key, or a wait too long, is a drop)
            UPDATE gov.messages m SET action = v_held.o_action, reason = v_held.o_reason
             WHERE m.user_id = p_user_id AND m.message_id = p_message_id;
            UPDATE gov.push_suppressions ps SET action = v_held.o_action
             WHERE ps.user_id = p_user_id AND ps.message_id = p_message_id;
            v_verdict.action := v_held.o_action;
            v_verdict.reason := v_held.o_reason;
        END IF;
    END IF;

    RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                        v_verdict.cap, v_verdict.retry_after_ms, false, coalesce(v_ids, '{}'::bigint[]);
END;
$$;

-- A collapse tier's message that is allowed while a group of its key waits carries
-- that group: it goes out as the summary (its own, newest, content with data.count),
-- and the waiting carrier and everything it stood for are collapsed into it. Without
-- this the newcomer would take the slot the group waits for, and the group, decided
-- again after it, would wait a whole window more. Called by gov.send_v1 (the caller
-- holds the user's lock; a releaser holding the carrier never waits for that lock).
CREATE FUNCTION gov.absorb_group(
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
     WHERE d.id = v_carrier.id;
    UPDATE gov.message_content c SET content = c.content || jsonb_build_object('count', v_carrier.stands_for + 1)
     WHERE c.user_id = p_user_id AND c.message_id = p_message_id;
END;
$$;

-- One outbox row per live endpoint of the user, for an allowed message.
CREATE FUNCTION gov.fan_out(p_user_id text, p_message_id text, p_now timestamptz) RETURNS bigint[]
LANGUAGE sql AS $$
    WITH fan AS (
        INSERT INTO gov.outbox (user_id, message_id, subscription_id, next_attempt_at, created_at)
        SELECT p_user_id, p_message_id, s.id, p_now, p_now
          FROM gov.subscriptions s
         WHERE s.user_id = p_user_id AND s.retired_at IS NULL
         ORDER BY s.id
        RETURNING id
    )
    SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM fan;
$$;

-- ---------------------------------------------------------------- releasing

-- Release what is due: take up to p_limit waiting rows whose time has come (SKIP
-- LOCKED, so concurrent releasers never take one message twice) and decide each again
-- now through the same decision (gov.release_one). Returns one row per row taken.
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
CREATE FUNCTION gov.release_due_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
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
    FOR r_due IN
        SELECT d.*
          FROM gov.deferred d
         WHERE d.state = 'waiting' AND d.release_at <= v_now
         ORDER BY d.release_at, d.id
           FOR UPDATE SKIP LOCKED
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
             WHERE d.id = r_due.id;
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

-- One held row, decided again at p_now (the caller holds the row and the user's lock).
-- Past the message's deadline → expired (ttl_expired), not sent. Allowed → outbox: a
-- carrier that stands for several messages goes out as ONE summary, the newest
-- content with data.count = how many it stands for (its tag and Topic are the key's).
-- Still blocked → waits again for the new slot, unless the verb now drops it, or the
-- wait passes defer_max (defer_expired) or the deadline (ttl_expired). A carrier that
-- ends without being sent takes the messages it stood for with it, to the same state.
CREATE FUNCTION gov.release_one(
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
             WHERE d.id = p_row.id;
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
                UPDATE gov.deferred d
                   SET release_at = greatest(v_next + gov.release_jitter(p_row.user_id,
                                                                         p_row.message_id || '#' || v_next::text),
                                             p_now + interval '1 millisecond')
                 WHERE d.id = p_row.id;
                o_state := 'waiting';
                o_outcome := v_verdict.reason;
                RETURN;
            END IF;
        END IF;
    END IF;

    UPDATE gov.deferred d SET state = o_state, outcome = o_outcome, finished_at = p_now WHERE d.id = p_row.id;
    UPDATE gov.deferred d SET state = o_state, outcome = o_outcome, finished_at = p_now
     WHERE d.user_id = p_row.user_id AND d.state = 'collapsed' AND d.outcome = 'collapsed'
       AND d.collapsed_into = p_row.message_id;
END;
$$;

-- Deferral outcomes for analysts: per day held, tier, kind and state (with the reason).
CREATE VIEW gov.deferral_outcomes AS
SELECT date_trunc('day', d.enqueued_at AT TIME ZONE 'UTC')::date AS day,
       d.tier, d.kind, d.state, coalesce(d.outcome, 'waiting') AS outcome,
       count(*) AS messages,
       avg(extract(epoch FROM d.finished_at - d.enqueued_at))::numeric(12, 1) AS avg_wait_s
  FROM gov.deferred d
 GROUP BY 1, 2, 3, 4, 5;
