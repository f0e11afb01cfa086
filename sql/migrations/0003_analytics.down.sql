-- Undo migration 0003 (analytics), in reverse order of creation.
DROP FUNCTION gov.whatif_v1(interval, timestamptz);
DROP FUNCTION gov.health_v1(timestamptz, interval);
DROP VIEW gov.suppressions_daily;
DROP VIEW gov.campaign_shortfall;
DROP VIEW gov.revocation_suspects;
DROP FUNCTION gov.revocation_suspects_v1(interval, integer, timestamptz);
DROP FUNCTION gov.fatigue_report_v1(interval, timestamptz, text);
DROP FUNCTION gov.record_event_v1(text, text, text, bigint, timestamptz);
DROP TRIGGER delivery_attempts_accepted_event ON gov.delivery_attempts;
DROP FUNCTION gov.push_events_from_attempt();
DROP TABLE gov.user_topic_optouts;
DROP TABLE gov.push_events;
DROP INDEX gov.delivery_attempts_auth_refused;
DROP INDEX gov.push_suppressions_p0;
