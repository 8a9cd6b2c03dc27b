// A Baton job in JavaScript: reads its run info, logs through the host, checks
// signal-aborted() before its side effect, and appends one line to a file in its granted data
// directory (/data) through WASI.
//
// Build it into a component with ./build.sh (componentize-js against wit/baton-job.wit). The
// environment variable JOB_MODE (granted in the job's TOML) picks a behaviour for the tests:
// "spin" works forever without ever asking signal-aborted(), so only the host can stop it.
// JOB_URL, if granted, is fetched with fetch() (the job file must allow its host).
import { info, signalAborted, log } from 'baton:job/host@0.2.0';
import { getEnvironment } from 'wasi:cli/environment@0.2.12';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

export async function run() {
  const i = info();
  log('info', `hello from javascript: job ${i.job} slot ${i.slot} attempt ${i.attempt}`);
  const mode = getEnvironment().find(([key]) => key === 'JOB_MODE');
  if (mode && mode[1] === 'spin') {
    let n = 0;
    for (;;) {
      n += 1; // never asks: the host must interrupt it
    }
  }
  if (signalAborted()) {
    throw 'aborted before the side effect';
  }
  const url = getEnvironment().find(([key]) => key === 'JOB_URL');
  if (url) {
    const response = await fetch(url[1]);
    log('info', `fetched ${url[1]}: ${response.status} ${(await response.text()).length} bytes`);
  }
  const data = getDirectories().find(([, path]) => path === '/data');
  if (data) {
    const line = `javascript slot=${i.slot} attempt=${i.attempt} fence=${i.fence} runner=${i.runner}\n`;
    const file = data[0].openAt({}, `${i.job}.log`, { create: true }, { write: true });
    const size = file.stat().size;
    file.write(new TextEncoder().encode(line), size);
  }
}
