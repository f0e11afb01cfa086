-- Migration 0013, frozen once landed: segment caps. A policy may give a tier other windows
-- for the users of one segment ([tiers.P2.segments.dormant], gov.segment_caps); the
-- decision uses them for a user of that segment; the [segments] rules (gov.settings) and
-- gov.refresh_segments_v1 classify users as engaged, casual or dormant; a suppression
-- records the user's segment; the what-if replay and analysts' views follow. Never
-- edit; add a new migration.

-- A tier's windows for the users of one segment (`[tiers.P2.segments.dormant]`). For a
-- user whose segment (gov.users.segment) has rows here for a tier, these rows REPLACE
-- that tier's own windows in gov.caps; every other user gets the tier's own. A table of
-- its own rather than a segment column on gov.caps: gov.caps also holds topic and global
-- caps, which have no segment, and its readers (the user-cap guard, the what-if replay,
-- analysts) keep meaning exactly what they meant; the foreign key removes a tier's
-- segment windows with the tier. The exempt P0 is never capped, for a segment neither.
CREATE TABLE gov.segment_caps (
    tier      text    NOT NULL REFERENCES gov.tiers ON DELETE CASCADE,
    segment   text    NOT NULL,
    window_ms bigint  NOT NULL,
    cap       integer NOT NULL,
    PRIMARY KEY (tier, segment, window_ms),
    CONSTRAINT segment_caps_not_p0 CHECK (tier <> 'P0'),
    CONSTRAINT segment_caps_segment_name CHECK (segment ~ '^[a-z][a-z0-9_-]{0,31}$'),
    CONSTRAINT segment_caps_window_positive CHECK (window_ms > 0),
    CONSTRAINT segment_caps_cap_not_negative CHECK (cap >= 0)
);

ALTER TABLE gov.settings
    ADD COLUMN segment_engaged_ms bigint NOT NULL DEFAULT 604800000,
    ADD COLUMN segment_dormant_ms bigint NOT NULL DEFAULT 2592000000,
    ADD CONSTRAINT settings_segment_rules_ordered
        CHECK (segment_engaged_ms > 0 AND segment_dormant_ms >= segment_engaged_ms);

-- the user's segment when decided (NULL: none)
ALTER TABLE gov.push_suppressions ADD COLUMN segment text;

