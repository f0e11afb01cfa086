-- Migration 0049, undone: the outbox without its index of rows to do by id.
-- On a Citus cluster, over one connection per node: an upgrade (or a downgrade) runs its
-- migrations in one transaction, and an index made over parallel connections would make
-- Citus refuse every function command after it in that transaction. (A statement of its
-- own, EXECUTE: Citus sends the command's text to the workers, which must be one command.)
DO $$
BEGIN
    IF gov.on_citus() THEN
        SET LOCAL citus.multi_shard_modify_mode = 'sequential';
    END IF;
    EXECUTE $ddl$DROP INDEX gov.outbox_todo_by_id$ddl$;
END;
$$;
