// A Node.js service nobody here wrote, for triage's polyglot benchmark: the
// standard http module, each GET burning a calibrated amount of CPU (ROUNDS
// sha256 hashes) on Node's one thread.
//
//   node upstream.js PORT [ROUNDS]
'use strict';
const http = require('http');
const crypto = require('crypto');

const port = Number(process.argv[2]);
const rounds = Number(process.argv[3] || 10000);

const server = http.createServer((req, res) => {
  let h = Buffer.from('x');
  for (let i = 0; i < rounds; i++) {
    h = crypto.createHash('sha256').update(h).digest();
  }
  const body = h.toString('hex').slice(0, 16) + '\n';
  const headers = { 'Content-Type': 'text/plain', 'Content-Length': Buffer.byteLength(body) };
  const crit = req.headers['triage-criticality'];
  if (crit) headers['X-Served-Criticality'] = crit;
  res.writeHead(200, headers);
  res.end(body);
});
server.keepAliveTimeout = 65000;
server.maxConnections = 100000;
server.listen(port, '127.0.0.1');
