// The seeds' send path as an HTTP server, for `gov bench --http`: what gov serve is measured against.
//
// Seed 001's policy.js (TIER_POLICY, CONSUMES), governor.js (CHECK_AND_COMMIT, checkAndCommit)
// and send.js (one checkAndCommit per consumed tier, stop at the first refusal), behind the
// route its curl verification calls: POST /internal/send with {"userId","tier","id","title",…}.
// Kept as the seed wrote them; the differences, and why:
//
// * EVALSHA instead of EVAL: the script is loaded once (SCRIPT LOAD) and called by its SHA, as
//   any production client does (ioredis's defineCommand; it falls back to EVAL on NOSCRIPT).
//   Sending the script's text with every call would handicap the seed.
// * No delivery, no Step 4 suppression row: gov serve without a VAPID key does not deliver
//   either; it does write its suppression row (the seed's server is spared that work).
// * The bearer token, when SEED_API_TOKEN is set, is checked as gov serve checks its own
//   (constant time), so both servers do the same work per request. The seed has none.
// * The body is validated as little as the seed needs (strings where it reads them, a known
//   tier, a title); a malformed request is 400 {"error": …}, as gov's.
//
//   node server.js [port]            prints "listening <port>" once ready (port 0: any free one)
//   REDIS_URL=redis://127.0.0.1:PORT/0 (required: the bench's private redis-server)
"use strict";
const http = require("http");
const crypto = require("crypto");

const HOUR = 3600_000;
const DAY = 24 * HOUR;

// policy.js, verbatim
const TIER_POLICY = {
  P0: { exempt: true },                                       // transactional: never capped
  P1: { windows: [{ ms: DAY, cap: 6 }], onExceed: 'defer' },
  P2: { windows: [{ ms: DAY, cap: 2 }, { ms: 7 * DAY, cap: 5 }], onExceed: 'drop' },
  P3: { windows: [{ ms: 7 * DAY, cap: 1 }], onExceed: 'collapse' }
};

// A send in tier T also consumes budget in every tier below it.
const CONSUMES = { P0: ['P0'], P1: ['P1'], P2: ['P1', 'P2'], P3: ['P1', 'P2', 'P3'] };

// governor.js, verbatim
const CHECK_AND_COMMIT = `
local now = tonumber(ARGV[1])
local member = ARGV[2]
local n = (#KEYS)
for i = 1, n do
  local windowMs = tonumber(ARGV[2 + i])
  local cap = tonumber(ARGV[2 + n + i])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, now - windowMs)
  if redis.call('ZCARD', KEYS[i]) >= cap then
    return {0, i}
  end
end
for i = 1, n do
  local windowMs = tonumber(ARGV[2 + i])
  redis.call('ZADD', KEYS[i], now, member)
  redis.call('PEXPIRE', KEYS[i], windowMs)
end
return {1, 0}
`;

async function checkAndCommit(redis, userId, tier, messageId, policy) {
  if (policy.exempt) return { allowed: true, reason: 'exempt' };
  const keys = policy.windows.map((w) => `freq:${userId}:${tier}:${w.ms}`);
  const args = [Date.now(), messageId,
    ...policy.windows.map((w) => w.ms),
    ...policy.windows.map((w) => w.cap)];
  // the seed: redis.eval(CHECK_AND_COMMIT, keys.length, ...keys, ...args); by SHA here
  const [ok, blockedIndex] = await redis.checkAndCommit(keys.length, ...keys, ...args);
  return ok === 1
    ? { allowed: true }
    : { allowed: false, reason: `cap_${policy.windows[blockedIndex - 1].ms}ms` };
}

// send.js without webpush.sendNotification and without ctx.log.suppression (see above)
async function send(ctx, msg) {
  const policy = TIER_POLICY[msg.tier];

  for (const tier of CONSUMES[msg.tier]) {
    const verdict = await checkAndCommit(
      ctx.redis, msg.userId, tier, msg.id, TIER_POLICY[tier]
    );
    if (!verdict.allowed) {
      return { sent: false, action: policy.onExceed, reason: verdict.reason };
    }
  }
  return { sent: true };
}

