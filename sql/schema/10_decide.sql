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
    CONSTRAINT deferred_kind_known CHECK (kind IN ('defer', 'quiet', 'collapse')),
    CONSTRAINT deferred_state_known CHECK (state IN ('waiting', 'released', 'expired', 'collapsed', 'dropped')),
    CONSTRAINT deferred_collapse_has_key CHECK (kind <> 'collapse' OR collapse_key IS NOT NULL),
    CONSTRAINT deferred_finished_when_done CHECK ((state = 'waiting') = (finished_at IS NULL)),
    CONSTRAINT deferred_one_row_per_message UNIQUE (user_id, message_id)
);
-- the releaser scans only what still waits, in release order
CREATE INDEX deferred_due ON gov.deferred (release_at) WHERE state = 'waiting';
CREATE INDEX deferred_collapse_group ON gov.deferred (user_id, collapse_key) WHERE state = 'waiting';

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
    v_open  timestamptz;
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
    v_open := (v_local::date + v_end) AT TIME ZONE v_tz;
    IF v_open <= p_at THEN
        v_open := (v_local::date + 1 + v_end) AT TIME ZONE v_tz;
    END IF;
    RETURN v_open;
END;
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
    v_tier    gov.tiers%ROWTYPE;
    v_planned timestamptz;
    v_give_up timestamptz;
    v_group   gov.deferred%ROWTYPE;
BEGIN
    SELECT * INTO v_tier FROM gov.tiers t WHERE t.tier = p_tier;
    v_kind := CASE WHEN p_reason = 'quiet_hours' THEN 'quiet' ELSE p_action END;
    IF v_kind NOT IN ('defer', 'quiet', 'collapse') OR (v_kind = 'collapse' AND p_collapse_key IS NULL)
       OR p_retry_ms IS NULL THEN
        o_action := 'drop';
        o_reason := p_reason;
        RETURN;
    END IF;

    -- The earliest moment that clears the blocking window and the user's quiet hours.
    v_planned := gov.quiet_until(p_user_id, p_now + p_retry_ms * interval '1 millisecond');
    IF v_kind = 'defer' THEN
        v_give_up := p_now + coalesce(v_tier.defer_max_ms, 21600000) * interval '1 millisecond';
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
        VALUES (p_user_id, p_message_id, p_tier, v_kind, p_collapse_key, p_reason, p_now,
                v_planned, v_planned, v_give_up, 'expired', o_reason, p_now);
        RETURN;
    END IF;

    IF v_kind = 'collapse' THEN
        -- join the group already waiting under this key: one release for all of them
        SELECT * INTO v_group FROM gov.deferred d
         WHERE d.user_id = p_user_id AND d.collapse_key = p_collapse_key AND d.state = 'waiting'
           AND d.kind = 'collapse'
         ORDER BY d.id LIMIT 1;
    END IF;
    o_action := v_kind;
    IF v_kind = 'quiet' THEN
        o_action := 'defer';
    END IF;
    o_reason := p_reason;
    o_release := coalesce(v_group.release_at, v_planned + gov.release_jitter(p_user_id, p_message_id));
    INSERT INTO gov.deferred (user_id, message_id, tier, kind, collapse_key, blocked_by, enqueued_at,
                              planned_at, release_at, give_up_at)
    VALUES (p_user_id, p_message_id, p_tier, v_kind, p_collapse_key, p_reason, p_now,
            v_planned, o_release, v_give_up);
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
    v_ids     bigint[];
    v_held    record;
