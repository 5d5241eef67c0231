// End-to-end test of the live dashboard in a real browser.
//
// Starts a real cluster (2 shards, 3 workers, the third one slowed down),
// opens shard 0's dashboard in headless Chromium and checks what it shows
// while a worker and then shard 0 are SIGKILLed. See dashboard.mjs for the
// checks. Exit code 0: pass; 1: fail, with a message naming the check.
//
//   TETHER_SERVER_BIN=build/release/tether-server \
//   TETHER_WORKER_BIN=build/release/tether-worker \
//   ARTIFACT_DIR=/tmp/dashboard-artifacts node tests/browser/dashboard.test.mjs
//
// ARTIFACT_DIR receives dashboard.png and one log per process.
//
// DASHBOARD_TLS=1: the same run with TLS everywhere (--tls-cert, --tls-key,
// --tls-ca on every process, certificates from tests/support/make_certs.sh
// in ARTIFACT_DIR/certs), so the page is served over HTTPS and its live
// data comes over WSS; dashboard.mjs then also checks that.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { runDashboardTest } from './dashboard.mjs';

const STARTUP_MS = 20000;
const TLS = process.env.DASHBOARD_TLS === '1';
const MAKE_CERTS = fileURLToPath(new URL('../support/make_certs.sh', import.meta.url));

// The TLS flags every process of the run gets; none without DASHBOARD_TLS.
function tlsFlags(artifactDir) {
  if (!TLS) return [];
  const dir = path.join(artifactDir, 'certs');
  execFileSync('bash', [MAKE_CERTS, dir], { stdio: ['ignore', 'ignore', 'pipe'] });
  return ['--tls-cert', path.join(dir, 'node.pem'), '--tls-key', path.join(dir, 'node.key'),
          '--tls-ca', path.join(dir, 'ca.pem')];
}

async function startCluster(procs, note) {
  const server = process.env.TETHER_SERVER_BIN;
  const worker = process.env.TETHER_WORKER_BIN;
  if (!server || !worker) {
    throw new Error('set TETHER_SERVER_BIN and TETHER_WORKER_BIN to the tether-server and tether-worker binaries');
  }
  const killed = new Set();
  // The server writes a fresh token here (a file left from a past run is read).
  const tokenFile = path.join(procs.artifactDir, 'dashboard.token');
  fs.rmSync(tokenFile, { force: true });
  const tls = tlsFlags(procs.artifactDir);

  const shard0 = procs.start('shard0', server, [
    '--shard-id', '0', '--shards', '2', '--listen', '127.0.0.1:0', '--workers', '3',
    '--max-staleness', '3', '--optimizer', 'adam', '--lr', '0.001',
    '--http', '127.0.0.1:0', '--dashboard-interval-ms', '200',
    '--http-token-file', tokenFile, ...tls,
  ]);
  const [listen, dashboard] = await Promise.all([
    procs.waitForLine(shard0, /listening on (\S+:\d+)/, STARTUP_MS),
    procs.waitForLine(shard0, TLS ? /dashboard at (https:\/\/\S+)/ : /dashboard at (http:\/\/\S+)/, STARTUP_MS),
  ]);
  const coordinator = listen[1];
  const url = dashboard[1].endsWith('/') ? dashboard[1] : `${dashboard[1]}/`;
  note(`shard 0 listening on ${coordinator}, dashboard at ${url}`);

  const shard1 = procs.start('shard1', server, [
    '--shard-id', '1', '--shards', '2', '--listen', '127.0.0.1:0', '--coordinator', coordinator, ...tls,
  ]);
  await procs.waitForLine(shard1, /listening on (\S+:\d+)/, STARTUP_MS);

  const workerArgs = ['--coordinator', coordinator, '--staleness', '3', '--model', 'mlp',
                      '--epochs', '20', '--quiet', '--eval-every', '50', ...tls];
  const workers = [
    procs.start('worker1', worker, workerArgs),
    procs.start('worker2', worker, workerArgs),
    procs.start('worker3', worker, [...workerArgs, '--slowdown', '3']),
  ];
  note('shard 1 and 3 workers started');

  return {
    url,
    tls: TLS,
    killed,
    tokenFile,
    // Which rank a process gets is up to the coordinator; the check looks for
    // the one row that turns dead. Kill a full-speed worker.
    async killOneWorker() {
      killed.add(workers[1]);
      await procs.kill(workers[1]);
      note(`SIGKILLed ${workers[1].name} (pid ${workers[1].pid})`);
    },
    async killCoordinator() {
      killed.add(shard0);
      await procs.kill(shard0);
      note(`SIGKILLed shard 0 (pid ${shard0.pid})`);
    },
  };
}

runDashboardTest({ name: TLS ? 'dashboard.test (HTTPS)' : 'dashboard.test', startCluster });
