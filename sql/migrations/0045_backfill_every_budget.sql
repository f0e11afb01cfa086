-- Migration 0045: a policy change fills every budget's rows that gov remembers, not only
-- a new budget's. After `gov prune` (which keeps the longest window's rows) a policy that
-- made a window longer counted nothing of what the prune deleted: a 30-day cap of 3
-- allowed a 4th send. gov.backfill_sends_v1 now gives every allowed message within the
-- longest window the rows it lacks, in any budget; a message that has its row in a
-- budget keeps that one (ON CONFLICT: a row is at the decision or at the release,
-- which moves decided_at there). Signature unchanged (p_before kept, unread). As in sql/schema/ at this revision.

-- After a policy change, give every allowed message decided within the longest window
-- before p_now the rows it would have spent and has not, from gov.messages: a budget the
-- policy caps that was not written before then counts the sends gov remembers instead of
-- starting from nothing, and a budget whose window grew counts again what `gov prune`
-- deleted under the shorter one (an outside probe: a 30-day cap of 3 allowed a 4th send
-- after a prune). A message that has its row in a budget keeps that one. p_before
-- (gov.capped_budgets() under the previous policy) once limited this to new budgets; the
-- signature keeps it, unread.
-- Returns the rows written.
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
    ON CONFLICT DO NOTHING;  -- a row is at the decision, or at the release, which moved decided_at there
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
