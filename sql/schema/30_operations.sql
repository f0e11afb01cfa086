-- gov: campaigns in bulk, pruning, and the conservation check (issues #7, #8).

-- ---------------------------------------------------------------- campaigns in bulk

-- Decide one message for many users in one call and one transaction: the same
-- decision (gov.decide_core) per user, so the verdicts and suppression rows are those
-- one-by-one decisions would give, but one commit for the batch instead of one per
-- user. User locks are taken in user_id order, the order every batch uses, so two
-- batches never wait on each other in a cycle (a single send locks one user only).
-- Callers keep batches modest (gov.Governor.decide_many: 500): every user lock is held
-- until the batch commits, and they share the server's lock table.
CREATE FUNCTION gov.decide_many_v1(
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
    FOR r_user IN SELECT DISTINCT u AS id FROM unnest(p_user_ids) u ORDER BY 1 LOOP
        RETURN QUERY
        SELECT r_user.id, d.allowed, d.action, d.reason, d.used, d.cap, d.retry_after_ms, d.repeated
          FROM gov.decide_core(r_user.id, p_message_id, p_tier, p_topic, p_campaign_id, v_now, false) d;
    END LOOP;
END;
$$;

-- The same for sends: decide, store the content, fan out or hold, per user.
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
    FOR r_user IN SELECT DISTINCT u AS id FROM unnest(p_user_ids) u ORDER BY 1 LOOP
        RETURN QUERY
        SELECT r_user.id, s.allowed, s.action, s.reason, s.repeated, s.outbox_ids
          FROM gov.send_v1(r_user.id, p_message_id, p_tier, p_topic, p_campaign_id, p_content,
                           p_collapse_key, p_ttl_s, v_now) s;
    END LOOP;
END;
$$;

-- ---------------------------------------------------------------- pruning

-- Remove send rows no window can see any more (older than the longest window plus a
-- margin), at most p_batch rows per call, so each call is a short transaction that
-- never holds up decisions (they only read recent rows of their own user). Returns
-- how many rows went; call again until it returns 0.
CREATE FUNCTION gov.prune_sends_v1(p_batch integer, p_margin interval, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_longest bigint;
    v_count   integer;
BEGIN
    SELECT coalesce(max(c.window_ms), 0) INTO v_longest FROM gov.caps c;
    WITH doomed AS (
        SELECT s.ctid FROM gov.sends s
         WHERE s.sent_at < v_now - v_longest * interval '1 millisecond' - p_margin
         LIMIT p_batch
    )
    DELETE FROM gov.sends s USING doomed WHERE s.ctid = doomed.ctid;
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
CREATE FUNCTION gov.prune_history_v1(p_batch integer, p_keep interval, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_cut   timestamptz := coalesce(p_now, clock_timestamp()) - p_keep;
    v_count integer;
    v_more  integer;
BEGIN
    DELETE FROM gov.push_suppressions ps
     WHERE ps.id IN (SELECT x.id FROM gov.push_suppressions x WHERE x.created_at < v_cut LIMIT p_batch);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    DELETE FROM gov.delivery_attempts da
     WHERE da.id IN (SELECT x.id FROM gov.delivery_attempts x WHERE x.attempted_at < v_cut LIMIT p_batch);
    GET DIAGNOSTICS v_more = ROW_COUNT;
    RETURN v_count + v_more;
END;
$$;

-- ---------------------------------------------------------------- conservation

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
CREATE FUNCTION gov.message_states_v1(p_since timestamptz, p_until timestamptz)
RETURNS TABLE (user_id text, message_id text, tier text, state text)
LANGUAGE sql STABLE AS $$
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
      FROM m
$$;

-- ---------------------------------------------------------------- delivery outcomes in batches

-- One call and one commit for a runner's batch instead of one per message: a durable
-- commit is the largest single cost of a write (PERFORMANCE.md). Each element is
-- {"outbox_id", "claim_token", "origin", "outcome", "status", "retry_after_ms", "error"};
-- each is recorded exactly as gov.record_attempt_v2 would (fenced by its claim token:
-- 'stale' for a row this runner no longer holds), in outbox id order (the order claims
-- lock rows in, so two runners never wait on each other in a cycle).
CREATE FUNCTION gov.record_attempts_v2(
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
