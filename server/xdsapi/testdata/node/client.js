// A proxyless gRPC client in Node (@grpc/grpc-js with @grpc/grpc-js-xds),
// driven by the Go tests of server/xdsapi over stdin and stdout.
//
//   node client.js TARGET        (GRPC_XDS_BOOTSTRAP names the bootstrap)
//
// Each line "call MS" makes one grpc.health.v1.Health/Check call on TARGET
// with a deadline of MS milliseconds and prints one line: "ok BACKEND" (the
// x-beacon-backend header of the server that answered) or "err CODE
// DETAILS". The client exits when stdin closes.
'use strict';

const grpc = require('@grpc/grpc-js');
const xds = require('@grpc/grpc-js-xds');
const readline = require('readline');

xds.register();
const target = process.argv[2];
const client = new grpc.Client(target, grpc.credentials.createInsecure());
const identity = (b) => b;
const lines = readline.createInterface({ input: process.stdin });
const queue = [];
let busy = false;

function next() {
  if (busy || queue.length === 0) return;
  busy = true;
  const ms = Number(queue.shift()) || 5000;
  let backend = '';
  const call = client.makeUnaryRequest('/grpc.health.v1.Health/Check', identity, identity,
    Buffer.alloc(0), new grpc.Metadata(), { deadline: Date.now() + ms }, (err) => {
      if (err) {
        console.log('err ' + grpc.status[err.code] + ' ' + String(err.details).replace(/\n/g, ' '));
      } else {
        console.log('ok ' + backend);
      }
      busy = false;
      next();
    });
  call.on('metadata', (md) => {
    const v = md.get('x-beacon-backend');
    if (v.length > 0) backend = String(v[0]);
  });
}

lines.on('line', (line) => {
  const [cmd, arg] = line.trim().split(/\s+/);
  if (cmd === 'call') {
    queue.push(arg);
    next();
  }
});
lines.on('close', () => { client.close(); process.exit(0); });
