-- Named statements of a user's own settings: caps that lower the defaults, time zone,
-- quiet hours, topic opt-outs (the preference centre), and segments.
-- Format (gov/queries.py): one statement per "-- name: <name>" block; values are always
-- parameters (%(name)s), never text pasted in. Names are unique across the queries*.sql files.

-- name: ensure_user
INSERT INTO gov.users (user_id) VALUES (%(user_id)s) ON CONFLICT (user_id) DO NOTHING;

-- name: set_user_cap
INSERT INTO gov.user_caps (user_id, scope, window_ms, cap)
VALUES (%(user_id)s, %(scope)s, %(window_ms)s, %(cap)s)
ON CONFLICT (user_id, scope, window_ms) DO UPDATE SET cap = excluded.cap;

-- name: clear_user_cap
DELETE FROM gov.user_caps
 WHERE user_id = %(user_id)s AND scope = %(scope)s AND window_ms = %(window_ms)s;

-- name: user_caps
SELECT scope, window_ms, cap FROM gov.user_caps WHERE user_id = %(user_id)s
 ORDER BY scope, window_ms;

-- name: known_time_zone
SELECT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = %(tz)s);

-- name: set_user_time_zone
INSERT INTO gov.users (user_id, time_zone) VALUES (%(user_id)s, %(tz)s)
ON CONFLICT (user_id) DO UPDATE SET time_zone = excluded.time_zone, updated_at = excluded.updated_at;

-- name: set_user_quiet_hours
INSERT INTO gov.users (user_id, quiet_start, quiet_end) VALUES (%(user_id)s, %(start)s, %(end)s)
ON CONFLICT (user_id) DO UPDATE
   SET quiet_start = excluded.quiet_start, quiet_end = excluded.quiet_end, updated_at = excluded.updated_at;

-- name: user_settings
SELECT time_zone, quiet_start, quiet_end FROM gov.users WHERE user_id = %(user_id)s;

-- name: user_topic_optouts
SELECT topic FROM gov.user_topic_optouts WHERE user_id = %(user_id)s ORDER BY topic;

-- name: clear_user_topic_optouts
DELETE FROM gov.user_topic_optouts WHERE user_id = %(user_id)s;

-- name: add_user_topic_optout
INSERT INTO gov.user_topic_optouts (user_id, topic) VALUES (%(user_id)s, %(topic)s)
ON CONFLICT (user_id, topic) DO NOTHING;

-- name: set_user_segment
INSERT INTO gov.users (user_id, segment) VALUES (%(user_id)s, %(segment)s)
ON CONFLICT (user_id) DO UPDATE SET segment = excluded.segment, updated_at = excluded.updated_at;

-- name: user_segment
SELECT segment FROM gov.users WHERE user_id = %(user_id)s;

-- name: refresh_segments
SELECT segment, users, changed FROM gov.refresh_segments_v1(%(now)s);
