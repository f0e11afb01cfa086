// The seeds' sender for `gov bench --delivery`: web-push builds every request (RFC 8291
// encryption and a VAPID JWT signed per message, as sendNotification does), and it is sent
// over a keep-alive agent with `inflight` requests at once. web-push itself only speaks
// https; the bench's push service is plain http on loopback (as gov's runner reaches it), so
// the request web-push built goes out through node:http: the same work, without TLS.
//
//   node websend.js config.json    (config: subscriptions, messages, inflight, payload,
//                                   vapid {subject, publicKey, privateKey}, ttl)
//   prints {"delivered": n, "failed": n, "seconds": s, "cpu_s": c} when done
"use strict";
const fs = require("fs");
const http = require("http");
const webpush = require("web-push");

const config = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const agent = new http.Agent({ keepAlive: true, maxSockets: config.inflight });
const started = process.hrtime.bigint();
let next = 0;
let delivered = 0;
let failed = 0;

function sendOne(i) {
  const subscription = config.subscriptions[i % config.subscriptions.length];
  const details = webpush.generateRequestDetails(subscription, config.payload, {
    TTL: config.ttl,
    vapidDetails: config.vapid,
  });
  const url = new URL(details.endpoint);
  return new Promise((resolve) => {
    const req = http.request(
      { hostname: url.hostname, port: url.port, path: url.pathname, method: details.method,
        headers: details.headers, agent },
      (res) => {
        res.resume();
        res.on("end", () => {
          if (res.statusCode >= 200 && res.statusCode < 300) delivered += 1; else failed += 1;
          resolve();
        });
      },
    );
    req.on("error", () => { failed += 1; resolve(); });
    req.end(details.body);
  });
}

async function lane() {
  while (next < config.messages) {
    const i = next;
    next += 1;
    await sendOne(i);
  }
}

Promise.all(Array.from({ length: config.inflight }, lane)).then(() => {
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const usage = process.cpuUsage();
  process.stdout.write(JSON.stringify({ delivered, failed, seconds, cpu_s: (usage.user + usage.system) / 1e6 }) + "\n");
  agent.destroy();
});