-- The highest default a user's own cap for (scope, window) can lower: the policy's cap
-- for that window (a tier's own, or the "*" topic cap), or, for a tier, the highest of
-- its segments' caps over that window; NULL when the policy has no such window. A user
-- cap is always applied as the least of it and the default in force, so it never raises
-- anything; this is what it is checked against when it is written.
CREATE FUNCTION gov.user_cap_ceiling(p_scope text, p_window_ms bigint) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT max(d.cap)
      FROM (SELECT c.cap FROM gov.caps c
             WHERE c.scope = p_scope AND c.window_ms = p_window_ms
               AND c.topic = CASE WHEN p_scope = 'topic' THEN '*' ELSE '' END
            UNION ALL
            SELECT sc.cap FROM gov.segment_caps sc
             WHERE sc.tier = p_scope AND sc.window_ms = p_window_ms) d
$$;

-- Refuse a user cap that would raise a default (invariant 6), naming the offender.
CREATE OR REPLACE FUNCTION gov.user_caps_only_lower() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_default integer;
BEGIN
    v_default := gov.user_cap_ceiling(NEW.scope, NEW.window_ms);
    IF v_default IS NULL THEN
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
CREATE FUNCTION gov.refresh_segments_v1(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (segment text, users bigint, changed bigint)
LANGUAGE sql AS $$
    WITH clock AS (
        SELECT coalesce(p_now, clock_timestamp()) AS t,
               coalesce((SELECT s.segment_engaged_ms FROM gov.settings s), 604800000) AS engaged_ms,
               coalesce((SELECT s.segment_dormant_ms FROM gov.settings s), 2592000000) AS dormant_ms
    ),
    known AS (
        SELECT k.user_id, min(k.since) AS since
          FROM (SELECT s.user_id, s.created_at AS since FROM gov.subscriptions s
                UNION ALL
                SELECT m.user_id, min(m.decided_at) FROM gov.messages m GROUP BY m.user_id) k
         CROSS JOIN clock
         WHERE k.since <= clock.t
         GROUP BY k.user_id
    ),
    classified AS (
        SELECT k.user_id, old.segment AS old_segment,
               CASE WHEN lc.at > clock.t - clock.engaged_ms * interval '1 millisecond' THEN 'engaged'
                    WHEN coalesce(lc.at, k.since) <= clock.t - clock.dormant_ms * interval '1 millisecond'
                         THEN 'dormant'
                    ELSE 'casual' END AS segment
          FROM known k
         CROSS JOIN clock
          LEFT JOIN LATERAL (SELECT max(e.created_at) AS at FROM gov.push_events e
                              WHERE e.user_id = k.user_id AND e.event = 'click'
                                AND e.created_at <= clock.t) lc ON true
          LEFT JOIN gov.users old ON old.user_id = k.user_id
         WHERE old.segment IS NULL OR old.segment IN ('engaged', 'casual', 'dormant')
    ),
    written AS (
        INSERT INTO gov.users AS u (user_id, segment)
        SELECT c.user_id, c.segment FROM classified c
        ON CONFLICT (user_id) DO UPDATE
           SET segment = excluded.segment,
               updated_at = CASE WHEN u.segment IS DISTINCT FROM excluded.segment
                                 THEN clock_timestamp() ELSE u.updated_at END
         WHERE u.segment IS NULL OR u.segment IN ('engaged', 'casual', 'dormant')
        RETURNING u.user_id, u.segment
    )
    SELECT w.segment, count(*), count(*) FILTER (WHERE c.old_segment IS DISTINCT FROM w.segment)
      FROM written w JOIN classified c ON c.user_id = w.user_id
     GROUP BY w.segment
     ORDER BY w.segment;
$$;

-- The decision itself, shared by a first decision (gov.decide_v1, gov.send_v1) and a
-- re-decision at release (p_release: the message was decided before and waited; it
-- is decided again now, its verdict updated, and no second suppression is logged).
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
    v_segment text;
    v_seg_key text;
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
        -- The user's segment, read under the user's lock: it chooses the windows of each
        -- consumed tier when the policy has that segment's (gov.segment_caps).
        SELECT u.segment INTO v_segment FROM gov.users u WHERE u.user_id = p_user_id;
        -- '' (no segment's name) for none: the rule query then has one shape for every
        -- user, and PostgreSQL keeps one cached plan for it instead of planning each call
        v_seg_key := coalesce(v_segment, '');
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
            -- A consumed tier's windows are the user's segment's when the policy gives
            -- that segment windows for the tier (gov.segment_caps), else the tier's own.
            -- A user's own cap over a window those segment windows lack still holds, on
            -- its own: segment windows never lift a user's own limit.
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
                           AND NOT EXISTS (SELECT 1 FROM gov.segment_caps s
                                            WHERE s.tier = tc.consumes AND s.segment = v_seg_key)
                        UNION ALL
                        SELECT tc.consumes, sc.window_ms, sc.cap,
                               'cap_' || sc.window_ms || 'ms', tc.consumes,
                               2, CASE WHEN tc.consumes = p_tier THEN -100
                                       ELSE -substr(tc.consumes, 2)::int END
                          FROM gov.tier_consumes tc
                          JOIN gov.segment_caps sc ON sc.tier = tc.consumes AND sc.segment = v_seg_key
                         WHERE tc.tier = p_tier
                        UNION ALL
                        SELECT tc.consumes, uo.window_ms, uo.cap,
                               'cap_' || uo.window_ms || 'ms', tc.consumes,
                               2, CASE WHEN tc.consumes = p_tier THEN -100
                                       ELSE -substr(tc.consumes, 2)::int END
                          FROM gov.tier_consumes tc
                          JOIN gov.user_caps uo ON uo.user_id = p_user_id AND uo.scope = tc.consumes
                         WHERE tc.tier = p_tier
                           AND EXISTS (SELECT 1 FROM gov.segment_caps s
                                        WHERE s.tier = tc.consumes AND s.segment = v_seg_key)
                           AND NOT EXISTS (SELECT 1 FROM gov.segment_caps s
                                            WHERE s.tier = tc.consumes AND s.segment = v_seg_key
                                              AND s.window_ms = uo.window_ms)
                           -- only a cap with a default to lower, as the guard admits
                           AND gov.user_cap_ceiling(uo.scope, uo.window_ms) IS NOT NULL
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
                                                   retry_after_ms, created_at, segment)
                VALUES (p_user_id, p_message_id, p_tier, v_rule, v_action, p_campaign_id, p_topic,
                        v_scope, v_used, v_cap, v_msg.retry_after_ms, v_now, v_segment);
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

-- Suppressions per UTC day, tier, user segment (as it was when decided; NULL: none) and
-- blocking rule: with segment caps, which segments the caps hold back, and by what.
CREATE VIEW gov.segment_suppressions_daily AS
SELECT (ps.created_at AT TIME ZONE 'UTC')::date AS day, ps.tier, ps.segment, ps.blocked_by,
       count(*) AS suppressed,
       count(DISTINCT ps.user_id) AS users
  FROM gov.push_suppressions ps
 GROUP BY (ps.created_at AT TIME ZONE 'UTC')::date, ps.tier, ps.segment, ps.blocked_by;

-- How many users each segment holds now (NULL: none), without naming anyone: gov.users
-- itself is not granted to analysts.
CREATE VIEW gov.segment_sizes AS
SELECT u.segment, count(*) AS users
  FROM gov.users u
 GROUP BY u.segment;

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
        -- the stand-ins start from each user's real history before the window
        INSERT INTO gov.sends (user_id, budget, sent_at, message_id)
        SELECT v_tag || s.user_id, s.budget, s.sent_at, s.message_id
          FROM gov.sends s
         WHERE s.user_id IN (SELECT DISTINCT u.uid FROM unnest(v_users) AS u(uid))
           AND s.sent_at <= v_from
           AND s.sent_at > v_from - (SELECT coalesce(max(w.window_ms), 0)
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
