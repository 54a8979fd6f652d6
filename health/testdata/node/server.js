// A grpc.health.v1 server in Node: @grpc/grpc-js with the HealthImplementation
// of npm grpc-health-check, driven by the Go tests of health/ over stdin and
// stdout.
//
//   node server.js
//
// It serves on a loopback port and prints "port N" first. The overall
// service ("") starts SERVING; no other service is known until set. Each
// stdin line "set STATUS [SERVICE]" (STATUS a ServingStatus name, SERVICE
// absent for the overall service) sets a status, as the application would
// with setStatus (a Watch is pushed every set, a repeated one too), and is
// answered "set STATUS SERVICE" once done. Each Check and each Watch call
// prints "check SERVICE" or "watch SERVICE" when it arrives. The server exits
// when stdin closes.
'use strict';

const grpc = require('@grpc/grpc-js');
const { HealthImplementation } = require('grpc-health-check');
const readline = require('readline');

const health = new HealthImplementation({ '': 'SERVING' });
const server = new grpc.Server();

// logged wraps the server so that each health call prints a line before
// grpc-health-check's own handler answers it.
const logged = {
  addService(service, impl) {
    server.addService(service, {
      ...impl,
      check(call, callback) { console.log('check ' + call.request.service); impl.check(call, callback); },
      watch(call) { console.log('watch ' + call.request.service); impl.watch(call); },
    });
  },
};
health.addToServer(logged);

server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, port) => {
  if (err) {
    console.error(err);
    process.exit(1);
  }
  console.log('port ' + port);
  const lines = readline.createInterface({ input: process.stdin });
  lines.on('line', (line) => {
    const [cmd, status, service = ''] = line.trim().split(/\s+/);
    if (cmd === 'set' && status) {
      health.setStatus(service, status);
      console.log('set ' + status + ' ' + service);
    }
  });
  lines.on('close', () => { server.forceShutdown(); process.exit(0); });
});
