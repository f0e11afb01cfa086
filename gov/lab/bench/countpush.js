// A minimal push service for `gov bench --delivery`: answers every POST 201 and counts them.
// No verification and no decryption (the Python gov.testing.PushService does that, for the
// correctness pass); it exists so that the push service is not what a delivery bench measures.
//
//   node countpush.js [port]      prints "listening <port>" once ready
//   GET /count                    -> the number of POSTs answered so far, as text
//   anything else                 -> 201, keep-alive
"use strict";
const http = require("http");

let count = 0;
const server = http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/count") {
    res.writeHead(200, { "Content-Type": "text/plain", "Content-Length": String(String(count).length) });
    res.end(String(count));
    return;
  }
  req.on("data", () => {});
  req.on("end", () => {
    count += 1;
    res.writeHead(201, { "Content-Length": "0" });
    res.end();
  });
});
server.keepAliveTimeout = 60000;
server.headersTimeout = 65000;
server.maxRequestsPerSocket = 0;
server.listen(Number(process.argv[2] || 0), "127.0.0.1", () => {
  process.stdout.write(`listening ${server.address().port}\n`);
});
process.on("SIGTERM", () => process.exit(0));
