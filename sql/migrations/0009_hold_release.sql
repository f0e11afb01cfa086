-- Migration 0009, frozen: held messages that never stall and never vanish (issue 11).
-- Never edit; add a new migration.
--
-- Collapse compresses: a collapse group has one waiting row (its carrier, the newest
-- member, standing for every member); the releaser handles each row in its own
-- subtransaction and never waits for a user lock; a failed held message says why;
-- tiers a policy removes are retired explicitly; quiet hours end at the first of a
-- repeated local hour; a TTL of 0 is refused; pruning is remembered for conservation.

ALTER TABLE gov.deferred
    ADD COLUMN stands_for integer NOT NULL DEFAULT 1,
    ADD COLUMN error text;
ALTER TABLE gov.deferred DROP CONSTRAINT deferred_state_known;
ALTER TABLE gov.deferred
    ADD CONSTRAINT deferred_state_known
        CHECK (state IN ('waiting', 'released', 'expired', 'collapsed', 'dropped', 'failed')),
    ADD CONSTRAINT deferred_stands_for_positive CHECK (stands_for >= 1),
    ADD CONSTRAINT deferred_failed_says_why CHECK ((state = 'failed') = (error IS NOT NULL));

-- Groups held under the old rule (every member waiting) become one carrier each: the
-- newest member, standing for all; the others collapsed into it now.
WITH ranked AS (
    SELECT d.id, d.user_id, d.collapse_key,
           first_value(d.message_id) OVER w AS carrier,
           row_number() OVER w AS rn,
           count(*) OVER (PARTITION BY d.user_id, d.collapse_key) AS members
      FROM gov.deferred d
     WHERE d.state = 'waiting' AND d.kind = 'collapse'
    WINDOW w AS (PARTITION BY d.user_id, d.collapse_key ORDER BY d.enqueued_at DESC, d.id DESC)
)
UPDATE gov.deferred d
   SET stands_for = CASE WHEN r.rn = 1 THEN r.members ELSE d.stands_for END,
       state = CASE WHEN r.rn = 1 THEN 'waiting' ELSE 'collapsed' END,
       outcome = CASE WHEN r.rn = 1 THEN NULL ELSE 'collapsed' END,
       collapsed_into = CASE WHEN r.rn = 1 THEN NULL ELSE r.carrier END,
       finished_at = CASE WHEN r.rn = 1 THEN NULL ELSE clock_timestamp() END
  FROM ranked r
 WHERE d.id = r.id AND r.members > 1;

DROP INDEX gov.deferred_collapse_group;
-- a collapse group (user, key) has one waiting row, its carrier: the newest member
-- (older members are collapsed into it as soon as it arrives)
CREATE UNIQUE INDEX deferred_one_carrier ON gov.deferred (user_id, collapse_key)
    WHERE state = 'waiting' AND kind = 'collapse';

-- set by gov.prune_sends_v1: send rows from before this may have been deleted
ALTER TABLE gov.settings ADD COLUMN pruned_before timestamptz;

