-- gov: the policy's guards and changes (its tables, tiers to policy_versions, are in
-- 00_tables.sql). A user's own caps may only lower a default; a policy that removes tiers
-- reports, or ends, what those tiers still hold (gov.retire_tiers_v1, `gov policy apply`).

-- ---------------------------------------------------------------- a user's own caps

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

-- ---------------------------------------------------------------- policy changes

-- Messages of tiers a new policy removes: per tier, how many are held (waiting in
-- gov.deferred) and how many are queued for delivery (outbox rows not yet finished).
-- With p_drop, they are ended now, logged like any suppression (blocked_by
-- 'tier_removed', action 'drop'): a held message ends dropped, a queued outbox row
-- ends failed with that reason, never sent. Runs inside `gov policy apply`'s
-- transaction, after the policy lock.
CREATE FUNCTION gov.retire_tiers_v1(p_tiers text[], p_drop boolean, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (tier text, held bigint, queued bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    RETURN QUERY
    SELECT t.tier,
           (SELECT count(*) FROM gov.deferred d WHERE d.tier = t.tier AND d.state = 'waiting'),
           (SELECT count(*) FROM gov.outbox o
              JOIN gov.messages m ON m.user_id = o.user_id AND m.message_id = o.message_id
             WHERE m.tier = t.tier AND o.state IN ('pending', 'sending'))
      FROM unnest(p_tiers) t(tier)
     ORDER BY 1;
    IF NOT p_drop THEN
        RETURN;
    END IF;

    WITH gone AS (
        UPDATE gov.deferred d
           SET state = 'dropped', outcome = 'tier_removed', finished_at = v_now
         WHERE d.tier = ANY (p_tiers) AND (d.state = 'waiting'
               OR (d.state = 'collapsed' AND d.outcome = 'collapsed'
                   AND EXISTS (SELECT 1 FROM gov.deferred c
                                WHERE c.user_id = d.user_id AND c.message_id = d.collapsed_into
                                  AND c.state = 'waiting')))
        RETURNING d.user_id, d.message_id
    ), verdict AS (
        UPDATE gov.messages m SET action = 'drop', reason = 'tier_removed'
          FROM gone WHERE m.user_id = gone.user_id AND m.message_id = gone.message_id
        RETURNING m.*
    )
    INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action, campaign_id, topic,
                                       blocked_scope, created_at)
    SELECT v.user_id, v.message_id, v.tier, 'tier_removed', 'drop', v.campaign_id, v.topic, 'policy', v_now
      FROM verdict v;

    WITH queued AS (
        UPDATE gov.outbox o
           SET state = 'failed', lease_until = NULL, last_error = 'tier_removed', finished_at = v_now
          FROM gov.messages m
         WHERE m.user_id = o.user_id AND m.message_id = o.message_id AND m.tier = ANY (p_tiers)
           AND o.state IN ('pending', 'sending')
        RETURNING m.user_id, m.message_id, m.tier, m.campaign_id, m.topic
    )
    INSERT INTO gov.push_suppressions (user_id, message_id, tier, blocked_by, action, campaign_id, topic,
                                       blocked_scope, created_at)
    SELECT DISTINCT q.user_id, q.message_id, q.tier, 'tier_removed', 'drop', q.campaign_id, q.topic, 'policy', v_now
      FROM queued q;
END;
$$;
