-- Migration 0045, undone.

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
