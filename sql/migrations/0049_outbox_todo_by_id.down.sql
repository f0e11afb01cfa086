-- Migration 0049, undone: the outbox without its index of rows to do by id.
DROP INDEX gov.outbox_todo_by_id;
