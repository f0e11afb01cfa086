-- gov: running it. Pruning (gov prune), the conservation check (every message handed to
-- gov ends in exactly one state), the health checks behind `gov check`, and what
-- `gov serve` exposes at /metrics.

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
    -- a negative margin, or a moment at infinity or later than the database clock (which
    -- decisions are made at), would delete rows a window still reads
    IF p_margin IS NULL OR p_margin < interval '0' OR NOT isfinite(v_now) OR v_now > clock_timestamp() THEN
        RAISE EXCEPTION 'prune: the margin must not be negative and the moment must be finite and not later than'
            ' the database clock (margin %, at %)', p_margin, v_now USING ERRCODE = 'GV003';
    END IF;
    IF p_batch IS NULL OR p_batch < 0 THEN
        RAISE EXCEPTION 'prune: the batch must be a count of rows, not %', p_batch USING ERRCODE = 'GV003';
    END IF;
    -- the longest window any cap reads: the tiers', topics' and global ones, a segment's
    -- own windows (which may be longer than its tier's), and users' own caps
    SELECT greatest((SELECT coalesce(max(c.window_ms), 0) FROM gov.caps c),
                    (SELECT coalesce(max(sc.window_ms), 0) FROM gov.segment_caps sc),
                    (SELECT coalesce(max(uc.window_ms), 0) FROM gov.user_caps uc))
      INTO v_longest;
    -- by primary key, not ctid: on a Citus cluster the rows are in many shards
    DELETE FROM gov.sends s
     WHERE (s.user_id, s.budget, s.sent_at, s.message_id) IN (
            SELECT x.user_id, x.budget, x.sent_at, x.message_id FROM gov.sends x
             WHERE x.sent_at < v_now - v_longest * interval '1 millisecond' - p_margin
             LIMIT p_batch);
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
    IF p_keep IS NULL OR p_keep < interval '0' OR NOT isfinite(v_cut) OR p_now > clock_timestamp() THEN
        RAISE EXCEPTION 'prune: the history kept must not be negative and the moment must be finite and not later'
            ' than the database clock (keep %, at %)', p_keep, coalesce(p_now, clock_timestamp())
            USING ERRCODE = 'GV003';
    END IF;
    IF p_batch IS NULL OR p_batch < 0 THEN
        RAISE EXCEPTION 'prune: the batch must be a count of rows, not %', p_batch USING ERRCODE = 'GV003';
    END IF;
    DELETE FROM gov.push_suppressions ps
     WHERE (ps.user_id, ps.id) IN (SELECT x.user_id, x.id FROM gov.push_suppressions x
                                    WHERE x.created_at < v_cut LIMIT p_batch);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    DELETE FROM gov.delivery_attempts da
     WHERE (da.user_id, da.id) IN (SELECT x.user_id, x.id FROM gov.delivery_attempts x
                                    WHERE x.attempted_at < v_cut LIMIT p_batch);
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
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (the query is the same; #variable_conflict lets its columns keep
-- the names of the function's output columns).
CREATE FUNCTION gov.message_states_v1(p_since timestamptz, p_until timestamptz)
RETURNS TABLE (user_id text, message_id text, tier text, state text)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_map jsonb := gov.budget_map_v1();  -- looked up per message without a table
BEGIN
    RETURN QUERY
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
                      AND cardinality(gov.budgets_of(v_map, m.tier, m.topic)) > 0
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
          FROM m;
END;
$$;

-- ---------------------------------------------------------------- health (gov check)

-- One row per named check: ok, and a one-line detail an operator can act on. `gov
-- check` exits 1 when any row is not ok. Each check is one RETURN QUERY, in the order
-- they are reported; add a check as one more.
CREATE FUNCTION gov.health_v1(
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

-- ---------------------------------------------------------------- metrics (gov serve /metrics)

-- Everything `gov serve` exposes from the database, in one call per scrape: one row per
-- (metric, label set). Windowed counts (decisions, suppressions, delivery attempts) cover
-- the last p_window_ms by the database's clock, so a scrape stays bounded however long
-- the history grows; depths (outbox still to do, held messages waiting) are current and
-- read through the partial indexes on what is still to do.
--   decisions     gov.messages by their latest verdict: verdict (allow|drop|defer|collapse), reason
--   suppressions  gov.push_suppressions: tier, blocked_by, action
--   attempts      gov.delivery_attempts: status_class (2xx|4xx|5xx|…|none), outcome
--   outbox        gov.outbox rows still to do: state (pending|sending)
--   outbox_oldest_due_seconds  how long the oldest due pending row has waited (0: none)
--   held          gov.deferred rows waiting: tier, kind (defer|quiet|collapse)
-- PL/pgSQL, not SQL: Citus cannot plan a SQL function's parameters into a query on a
-- distributed table (the query is the same; #variable_conflict lets its columns keep
-- the names of the function's output columns).
CREATE FUNCTION gov.metrics_v1(p_window_ms bigint DEFAULT 86400000)
RETURNS TABLE (metric text, labels jsonb, value double precision)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        WITH since AS (SELECT now() - p_window_ms * interval '1 millisecond' AS t)
        SELECT 'decisions',
               jsonb_build_object('verdict', CASE WHEN m.allowed THEN 'allow' ELSE m.action END,
                                  'reason', coalesce(m.reason, '')),
               count(*)::double precision
          FROM gov.messages m, since
         WHERE m.decided_at >= since.t
         GROUP BY 2
        UNION ALL
        SELECT 'suppressions',
               jsonb_build_object('tier', s.tier, 'blocked_by', s.blocked_by, 'action', s.action),
               count(*)::double precision
          FROM gov.push_suppressions s, since
         WHERE s.created_at >= since.t
         GROUP BY 2
        UNION ALL
        SELECT 'attempts',
               jsonb_build_object('status_class', CASE WHEN a.status IS NULL THEN 'none'
                                                       ELSE (a.status / 100)::text || 'xx' END,
                                  'outcome', a.outcome),
               count(*)::double precision
          FROM gov.delivery_attempts a, since
         WHERE a.attempted_at >= since.t
         GROUP BY 2
        UNION ALL
        SELECT 'outbox', jsonb_build_object('state', o.state), count(*)::double precision
          FROM gov.outbox o
         WHERE o.state IN ('pending', 'sending')
         GROUP BY o.state
        UNION ALL
        SELECT 'outbox_oldest_due_seconds', '{}'::jsonb,
               coalesce(extract(epoch FROM now() - min(o.next_attempt_at)), 0)::double precision
          FROM gov.outbox o
         WHERE o.state IN ('pending', 'sending') AND o.state = 'pending' AND o.next_attempt_at <= now()
        UNION ALL
        SELECT 'held', jsonb_build_object('tier', d.tier, 'kind', d.kind), count(*)::double precision
          FROM gov.deferred d
         WHERE d.state = 'waiting'
         GROUP BY 2;
END;
$$;
