-- Migration 0011 down: no metrics read, no BRIN indexes.

DROP FUNCTION gov.metrics_v1(bigint);
DROP INDEX gov.delivery_attempts_attempted_brin;
DROP INDEX gov.push_suppressions_created_brin;
DROP INDEX gov.messages_decided_brin;
