// A proxyless gRPC client in Node (@grpc/grpc-js with @grpc/grpc-js-xds),
// driven by the Go tests of server/xdsapi over stdin and stdout.
//
//   node client.js TARGET...     (GRPC_XDS_BOOTSTRAP names the bootstrap)
//
// Each line "call MS [I]" makes one grpc.health.v1.Health/Check call on the
// I-th TARGET (0 when absent; one channel per target, all on this process's
// one xDS client) with a deadline of MS milliseconds and prints one line:
// "ok BACKEND" (the x-beacon-backend header of the server that answered) or
// "err CODE DETAILS". The client exits when stdin closes.
'use strict';

const grpc = require('@grpc/grpc-js');
const xds = require('@grpc/grpc-js-xds');
const readline = require('readline');

xds.register();
const clients = process.argv.slice(2).map((t) => new grpc.Client(t, grpc.credentials.createInsecure()));
const identity = (b) => b;
const lines = readline.createInterface({ input: process.stdin });
const queue = [];
let busy = false;

function next() {
  if (busy || queue.length === 0) return;
  busy = true;
  const [arg, index] = queue.shift();
  const ms = Number(arg) || 5000;
  let backend = '';
  const call = clients[Number(index) || 0].makeUnaryRequest('/grpc.health.v1.Health/Check', identity, identity,
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
  const [cmd, arg, index] = line.trim().split(/\s+/);
  if (cmd === 'call') {
    queue.push([arg, index]);
    next();
  }
});
lines.on('close', () => { clients.forEach((c) => c.close()); process.exit(0); });