// ---------------------------------------------------------------- the HTTP server

const MAX_BODY_BYTES = 64 * 1024; // gov serve's limit
// the token's SHA-256: two digests of equal length compare in constant time whatever was sent
const digest = (text) => crypto.createHash("sha256").update(text).digest();
const TOKEN = process.env.SEED_API_TOKEN ? digest(process.env.SEED_API_TOKEN.trim()) : null;

function answer(res, status, doc) {
  const body = JSON.stringify(doc);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
  res.end(body);
}

function authorised(req) {
  if (TOKEN === null) return true;
  const header = req.headers.authorization || "";
  const space = header.indexOf(" ");
  const scheme = space < 0 ? header : header.slice(0, space);
  const value = space < 0 ? "" : header.slice(space + 1).trim();
  // both compared, whatever the scheme: the time taken says nothing about the token
  const same = crypto.timingSafeEqual(digest(value), TOKEN);
  return same && scheme.toLowerCase() === "bearer";
}

function parse(raw) {
  let msg;
  try {
    msg = JSON.parse(raw);
  } catch (err) {
    return [null, `invalid JSON: ${err.message}`];
  }
  if (msg === null || typeof msg !== "object" || Array.isArray(msg)) return [null, "expected a JSON object"];
  for (const field of ["userId", "tier", "id", "title"]) {
    if (typeof msg[field] !== "string" || msg[field] === "") return [null, `${field} must be a non-empty string`];
  }
  if (!Object.hasOwn(TIER_POLICY, msg.tier)) return [null, `unknown tier ${JSON.stringify(msg.tier)}`];
  return [msg, null];
}

function main() {
  const port = Number(process.argv[2] || 0);
  if (!process.env.REDIS_URL) {
    process.stderr.write("REDIS_URL is not set\n");
    process.exit(2);
  }
  const Redis = require("ioredis");
  const redis = new Redis(process.env.REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 1 });
  redis.defineCommand("checkAndCommit", { lua: CHECK_AND_COMMIT });
  const ctx = { redis };

  const server = http.createServer((req, res) => {
    if (req.method !== "POST" || req.url !== "/internal/send") {
      answer(res, req.url === "/internal/send" ? 405 : 404, { error: "not found" });
      req.resume();
      return;
    }
    if (!authorised(req)) {
      answer(res, 401, { error: "missing or wrong bearer token" });
      req.resume();
      return;
    }
    const chunks = [];
    let size = 0;
    let refused = false;
    req.on("data", (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES && !refused) {
        refused = true;
        answer(res, 413, { error: `body is over the ${MAX_BODY_BYTES}-byte limit` });
      }
      if (!refused) chunks.push(chunk);
    });
    req.on("end", () => {
      if (refused) return;
      const [msg, problem] = parse(Buffer.concat(chunks).toString("utf8"));
      if (msg === null) {
        answer(res, 400, { error: problem });
        return;
      }
      send(ctx, msg).then(
        (verdict) => answer(res, 200, verdict),
        (err) => answer(res, 503, { error: `redis: ${err.message}` }),
      );
    });
  });
  // keep-alive for as long as the load client holds its connections
  server.keepAliveTimeout = 60000;
  server.headersTimeout = 65000;
  server.maxRequestsPerSocket = 0;

  const listen = () => server.listen(port, "127.0.0.1", () => {
    process.stdout.write(`listening ${server.address().port}\n`);
  });
  // connect and load the script before announcing the port: the first timed request pays neither
  redis.connect()
    .then(() => redis.script("LOAD", CHECK_AND_COMMIT))
    .then(listen, (err) => {
      process.stderr.write(`cannot reach redis at ${process.env.REDIS_URL}: ${err.message}\n`);
      process.exit(1);
    });
  const stop = () => {
    server.close();
    redis.disconnect();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main();
