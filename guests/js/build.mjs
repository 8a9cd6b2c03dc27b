// Builds job.js into a component of the world baton:job/job (node build.mjs OUT.wasm).
import { componentize } from '@bytecodealliance/componentize-js';
import { cp, mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = process.argv[2] ?? join(here, 'job.wasm');
const source = await readFile(join(here, 'job.js'), 'utf8');

// The world to build against: wit/job-js.wit here, with its dependencies beside it: the Baton
// job package of the repository and the WASI packages of the toolchain.
const wit = await mkdtemp(join(tmpdir(), 'baton-job-js-'));
const wasi = join(here, 'node_modules', '@bytecodealliance', 'jco', 'lib', 'wit', 'builtin', '0.2.12');
await cp(join(here, 'wit', 'job-js.wit'), join(wit, 'job-js.wit'));
await cp(join(here, '..', '..', 'wit'), join(wit, 'deps', 'baton-job'), { recursive: true });
for (const pkg of ['wasi-cli', 'wasi-clocks', 'wasi-filesystem', 'wasi-http', 'wasi-io', 'wasi-random', 'wasi-sockets']) {
  await cp(join(wasi, pkg), join(wit, 'deps', pkg), { recursive: true });
}
const { component } = await componentize(source, {
  witPath: wit,
  worldName: 'job-js',
  // Baton offers WASI cli, clocks, random, filesystem, io and outbound HTTP (fetch), and no
  // incoming requests.
  disableFeatures: ['fetch-event'],
});
await rm(wit, { recursive: true, force: true });
// Write next to the target, then rename: a running baton never reads a half-written file.
await writeFile(`${out}.tmp`, component);
await rename(`${out}.tmp`, out);