BEGIN
    SELECT * INTO v_verdict
      FROM gov.decide_core(p_user_id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;

    IF v_verdict.repeated THEN
        RETURN QUERY SELECT v_verdict.allowed, v_verdict.action, v_verdict.reason, v_verdict.used,
                            v_verdict.cap, v_verdict.retry_after_ms, true, '{}'::bigint[];
        RETURN;
    END IF;

    SELECT coalesce(p_ttl_s, t.default_ttl_s) INTO v_ttl_s FROM gov.tiers t WHERE t.tier = p_tier;
    INSERT INTO gov.message_content (user_id, message_id, content, collapse_key, ttl_s, expires_at)
    VALUES (p_user_id, p_message_id, p_content, p_collapse_key, v_ttl_s, v_now + v_ttl_s * interval '1 second');

    IF v_verdict.allowed THEN
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
-- LOCKED, so concurrent releasers never take one message twice), in user order (so
-- two releasers never wait on each other's user locks in a cycle), and decide each
-- again now through the same decision. Allowed → outbox; still blocked → wait again
-- (or expire past defer_max); past the message's deadline → ttl_expired, not sent.
-- A collapse group is released as ONE summary: the newest message, carrying the
-- count; the others are marked collapsed into it. Returns one row per handled message.
CREATE FUNCTION gov.release_due_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (user_id text, message_id text, state text, outcome text, outbox_ids bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    r_due     record;
    v_row     gov.deferred%ROWTYPE;
    v_msg     gov.messages%ROWTYPE;
    v_mc      gov.message_content%ROWTYPE;
    v_verdict record;
    v_ids     bigint[];
    v_count   integer;
    v_next    timestamptz;
BEGIN
    FOR r_due IN
        SELECT d.id
          FROM gov.deferred d
         WHERE d.state = 'waiting' AND d.release_at <= v_now
         ORDER BY d.user_id, d.release_at, d.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    LOOP
        SELECT * INTO v_row FROM gov.deferred d WHERE d.id = r_due.id;
        CONTINUE WHEN v_row.state <> 'waiting';  -- collapsed into a summary earlier in this batch

        IF v_row.kind = 'collapse' THEN
            -- the group: lock every waiting row under the key; the newest speaks for all
            PERFORM 1 FROM gov.deferred d
              WHERE d.user_id = v_row.user_id AND d.collapse_key = v_row.collapse_key
                AND d.state = 'waiting' AND d.kind = 'collapse'
              FOR UPDATE;
            SELECT * INTO v_row FROM gov.deferred d
             WHERE d.user_id = v_row.user_id AND d.collapse_key = v_row.collapse_key
               AND d.state = 'waiting' AND d.kind = 'collapse'
             ORDER BY d.enqueued_at DESC, d.id DESC LIMIT 1;
        END IF;

        SELECT * INTO v_msg FROM gov.messages m WHERE m.user_id = v_row.user_id AND m.message_id = v_row.message_id;
        SELECT * INTO v_mc FROM gov.message_content c
         WHERE c.user_id = v_row.user_id AND c.message_id = v_row.message_id;

        IF v_mc.expires_at <= v_now THEN
            UPDATE gov.deferred d SET state = 'expired', outcome = 'ttl_expired', finished_at = v_now
             WHERE d.user_id = v_row.user_id AND d.state = 'waiting'
               AND (d.id = v_row.id OR (v_row.kind = 'collapse' AND d.kind = 'collapse'
                                        AND d.collapse_key = v_row.collapse_key));
            RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'expired'::text, 'ttl_expired'::text,
                                '{}'::bigint[];
            CONTINUE;
        END IF;

        SELECT * INTO v_verdict
          FROM gov.decide_core(v_row.user_id, v_row.message_id, v_msg.tier, v_msg.topic, v_msg.campaign_id,
                               v_now, true) d;

        IF v_verdict.allowed THEN
            v_ids := gov.fan_out(v_row.user_id, v_row.message_id, v_now);
            IF v_row.kind = 'collapse' THEN
                -- every held message of the group, the carrier too, is collapsed into the
                -- one summary, which goes out under the carrier's id with the count
                WITH c AS (
                    UPDATE gov.deferred d
                       SET state = 'collapsed', collapsed_into = v_row.message_id, finished_at = v_now,
                           outcome = CASE WHEN d.id = v_row.id THEN 'summary' ELSE 'collapsed' END
                     WHERE d.user_id = v_row.user_id AND d.collapse_key = v_row.collapse_key
                       AND d.state = 'waiting' AND d.kind = 'collapse'
                    RETURNING 1
                )
                SELECT count(*) INTO v_count FROM c;
                UPDATE gov.message_content c SET content = c.content || jsonb_build_object('count', v_count)
                 WHERE c.user_id = v_row.user_id AND c.message_id = v_row.message_id;
                RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'collapsed'::text, 'summary'::text, v_ids;
            ELSE
                UPDATE gov.deferred d SET state = 'released', outcome = 'released', finished_at = v_now
                 WHERE d.id = v_row.id;
                RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'released'::text, 'released'::text, v_ids;
            END IF;
            CONTINUE;
        END IF;

        -- Still blocked: wait again for the new window, unless that passes a limit.
        IF v_verdict.retry_after_ms IS NULL OR (v_row.kind = 'defer' AND v_verdict.action = 'drop') THEN
            v_next := NULL;
        ELSE
            v_next := gov.quiet_until(v_row.user_id, v_now + v_verdict.retry_after_ms * interval '1 millisecond');
        END IF;
        IF v_next IS NULL OR (v_row.kind <> 'collapse' AND v_verdict.action = 'drop') THEN
            UPDATE gov.deferred d SET state = 'dropped', outcome = v_verdict.reason, finished_at = v_now
             WHERE d.id = v_row.id;
            RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'dropped'::text, v_verdict.reason, '{}'::bigint[];
        ELSIF (v_row.give_up_at IS NOT NULL AND v_next > v_row.give_up_at) OR v_next >= v_mc.expires_at THEN
            UPDATE gov.deferred d
               SET state = 'expired', finished_at = v_now,
                   outcome = CASE WHEN v_next >= v_mc.expires_at THEN 'ttl_expired' ELSE 'defer_expired' END
             WHERE d.user_id = v_row.user_id AND d.state = 'waiting'
               AND (d.id = v_row.id OR (v_row.kind = 'collapse' AND d.kind = 'collapse'
                                        AND d.collapse_key = v_row.collapse_key));
            RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'expired'::text,
                                CASE WHEN v_next >= v_mc.expires_at THEN 'ttl_expired' ELSE 'defer_expired' END,
                                '{}'::bigint[];
        ELSE
            v_next := v_next + gov.release_jitter(v_row.user_id, v_row.message_id || '#' || v_now::text);
            UPDATE gov.deferred d SET release_at = v_next
             WHERE d.user_id = v_row.user_id AND d.state = 'waiting'
               AND (d.id = v_row.id OR (v_row.kind = 'collapse' AND d.kind = 'collapse'
                                        AND d.collapse_key = v_row.collapse_key));
            RETURN QUERY SELECT v_row.user_id, v_row.message_id, 'waiting'::text, v_verdict.reason, '{}'::bigint[];
        END IF;
    END LOOP;
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
