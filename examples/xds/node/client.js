// The xDS example's Node client: @grpc/grpc-js with @grpc/grpc-js-xds resolves
// xds:///grpc.greeter.demo through Beacon (no Beacon library) and calls the
// greeter example's SayHello in a loop. The bootstrap file named by
// GRPC_XDS_BOOTSTRAP points it at Beacon (beacon xds bootstrap writes one);
// see docs/xds.md.
//
//   beacon serve &
//   go run ./examples/greeter/server --addr 127.0.0.1:50051 --name one &
//   beacon xds bootstrap > xds-bootstrap.json
//   npm ci --prefix examples/xds/node
//   GRPC_XDS_BOOTSTRAP=$PWD/xds-bootstrap.json node examples/xds/node/client.js
//
// Options: --target xds:///..., --count N (0: until Ctrl-C), --interval MS.
'use strict';

const grpc = require('@grpc/grpc-js');
require('@grpc/grpc-js-xds').register();

function option(name, def) {
  const i = process.argv.indexOf('--' + name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def;
}

const target = option('target', 'xds:///grpc.greeter.demo');
const count = Number(option('count', '0'));
const interval = Number(option('interval', '500'));
// The greeter speaks JSON, so no generated stubs are needed.
const client = new grpc.Client(target, grpc.credentials.createInsecure());
const encode = (m) => Buffer.from(JSON.stringify(m));
const decode = (b) => JSON.parse(b.toString());

let calls = 0;
function call() {
  calls++;
  client.makeUnaryRequest('/greeter.Greeter/SayHello', encode, decode, { name: 'xds-node' },
    new grpc.Metadata({ waitForReady: true }), { deadline: Date.now() + 10000 }, (err, reply) => {
      if (err) {
        console.log('error: ' + grpc.status[err.code] + ' ' + err.details);
      } else {
        console.log('reply from ' + reply.server + ': ' + reply.message);
      }
      if (count === 0 || calls < count) {
        setTimeout(call, interval);
      } else {
        // The xDS client keeps its stream to Beacon open: done, exit.
        client.close();
        process.exit(0);
      }
    });
}
call();
