// A Node.js service nobody here wrote, for triage's polyglot benchmark: the
// standard http module, each GET burning a calibrated amount of CPU (ROUNDS
// iterations of PBKDF2-HMAC-SHA256, one call into OpenSSL) on Node's one
// thread.
//
//   node upstream.js PORT [ROUNDS]
//
// With LOAD_REPORT=1 it reports its load in every answer, as ORCA's
// endpoint-load-metrics header: its event loop's utilization over the
// last 100 ms (perf_hooks), the figure Node services shed by.
'use strict';
const http = require('http');
const crypto = require('crypto');
const { performance } = require('perf_hooks');

const port = Number(process.argv[2]);
const rounds = Number(process.argv[3] || 40000);
let report = '';
if (process.env.LOAD_REPORT === '1') {
  let last = performance.eventLoopUtilization();
  const tick = () => {
    const now = performance.eventLoopUtilization();
    report = 'TEXT application_utilization=' + performance.eventLoopUtilization(now, last).utilization.toFixed(3);
    last = now;
  };
  tick();
  setInterval(tick, 100).unref();
}

const server = http.createServer((req, res) => {
  const h = crypto.pbkdf2Sync('x', 'triage', rounds, 32, 'sha256');
  const body = h.toString('hex').slice(0, 16) + '\n';
  const headers = { 'Content-Type': 'text/plain', 'Content-Length': Buffer.byteLength(body) };
  const crit = req.headers['triage-criticality'];
  if (crit) headers['X-Served-Criticality'] = crit;
  if (report) headers['Endpoint-Load-Metrics'] = report;
  res.writeHead(200, headers);
  res.end(body);
});
server.keepAliveTimeout = 65000;
server.maxConnections = 100000;
server.listen(port, '127.0.0.1');
