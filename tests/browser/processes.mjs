// Child processes for the browser test: each one's stdout and stderr go to
// ARTIFACT_DIR/<name>.log, and a test can wait for a line in that output.
// Every child started here is SIGKILLed by killAll(), which is synchronous so
// that it also works from process.on('exit').
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

const MAX_KEPT = 1 << 20;  // output kept in memory for waitForLine, per child

export class Processes {
  constructor(artifactDir) {
    this.artifactDir = artifactDir;
    this.children = [];
  }

  // Starts `bin args` as `name`; returns the child (a ChildProcess with
  // .name, .logPath, .output, .exited = {code, signal} once it has ended).
  start(name, bin, args) {
    const logPath = path.join(this.artifactDir, `${name}.log`);
    const log = fs.openSync(logPath, 'w');
    let open = true;
    const write = (data) => { if (open) fs.writeSync(log, data); };
    write(`$ ${[bin, ...args].join(' ')}\n`);
    const child = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    Object.assign(child, { name, logPath, output: '', exited: null, waiters: new Set() });
    const onData = (chunk) => {
      write(chunk);
      child.output = (child.output + chunk.toString()).slice(-MAX_KEPT);
      for (const w of child.waiters) w();
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    const onEnd = (code, signal, error) => {
      if (child.exited) return;
      child.exited = { code, signal, error };
      write(`\n[${error ? `failed to start: ${error.message}` : `exited: code ${code}, signal ${signal}`}]\n`);
      for (const w of child.waiters) w();
    };
    child.on('exit', (code, signal) => onEnd(code, signal));
    child.on('error', (e) => onEnd(null, null, e));
    child.on('close', () => { open = false; fs.closeSync(log); });
    this.children.push(child);
    return child;
  }

  // Resolves with the regex match of the first output line matching `re`;
  // rejects when the child ends first or after timeoutMs.
  waitForLine(child, re, timeoutMs) {
    return new Promise((resolve, reject) => {
      const done = (fn, arg) => {
        clearTimeout(timer);
        child.waiters.delete(check);
        fn(arg);
      };
      const check = () => {
        for (const line of child.output.split('\n')) {
          const m = line.match(re);
          if (m) return done(resolve, m);
        }
        if (child.exited) {
          done(reject, new Error(`${child.name} ended (${describeExit(child.exited)}) before printing ${re}; ` +
                                 `see ${child.logPath}\n${tail(child)}`));
        }
      };
      const timer = setTimeout(() => done(reject, new Error(
        `${child.name} did not print ${re} within ${timeoutMs / 1000} s; see ${child.logPath}\n${tail(child)}`)), timeoutMs);
      child.waiters.add(check);
      check();
    });
  }

  // SIGKILLs one child and resolves when it has ended.
  kill(child) {
    if (child.exited) return Promise.resolve();
    return new Promise((resolve) => {
      child.once('exit', () => resolve());
      try { child.kill('SIGKILL'); } catch { resolve(); }
    });
  }

  // SIGKILLs every child still running; synchronous.
  killAll() {
    for (const c of this.children) {
      if (!c.exited && c.pid) {
        try { process.kill(c.pid, 'SIGKILL'); } catch { /* already gone */ }
      }
    }
  }

  // A note on the children that ended on their own (not killed by us), with
  // the end of their logs: the usual cause of a failed check. Children that
  // `alreadyTold` (an error message) names by log path are left out.
  unexpectedExits(killed, alreadyTold = '') {
    return this.children
      .filter((c) => c.exited && !killed.has(c) && !alreadyTold.includes(c.logPath))
      .map((c) => `${c.name} ended (${describeExit(c.exited)}); see ${c.logPath}\n${tail(c)}`)
      .join('\n');
  }
}

function describeExit(e) {
  if (e.error) return `failed to start: ${e.error.message}`;
  return e.signal ? `signal ${e.signal}` : `exit code ${e.code}`;
}

function tail(child, lines = 8) {
  const last = child.output.trimEnd().split('\n').slice(-lines);
  return last.map((l) => `    | ${l}`).join('\n');
}