CREATE OR REPLACE FUNCTION gov.local_instant(p_local timestamp, p_tz text, p_after timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(c.at)
      FROM (SELECT (p_local AT TIME ZONE p_tz) - shift AS at, shift
              FROM unnest(ARRAY[interval '0', interval '30 minutes', interval '1 hour']) shift) c
     WHERE c.at > p_after
       AND (c.shift = interval '0' OR (c.at AT TIME ZONE p_tz) = p_local)
$$;

CREATE OR REPLACE FUNCTION gov.quiet_until(p_user_id text, p_at timestamptz) RETURNS timestamptz
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
             WHERE d.id = v_carrier.id;
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
     WHERE d.id = v_carrier.id;
    UPDATE gov.message_content c SET content = c.content || jsonb_build_object('count', v_carrier.stands_for + 1)
     WHERE c.user_id = p_user_id AND c.message_id = p_message_id;
END;
$$;


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

CREATE OR REPLACE FUNCTION gov.release_due_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION gov.prune_sends_v1(p_batch integer, p_margin interval, p_now timestamptz DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION gov.message_states_v1(p_since timestamptz, p_until timestamptz)
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

CREATE OR REPLACE FUNCTION gov.health_v1(
    p_now         timestamptz DEFAULT NULL,
    p_stuck_after interval    DEFAULT '15 minutes'
) RETURNS TABLE (check_name text, ok boolean, detail text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    -- p0_suppressions: an exempt tier is never checked (invariant 4), so any suppression
    -- of one, ever, means a misclassified message or a broken policy.
    -- P0 through its partial index; another exempt tier (none by default) through a join
    -- from gov.tiers, which reads no suppression at all when there is none.
    RETURN QUERY
    SELECT 'p0_suppressions'::text, count(*) = 0,
           CASE WHEN count(*) = 0 THEN 'no suppression of an exempt tier'
                ELSE format('%s suppression(s) of exempt tier(s) %s, latest message %s of user %s at %s',
                            count(*), string_agg(DISTINCT x.tier, ', '),
                            (array_agg(x.message_id ORDER BY x.created_at DESC, x.id DESC))[1],
                            (array_agg(x.user_id ORDER BY x.created_at DESC, x.id DESC))[1],
                            max(x.created_at))
           END
      FROM (SELECT ps.id, ps.user_id, ps.message_id, ps.tier, ps.created_at
              FROM gov.push_suppressions ps
             WHERE ps.tier = 'P0'
            UNION ALL
            SELECT ps.id, ps.user_id, ps.message_id, ps.tier, ps.created_at
              FROM gov.tiers t JOIN gov.push_suppressions ps ON ps.tier = t.tier
             WHERE t.exempt AND t.tier <> 'P0') x;

    -- outbox_stuck: a lease that ran out long ago and was never reclaimed means no
    -- runner (gov dispatch) is draining the outbox.
    RETURN QUERY
    SELECT 'outbox_stuck'::text, count(*) = 0,
           CASE WHEN count(*) = 0 THEN format('no lease expired more than %s ago', p_stuck_after)
                ELSE format('%s outbox row(s) stuck in sending, oldest lease ran out at %s (row %s): is gov dispatch running?',
                            count(*), min(o.lease_until),
                            (array_agg(o.id ORDER BY o.lease_until, o.id))[1])
           END
      FROM gov.outbox o
     WHERE o.state = 'sending' AND o.lease_until < v_now - p_stuck_after;

    -- push_auth: a push service answering 401/403 in the last hour refuses our VAPID
    -- key or subject: every message to that origin fails until someone fixes it.
    RETURN QUERY
    SELECT 'push_auth'::text, count(*) = 0,
           CASE WHEN count(*) = 0 THEN 'no 401/403 from a push service in the last hour'
                ELSE format('%s attempt(s) answered 401/403 in the last hour by %s: check the VAPID key and subject',
                            count(*), string_agg(DISTINCT da.origin, ', '))
           END
      FROM gov.delivery_attempts da
     WHERE da.status IN (401, 403)
       AND da.attempted_at > v_now - interval '1 hour' AND da.attempted_at <= v_now;

    -- deferred_overdue: held messages whose release time passed long ago mean no
    -- releaser (gov release, bin/gov-release from cron) is running.
    RETURN QUERY
    SELECT 'deferred_overdue'::text, count(*) = 0,
           CASE WHEN count(*) = 0 THEN format('no held message overdue by more than %s', p_stuck_after)
                ELSE format('%s held message(s) overdue, oldest due at %s (user %s, message %s): is gov release running?',
                            count(*), min(d.release_at),
                            (array_agg(d.user_id ORDER BY d.release_at, d.id))[1],
                            (array_agg(d.message_id ORDER BY d.release_at, d.id))[1])
           END
      FROM gov.deferred d
     WHERE d.state = 'waiting' AND d.release_at < v_now - p_stuck_after;

    -- held_failed: the releaser failed on a held message (a tier the policy no longer
    -- defines, content that no longer fits, …) in the last 24 hours: it will never be
    -- sent, and someone should know why.
    RETURN QUERY
    SELECT 'held_failed'::text, count(*) = 0,
           CASE WHEN count(*) = 0 THEN 'no held message failed in the last 24 hours'
                ELSE format('%s held message(s) failed in the last 24 hours, latest message %s of user %s: %s',
                            count(*),
                            (array_agg(d.message_id ORDER BY d.finished_at DESC, d.id DESC))[1],
                            (array_agg(d.user_id ORDER BY d.finished_at DESC, d.id DESC))[1],
                            (array_agg(d.error ORDER BY d.finished_at DESC, d.id DESC))[1])
           END
      FROM gov.deferred d
     WHERE d.state = 'failed' AND d.finished_at > v_now - interval '24 hours';

    -- outbox_failed: a delivery that ended failed in the last 24 hours (the push service
    -- refused the request, 400/413; attempts ran out; the payload could not be built;
    -- the endpoint may not be reached; its tier was removed): the row kept its reason.
    RETURN QUERY
    SELECT 'outbox_failed'::text, count(*) = 0,
           CASE WHEN count(*) = 0 THEN 'no delivery failed in the last 24 hours'
                ELSE format('%s delivery(ies) failed in the last 24 hours, latest message %s of user %s: %s',
                            count(*),
                            (array_agg(o.message_id ORDER BY o.finished_at DESC, o.id DESC))[1],
                            (array_agg(o.user_id ORDER BY o.finished_at DESC, o.id DESC))[1],
                            (array_agg(coalesce(o.last_error, 'status ' || o.last_status, 'no reason kept')
                                       ORDER BY o.finished_at DESC, o.id DESC))[1])
           END
      FROM gov.outbox o
     WHERE o.state = 'failed' AND o.finished_at > v_now - interval '24 hours' AND o.finished_at <= v_now;
END;
$$;

CREATE OR REPLACE FUNCTION gov.retire_tiers_v1(p_tiers text[], p_drop boolean, p_now timestamptz DEFAULT NULL)
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
