DROP FUNCTION gov.record_attempt_v1(bigint, text, text, text, integer, bigint, text, integer, bigint, bigint, timestamptz);
DROP FUNCTION gov.claim_outbox_v1(text, integer, bigint, timestamptz, bigint[]);
DROP FUNCTION gov.send_v1(text, text, text, text, text, jsonb, text, integer, timestamptz);
DROP FUNCTION gov.subscribe_v1(text, text, text, text);
DROP TABLE gov.delivery_attempts;
DROP TABLE gov.outbox;
DROP TABLE gov.message_content;
DROP TABLE gov.subscriptions;
