-- Undo migration 0026: gov.shard_relation as migration 0016 made it.

CREATE OR REPLACE FUNCTION gov.shard_relation(p_table regclass, p_shard_key text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_shard text;
BEGIN
    IF NOT gov.distributed() THEN
        RETURN p_table::text;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = p_table AND p.partmethod = 'n') THEN
        -- a reference table: every node has its one shard
        SELECT shard_name(p_table, s.shardid) INTO v_shard FROM pg_dist_shard s WHERE s.logicalrelid = p_table;
    ELSE
        IF p_shard_key IS NULL THEN
            RAISE EXCEPTION 'on a Citus cluster % is read one shard at a time: give a shard key (gov.shard_keys_v1())',
                p_table USING ERRCODE = '22023';
        END IF;
        v_shard := shard_name(p_table, get_shard_id_for_distribution_column(p_table, p_shard_key));
    END IF;
    IF to_regclass(v_shard) IS NULL THEN
        RAISE EXCEPTION 'shard % of % is not on this node: call the function through the coordinator, '
                        'which delegates it to the worker that holds the shard', v_shard, p_table
            USING ERRCODE = '55000';
    END IF;
    RETURN v_shard;
END;
$$;
