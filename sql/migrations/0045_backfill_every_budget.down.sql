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
