// A gRPC service nobody here wrote, for triage's polyglot benchmark: Node
// with @grpc/grpc-js (npm ci in this directory), one unary method,
// /bench.Burn/Call, whose messages are raw bytes (no code generation: the
// benchmark's calls send an empty message), each call burning ROUNDS
// iterations of PBKDF2-HMAC-SHA256 (one call into OpenSSL) on Node's one
// thread.
//
//   node grpc-upstream.js PORT [ROUNDS]
'use strict';
const grpc = require('@grpc/grpc-js');
const crypto = require('crypto');

const port = Number(process.argv[2]);
const rounds = Number(process.argv[3] || 40000);
const raw = (b) => b;

const service = {
  Call: {
    path: '/bench.Burn/Call',
    requestStream: false,
    responseStream: false,
    requestSerialize: raw,
    requestDeserialize: raw,
    responseSerialize: raw,
    responseDeserialize: raw,
  },
};

const server = new grpc.Server({ 'grpc.max_concurrent_streams': 100000 });
server.addService(service, {
  Call: (call, callback) => {
    crypto.pbkdf2Sync('x', 'triage', rounds, 32, 'sha256');
    callback(null, Buffer.alloc(0));
  },
});
server.bindAsync('127.0.0.1:' + port, grpc.ServerCredentials.createInsecure(), (err) => {
  if (err) {
    console.error(err);
    process.exit(1);
  }
});
